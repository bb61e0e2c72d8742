"""One trial of a sweep: Tune's function trainable, walking a single run's stages (raydra.run.sequence)
inside a Lifecycle of its own. What only a trial does is here: its config from the sweep's and its
sampled values, its scratch place with storage, Tune's report callback, and leaving a trial Tune
stopped to the sweep's driver."""

import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import ray
import ray.tune
import yaml
from omegaconf import DictConfig, OmegaConf
from ray.train.v2.api.callback import UserCallback
from ray.tune.integration.ray_train import TuneReportCallback

from raydra import storage
from raydra.config.schema import STRATEGY_SCHEMAS, RaydraConfig
from raydra.config.spec import Place
from raydra.private_apis.ray_tune import tune_stop_probe
from raydra.records import layout, summary, trust
from raydra.records.envelope import Status
from raydra.records.layout import CHECKPOINT_FILE
from raydra.records.summary import Trial
from raydra.redact import redact_yaml_files
from raydra.run.lifecycle import FAILED, Ending, Lifecycle
from raydra.run.prepare import Invocation
from raydra.run.sequence import RunSequence
from raydra.sweep import pbt
from raydra.sweep.space import plain

# The `callbacks` entry a PBT trial adds: its values put back after a restore, on every worker, by
# raydra.worker.mutated's callback, named here and not imported: importing it would import Lightning
# and torch into every trial's own process (~9 s of CPU each, which the workers pay anyway).
PBT_CALLBACK = "pbt_mutated_values"
MUTATED_VALUES_TARGET = "raydra.worker.mutated.MutatedHyperparameters"


def run_trial(sampled: Dict[str, Any], base: Dict[str, Any], sweep: Dict[str, Any]) -> None:
    started = time.time()
    # Held from the start: when Tune stops a trial it sets the session's stop event and drops the
    # session at once, often before this thread sees its fit end.
    stopped_by_tune = tune_stop_probe()
    trial_id = ray.tune.get_context().get_trial_id()
    # Where the trial's record ends on the sweep driver's disk. With paths.storage this process
    # (on any node) writes into a scratch directory and pushes to storage, from where the sweep
    # driver pulls into record_dir: writing record_dir itself would race that pull.
    record_dir = Path(sweep["dir"], layout.TRIALS, trial_id)
    trial_storage = storage.join(sweep["storage"], layout.TRIALS, trial_id) if sweep["storage"] else None
    run_dir = Path(tempfile.gettempdir(), "raydra-trials", sweep["id"], trial_id) if trial_storage else record_dir
    run_id = f"{sweep['id']}_{trial_id}"
    # Where a refusal before the spec exists is recorded.
    place = Place(dir=str(run_dir), id=run_id, storage=trial_storage, logged_config={})
    sampled = {key: plain(value) for key, value in sampled.items()}
    overrides = sweep["overrides"] + [f"{key}={value}" for key, value in sampled.items()]
    previous = summary.read(run_dir) if (run_dir / layout.SUMMARY).is_file() else None

    conf = _typed(base)
    for key, value in sampled.items():
        OmegaConf.update(conf, key, value, merge=False)
    mutated = sweep.get("mutations")
    copied = None
    if mutated:
        # PBT: after any restore the workers put this trial's values back (raydra.worker.mutated).
        values = {key: sampled[key] for key in mutated}
        conf.callbacks = {**(conf.callbacks or {}), PBT_CALLBACK: {"_target_": MUTATED_VALUES_TARGET, "_convert_": "all", "values": values}}
        copied = pbt.copied_from(ray.tune.get_checkpoint(), trial_id)
    (run_dir / layout.HYDRA_DIR).mkdir(parents=True, exist_ok=True)
    (run_dir / layout.CONFIG).write_text(OmegaConf.to_yaml(conf))
    (run_dir / layout.OVERRIDES).write_text(yaml.safe_dump(overrides, sort_keys=False))
    redact_yaml_files(run_dir / layout.HYDRA_DIR)
    trust.mark_run(run_dir)  # the sweep's own trial: `raydra rerun` of it needs no --trusted
    run = RunSequence(conf, record_dir, run_id, overrides, started, place, trial=Trial(sweep=sweep["id"], id=trial_id, sampled=sampled))
    if previous:
        # A resumed sweep runs an unfinished trial again under the same run id: Train V2 continues
        # it from its last checkpoint.
        run.record = run.record.resumed_from(previous, run_dir=str(record_dir))

    def settle(ending: Ending) -> None:
        # A trial the scheduler ended is recorded by the sweep's driver, from Tune's results; so is
        # one interrupted with its sweep (raydra.sweep.report).
        if ending.status == FAILED and not (stopped_by_tune() or _settled(run_dir)):
            run.failed(ending.error)

    # Tune's process: no Ray to connect to and no stop signals to take (Tune stops a trial itself).
    with Lifecycle(settle, continue_with=lambda: f"tune.resume={sweep['dir']}"):
        # The same checks as every run's (raydra.run.prepare), on the sweep's config with this trial's samples.
        prepared = run.prepare(Invocation(overrides=tuple(overrides), trial=True))
        spec = run.start(prepared, kind="trial", label=",".join(f"{k}={v}" for k, v in sampled.items()), at=place)
        relay = pbt.TuneRelay(trial_id, {key: sampled[key] for key in mutated}) if mutated else None
        if copied:
            # PBT copied another trial into this one: its workers start from that trial's checkpoint,
            # and Ray Train from no run of this trial's own.
            pbt.forget_train_run(storage.join(layout.checkpoints_location(spec.place), run_id))
            spec = spec.with_place(
                restore=pbt.checkpoint_file(sweep["storage"] or sweep["dir"], ray.tune.get_checkpoint(), CHECKPOINT_FILE)
            )
        report = CheckpointsToTune(spec.trainer.max_epochs, relay) if relay else ReportToTune(spec.trainer.max_epochs)
        # Its start-up and compute ledger count from here: the trial's own process was Tune's before.
        run.fit(spec, tune_trial=True, callbacks=[report], marks={"run_began": started})
        if relay:
            relay.close()
    # The last epoch reaches Tune only now, with the test metrics, once summary.json is complete
    # (see ReportToTune).
    final = dict(run.record.metrics.final)
    final["epochs_done"] = run.record.epochs_completed
    if mutated:
        # The trial is done: PBT (which sees every result but this one) must not copy another into it now.
        final["done"] = True
    ray.tune.report(final)


