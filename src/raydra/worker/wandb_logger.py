"""Rank 0's W&B logger: Lightning's WandbLogger writing one segment of the run's W&B run
(raydra.records.wandb_run), so that the run's W&B history holds each step of metrics.csv once however often
its worker group starts.

As the segment starts it logs the rows of metrics.csv that no earlier segment holds (what a killed
attempt had logged but not flushed, up to the checkpoint this attempt restarts from); from then on
it logs each (step, metric) that no segment holds yet, continuing W&B's `_step` where the earlier
segments stopped. The summary carries the monitored metric's best beside W&B's last value of it.
With logger.wandb.log_model=all each checkpoint becomes a version of the run's model artifact as it
is saved (log_model=true: the best and last once the run ends, raydra.records.wandb_run.complete).
"""

import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from raydra.lightning import pl
from raydra.records import wandb_run
from raydra.records.wandb_run import EPOCH, Held, Row, RunSettings


def segment_logger(settings: RunSettings, run_id: str, run_dir: Path) -> "SegmentLogger":
    """Start this attempt's segment of the run's W&B run in `run_dir`, caught up with metrics.csv."""
    settings.save(run_dir)
    held = wandb_run.held(run_dir)
    logger = SegmentLogger(settings, held, wandb_run.started(settings, run_id, run_dir, held, config=False), run_dir)
    kept = wandb_run.rows(run_dir)
    logger.catch_up(kept, wandb_run.missing(kept, held, settings))
    return logger


class SegmentLogger(pl.loggers.WandbLogger):
    """WandbLogger around a W&B run raydra started (`experiment=`, a public argument), logging only
    what the run's W&B segments do not hold (see the module's docstring)."""

    def __init__(self, settings: RunSettings, held: Held, run: Any, run_dir: Path) -> None:
        super().__init__(experiment=run, prefix=settings.prefix, project=settings.init.get("project"), id=run.id, save_dir=str(run_dir))
        self.settings = settings
        self._logged = set(held.logged)
        self._next_step = held.last_step + 1
        self._best: Optional[float] = None

    def catch_up(self, kept: List[Row], missing: List[Row]) -> None:
        """Log the rows of metrics.csv (`kept`: as this attempt found it) no segment holds, and the
        best so far in it, which a later value must beat to be the best."""
        best = wandb_run.best(kept, self.settings)
        if best:
            self._best = best[f"{wandb_run.BEST_PREFIX}{self.settings.monitor}"]
            self.experiment.summary.update(best)
        for row in missing:
            self._log(row)

    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        if step is None:
            # Lightning always gives the step; a call without one is W&B's own row.
            super().log_metrics(metrics, step)
            return
        self._log(Row(step=step, values=dict(metrics)))

    def _log(self, row: Row) -> None:
        # The best counts every value as metrics.csv holds it, a step trained again among them.
        self._note_best(row.step, row.values)
        new = {k: v for k, v in row.values.items() if k != EPOCH and (row.step, self.settings.key(k)) not in self._logged}
        if not new:
            return
        if EPOCH in row.values:
            new[EPOCH] = row.values[EPOCH]
        wandb_run.log_row(self.experiment, Row(step=row.step, values=new), self.settings, self._next_step)
        self._next_step += 1
        self._logged.update((row.step, self.settings.key(k)) for k in new if k != EPOCH)

    def _note_best(self, step: int, values: Dict[str, Any]) -> None:
        """The monitored metric's best so far into the summary, as it comes: a run killed later keeps it."""
        monitor = self.settings.monitor
        value = values.get(monitor) if monitor else None
        if not isinstance(value, (int, float)) or math.isnan(value):
            return
        better = self._best is None or (value > self._best if self.settings.monitor_mode == "max" else value < self._best)
        if better:
            self._best = value
            self.experiment.summary.update(wandb_run.best_summary(monitor, value, step, values.get(EPOCH)))

    def checkpoint_saved(self, path: Path, metrics: Dict[str, Any]) -> None:
        """TimedReport's note of a checkpoint it saved (rank 0, before handing it to Ray): with
        log_model=all, a version of the run's model artifact, `best` too while it is the best."""
        if self.settings.log_model != "all":
            return
        monitor = self.settings.monitor
        aliases = ["latest"]
        if not metrics.get("mid_epoch") and monitor and metrics.get(monitor) == self._best:
            aliases.append("best")
        metadata = {
            "score": metrics.get(monitor) if not metrics.get("mid_epoch") else None,
            "step": metrics.get("step"),
            "epoch": metrics.get("epoch"),
        }
        wandb_run.log_checkpoint(self.experiment, path, self.settings, aliases, metadata)

    def end(self, exit_code: int, status: str) -> None:
        """Finish this segment: the run's status in the summary, and the exit code W&B shows."""
        self.experiment.summary[wandb_run.STATUS_KEY] = str(status)
        wandb_run.finish(self.experiment, exit_code)
