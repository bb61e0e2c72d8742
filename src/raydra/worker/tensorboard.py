"""TensorBoard's record of a run as its reader expects it: one directory for the run however often
it restarts, each step once, and an HPARAMS view that compares runs.

Lightning's TensorBoardLogger starts the next free `version_N` directory each time it is built, so a
restarted worker group or a resume= split one run over two directories, each with the steps the
first attempt logged after its checkpoint. raydra names the directory after the run id instead, and
opens it with torch's `purge_step` at the restored checkpoint's step: TensorBoard's reader
(EventAccumulator, and TensorBoard itself) drops what an earlier attempt logged at or after it, so
the steps trained again appear once. A run from its first step (a new run, or a restart before any
checkpoint) purges from step 0. A run directory of its own avoids mixing runs in a `save_dir` that
several runs share, which a fixed `version_0` would: each new run's purge would hide the last one's.

`hp_metric`, which TensorBoard's HPARAMS view puts beside each run's hyperparameters, is the
monitored metric's best so far (checkpoint.monitor and checkpoint.mode, what the run's checkpoints are
ranked by), logged at each epoch's end, rather than Lightning's placeholder -1.
"""

import math
from typing import Any, Dict, Mapping, Optional

from raydra.lightning import pl
from raydra.private_apis.lightning import epoch_end_logging_step, tensorboard_default_hp_metric

HP_METRIC = "hp_metric"


def arguments(node: Mapping[str, Any], run_id: str, resumed_from: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The TensorBoardLogger keyword arguments raydra adds to `logger.<name>`: the run id as its version
    (unless the node names one) and the step from which an earlier attempt's events are purged."""
    extra: Dict[str, Any] = {"purge_step": resumed_from["global_step"] if resumed_from else 0}
    if node.get("version") is None:
        extra["version"] = run_id
    return extra


class ModelGraph(pl.Callback):
    """Each logger's graph of the model (TensorBoard's, with `log_graph: true`), drawn as a fit starts,
    where Lightning draws it in its start-of-fit logging, which the worker's Trainer turns off
    (raydra.worker.loggers says why)."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        for logger in trainer.loggers:
            logger.log_graph(pl_module)


class HpMetric(pl.Callback):
    """Logs `hp_metric` to each TensorBoard logger that keeps Lightning's `default_hp_metric: true`:
    the best `monitor` so far by `mode`, at each epoch's end (at the step the epoch's metrics are logged
    at), once the monitor has a value. The first one comes with the run's hyperparameters, which is when
    the run joins the HPARAMS view (a run that ends before any has no entry there, rather than a -1
    that ranks first by a loss). The best is kept in checkpoints, so a restarted run goes on from it.

    Ahead of the checkpoint report in the callbacks: an epoch's checkpoint holds this epoch's best."""

    def __init__(self, monitor: str, mode: str) -> None:
        self.monitor, self.mode = monitor, mode
        self.best: Optional[float] = None

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        if value is None or math.isnan(value := float(value)):
            return
        first = self.best is None
        if first or (value > self.best if self.mode == "max" else value < self.best):
            self.best = value
        step = epoch_end_logging_step(trainer)
        for logger in trainer.loggers:
            if not (isinstance(logger, pl.loggers.TensorBoardLogger) and tensorboard_default_hp_metric(logger)):
                continue
            if first:
                # The run's config, which build_loggers gave it.
                logger.log_hyperparams(logger.hparams, metrics={HP_METRIC: self.best}, step=step)
            else:
                logger.log_metrics({HP_METRIC: self.best}, step=step)

    def state_dict(self) -> Dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.best = state_dict.get("best")