def _typed(base: Dict[str, Any]) -> DictConfig:
    """The trial's config typed as Hydra composed the sweep's, from the plain data Tune carried: the
    root schema, and the strategy's option schema by its name (a trial runs no sweep: tune is null)."""
    conf = OmegaConf.structured(RaydraConfig)
    conf.strategy = OmegaConf.structured(STRATEGY_SCHEMAS[base["strategy"]["name"]])
    return OmegaConf.merge(conf, base)


def _settled(run_dir: Path) -> bool:
    """Whether the sweep driver already recorded this trial as stopped: its record is final."""
    run = summary.try_read(run_dir)
    return run is not None and run.status == Status.STOPPED


def epoch_result(metrics: List[Dict[str, Any]], max_epochs: int) -> Optional[Dict[str, Any]]:
    """What of a Ray Train report reaches Tune: rank 0's metrics of an epoch that is not the last,
    with `epochs_done`; None for the rest. A scheduler stops a trial the moment it reports its last
    epoch (ASHA's max_t), which would cut off the trial's test and its summary.json; the trial
    reports that epoch itself after writing them. Mid-epoch checkpoints (checkpoint.every_n_steps)
    are no epoch for a scheduler to count."""
    if not metrics or metrics[0].get("mid_epoch") or metrics[0].get("epoch", -1) + 1 >= max_epochs:
        return None
    # Schedulers count epochs_done, not Tune's training_iteration, which starts again at 1 when a
    # resumed sweep restarts a trial that Train V2 continues from a later epoch.
    return dict(metrics[0], epochs_done=metrics[0]["epoch"] + 1)


class ReportToTune(TuneReportCallback):
    """TuneReportCallback for every epoch but the last (epoch_result)."""

    def __init__(self, max_epochs: int) -> None:
        super().__init__()
        self.max_epochs = max_epochs

    def after_report(self, run_context: Any, metrics: List[Dict[str, Any]], checkpoint: Any) -> None:
        result = epoch_result(metrics, self.max_epochs)
        if result is not None:
            super().after_report(run_context, [result, *metrics[1:]], checkpoint)


class CheckpointsToTune(UserCallback):
    """tune.scheduler=pbt's report: every epoch but the last that carries a checkpoint reaches Tune
    with it, through the trial's TuneRelay (raydra.sweep.pbt), as a checkpoint PBT can copy. An epoch
    without one is not reported: PBT acts at a report, and can only copy a trial at a checkpoint.
    Runs in Ray Train's controller, and waits there until Tune has the checkpoint."""

    def __init__(self, max_epochs: int, relay: pbt.TuneRelay) -> None:
        self.max_epochs, self.handover = max_epochs, relay.handover

    def after_report(self, run_context: Any, metrics: List[Dict[str, Any]], checkpoint: Any) -> None:
        result = epoch_result(metrics, self.max_epochs)
        if result is not None and checkpoint is not None:
            ray.get(self.handover.hand.remote((result, checkpoint)))
