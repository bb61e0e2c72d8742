"""One trial of a sweep: Tune's function trainable around the same fit as a single run."""

import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import ray.tune
import yaml
from omegaconf import OmegaConf
from ray.tune.integration.ray_train import TuneReportCallback

from raydra import fit, run_record, storage
from raydra import summary as run_summary
from raydra.errors import RaydraError
from raydra.private_apis import tune_stop_probe, worker_groups_start_within
from raydra.project import check_classes
from raydra.redact import redact_hydra_records
from raydra.schema import validate
from raydra.sweep.space import plain


def run_trial(sampled: Dict[str, Any], base: Dict[str, Any], sweep: Dict[str, Any]) -> None:
    started = time.time()
    # Held from the start: when Tune stops a trial it sets the session's stop event and drops the
    # session at once, often before this thread sees its fit end.
    stopped_by_tune = tune_stop_probe()
    trial_id = ray.tune.get_context().get_trial_id()
    # Where the trial's record ends on the sweep driver's disk. With paths.storage this process
    # (on any node) writes into a scratch directory and pushes to storage, from where the sweep
    # driver pulls into record_dir: writing record_dir itself would race that pull.
    record_dir = Path(sweep["dir"], run_record.TRIALS, trial_id)
    run = {"dir": str(record_dir), "storage": storage.join(sweep["storage"], run_record.TRIALS, trial_id) if sweep["storage"] else None}
    if run["storage"]:
        run["dir"] = str(Path(tempfile.gettempdir(), "raydra-trials", sweep["id"], trial_id))
    run_dir = Path(run["dir"])
    run_id = f"{sweep['id']}_{trial_id}"
    sampled = {key: plain(value) for key, value in sampled.items()}
    overrides = sweep["overrides"] + [f"{key}={value}" for key, value in sampled.items()]
    previous = run_summary.read(run_dir) if (run_dir / run_summary.SUMMARY).is_file() else None

    conf = OmegaConf.create(base)
    for key, value in sampled.items():
        OmegaConf.update(conf, key, value, merge=False)
    (run_dir / run_record.HYDRA_DIR).mkdir(parents=True, exist_ok=True)
    (run_dir / run_record.CONFIG).write_text(OmegaConf.to_yaml(conf))
    (run_dir / run_record.OVERRIDES).write_text(yaml.safe_dump(overrides, sort_keys=False))
    redact_hydra_records(run_dir)
    summary = fit.new_summary(conf, record_dir, run_id, overrides)
    summary["trial"] = {"sweep": sweep["id"], "id": trial_id, "sampled": sampled}
    if previous:
        # A resumed sweep runs an unfinished trial again under the same run id: Train V2 continues
        # it from its last checkpoint.
        summary["started_at"] = previous["started_at"]
        summary["resumed"] = previous.get("resumed", []) + [{"at": run_summary.now(), "from_status": previous.get("status")}]
    # The sweep only starts as many trials as the cluster holds, so a worker group that does not
    # start is slow (a loaded node, a stopped trial's workers still leaving), not starved: Train
    # V2's 60 s default failed trials on a busy 2-CPU machine. Still an error, never a hang.
    worker_groups_start_within(300)
    try:
        validate(conf)
        check_classes(conf)
        config = fit.resolve(conf, record_dir, run_id)
        # Named here, not recomputed from paths.outputs: this process's working directory is Ray's.
        config["run"].update(dir=run["dir"], storage=run["storage"])
        fit.fit_and_record(config, summary, started, tune_trial=True, callbacks=[ReportToTune(config["trainer"]["max_epochs"])])
    except Exception as error:
        if stopped_by_tune() or _settled(run_dir):
            # The scheduler ended this trial; the sweep driver records it from Tune's results.
            raise
        reason = str(error) if isinstance(error, RaydraError) else fit.one_line(error)
        summary.update(status="failed", error=reason, finished_at=run_summary.now(), wall_time_s=round(time.time() - started, 2))
        fit.write_summary(run, summary)
        raise
    # The last epoch reaches Tune only now, with the test metrics, once summary.json is complete
    # (see ReportToTune).
    final = dict(summary["metrics"]["final"])
    final["epochs_done"] = summary.get("epochs_completed")
    ray.tune.report(final)


def _settled(run_dir: Path) -> bool:
    """Whether the sweep driver already recorded this trial as stopped: its record is final."""
    path = run_dir / run_summary.SUMMARY
    return path.is_file() and run_summary.read(run_dir).get("status") == "stopped"


class ReportToTune(TuneReportCallback):
    """TuneReportCallback for every epoch but the last. A scheduler stops a trial the moment it
    reports its last epoch (ASHA's max_t), which would cut off the trial's test and its
    summary.json; the trial reports that epoch itself after writing them."""

    def __init__(self, max_epochs: int) -> None:
        super().__init__()
        self.max_epochs = max_epochs

    def after_report(self, run_context: Any, metrics: List[Dict[str, Any]], checkpoint: Any) -> None:
        # Mid-epoch checkpoints (checkpoint.every_n_steps) are no epoch for ASHA to count.
        if not metrics or metrics[0].get("mid_epoch") or metrics[0].get("epoch", -1) + 1 >= self.max_epochs:
            return
        # ASHA counts epochs_done, not Tune's training_iteration, which starts again at 1 when a
        # resumed sweep restarts a trial that Train V2 continues from a later epoch.
        metrics = [dict(metrics[0], epochs_done=metrics[0]["epoch"] + 1), *metrics[1:]]
        super().after_report(run_context, metrics, checkpoint)
