"""tune.scheduler=pbt: Ray Tune's Population Based Training over raydra trials.

Under Ray Train V2 a trial's checkpoints are Ray Train's, which Tune never sees (TuneReportCallback
hands Tune metrics and a checkpoint's path); PBT copies a trial only through a Tune checkpoint. So a
PBT trial reports each checkpointed epoch itself, through `TuneRelay`, with Ray Train's checkpoint as
a Tune checkpoint that names its trial, epoch and values (its metadata). Tune copies it into the
trial's share of tune/, where PBT can hand it to a poor trial:

    the poor trial starts again (a new process) with the perturbed config, and tune.get_checkpoint()
    names the copied trial's checkpoint (`copied_from`); it drops its own Ray Train run, so that
    Ray Train has no checkpoint of it to hand back, and its workers start from the copied checkpoint
    (Place.restore): weights, optimizer, scheduler and position. raydra.worker.mutated then puts the
    perturbed values into the optimizer, the scheduler and hparams, which the restore overwrote.

The sweep's driver learns of each copy as the trial starts again (`exploit`), and records it in
sweep.json's lineage.
"""

import asyncio
import threading
from typing import Any, Dict, List, Optional, Tuple

import ray
import ray.tune
from omegaconf import DictConfig

from raydra import storage
from raydra.records.envelope import now
from raydra.records.sweep import Exploit
from raydra.sweep.space import domain

# Tune's time for PBT (and ASHA): epochs trained, which a restarted trial continues counting.
TIME_ATTR = "epochs_done"


def scheduler(cfg: DictConfig, mutations: Dict[str, Tuple[str, List[Any]]]) -> Any:
    from ray.tune.schedulers import PopulationBasedTraining

    pbt = cfg.tune.pbt
    return PopulationBasedTraining(
        time_attr=TIME_ATTR,
        perturbation_interval=pbt.perturbation_interval,
        hyperparam_mutations={key: mutation(key, name, args) for key, (name, args) in mutations.items()},
        quantile_fraction=pbt.quantile_fraction,
        resample_probability=pbt.resample_probability,
        synch=pbt.synch,
        # Its pbt_global.txt names trials by tag and counts Tune's iterations; sweep.json's lineage says it in epochs.
        log_config=False,
    )


def mutation(key: str, name: str, args: List[Any]) -> Any:
    """What PBT perturbs a key within: a choice or grid as its list (PBT steps to a neighbouring
    value), any other distribution as its Tune domain (PBT multiplies by 0.8 or 1.2, or samples)."""
    if name in ("choice", "grid"):
        return list(args)
    return domain(key, name, args)


# -- the trial's side ------------------------------------------------------------------------------


@ray.remote(num_cpus=0)
class Handover:
    """One report at a time from Ray Train's controller (`hand`) to a PBT trial's TuneRelay (`take`),
    `hand` returning once the relay has reported it (`reported`). An actor of the trial's: it ends
    with the trial's process."""

    def __init__(self) -> None:
        self.reports: asyncio.Queue = asyncio.Queue(maxsize=1)
        self.done: asyncio.Queue = asyncio.Queue(maxsize=1)

    async def hand(self, item: Any) -> None:
        await self.reports.put(item)
        await self.done.get()

    async def take(self) -> Any:
        return await self.reports.get()

    async def reported(self) -> None:
        await self.done.put(True)


class TuneRelay:
    """Reports a PBT trial's checkpointed epochs to Tune from a thread of the trial's process.

    Ray Train's controller (the trial's TorchTrainer, another process) hands each epoch's metrics and
    checkpoint over (raydra.sweep.trial.CheckpointsToTune) and waits until it is reported: the
    checkpoint is Ray Train's, which it may delete once it has a newer one, and Tune copies it only as
    it is reported. ray.tune.report returns once Tune has decided what the trial does next, so
    training goes on only after PBT's decision (continue, pause, or copy another trial)."""

    def __init__(self, trial_id: str, values: Dict[str, Any]) -> None:
        self.trial_id, self.values = trial_id, dict(values)
        self.handover: Any = Handover.remote()
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._relay, name="raydra-tune-relay", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        while True:
            item = ray.get(self.handover.take.remote())
            if item is None:
                ray.get(self.handover.reported.remote())
                return
            metrics, checkpoint = item
            try:
                if self.error is None:
                    ray.tune.report(metrics, checkpoint=tune_checkpoint(checkpoint, self.trial_id, metrics, self.values))
            except Exception as error:  # said after the fit (close); the controller must not wait on it meanwhile
                self.error = error
            finally:
                # Also when Tune stops the trial (SystemExit here): its processes end with it.
                ray.get(self.handover.reported.remote())

    def close(self) -> None:
        """After the fit: every report made; raises what a report raised."""
        ray.get(self.handover.hand.remote(None))
        self._thread.join()
        if self.error is not None:
            raise self.error


def tune_checkpoint(checkpoint: Any, trial_id: str, metrics: Dict[str, Any], values: Dict[str, Any]) -> Any:
    """Ray Train's checkpoint as a Tune checkpoint, naming the trial it is of, where it stands and
    the values it was trained with (what a trial that copies it records in the lineage)."""
    reported = ray.tune.Checkpoint(path=checkpoint.path, filesystem=checkpoint.filesystem)
    reported.set_metadata({"trial": trial_id, TIME_ATTR: metrics.get(TIME_ATTR), "step": metrics.get("step"), "values": values})
    return reported


def copied_from(checkpoint: Any, trial_id: str) -> Optional[Dict[str, Any]]:
    """What the Tune checkpoint a trial starts from says of itself, when it is another trial's (PBT
    copied that trial into this one); None for the trial's own checkpoint or none, where Ray Train
    continues the trial's own run from its latest checkpoint."""
    if checkpoint is None:
        return None
    meta = checkpoint.get_metadata()
    return meta if meta.get("trial") not in (None, trial_id) else None


def checkpoint_file(sweep_location: str, checkpoint: Any, name: str) -> str:
    """The Lightning file `name` inside a Tune checkpoint of the sweep stored at `sweep_location` (a
    path, or the URI of its storage), as a location a worker can fetch."""
    return storage.join(storage.location_of(sweep_location, checkpoint.path), name)


def forget_train_run(location: str) -> None:
    """Remove a trial's Ray Train run (its checkpoints and Ray Train's record of them) at `location`:
    a run whose name and storage Ray Train has seen continues from its own checkpoint, which a trial
    that copied another must not."""
    fs, path = storage.filesystem(location)
    import pyarrow.fs as pafs

    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)


# -- the driver's side -----------------------------------------------------------------------------


def exploit(trial: Any, keys: List[str]) -> Optional[Exploit]:
    """The copy a trial Tune is starting carries out, if it starts from another trial's checkpoint:
    which trial, at what epoch and step, with which of its values, and the trial's perturbed ones."""
    copied = copied_from(trial.checkpoint, trial.trial_id)
    if copied is None:
        return None
    return Exploit(
        trial=trial.trial_id,
        copied=copied["trial"],
        epoch=copied.get(TIME_ATTR),
        step=copied.get("step"),
        copied_values={key: copied.get("values", {}).get(key) for key in keys},
        values={key: trial.config.get(key) for key in keys},
        at=now(),
    )


def same(a: Exploit, b: Exploit) -> bool:
    """The same copy: a resumed sweep restarts a trial from the checkpoint it copied, not a second copy."""
    return (a.trial, a.copied, a.epoch) == (b.trial, b.copied, b.epoch)
