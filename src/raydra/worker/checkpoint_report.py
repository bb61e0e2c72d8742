"""Checkpoints and metrics handed to Ray Train at the run's checkpoint frequency, timed."""

import contextlib
import math
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import ray.train

from raydra.errors import out_of_space
from raydra.lightning import pl
from raydra.records.layout import CHECKPOINT_FILE

# The monitored metric of a mid-epoch report, by checkpoint.mode: ranks last, and stays a number
# through JSON (see TimedReport).
UNVALIDATED = {"max": -sys.float_info.max, "min": sys.float_info.max}


class TimedReport(pl.Callback):
    """Ray's checkpoint and report, at the run's checkpoint frequency and timed: training stands
    still while a checkpoint is written and handed to Ray, so its cost is part of what a strategy costs.

    Every epoch end reports its metrics (what Tune schedules on and Ray's history records); a
    checkpoint goes with it every `every_n_epochs` epochs, and at the end of training. With
    `every_n_steps`, a checkpoint is saved after every that many optimizer steps instead, inside
    the epoch; such a report carries `mid_epoch=1` and the monitored metric as the worst finite
    value for checkpoint.mode (UNVALIDATED), since validation has not seen those weights, so Ray
    never ranks it best. Not NaN: Ray's checkpoint manager writes its snapshot as JSON, where NaN
    comes back as null, and a run resumed by a new driver (resume=, a requeued SLURM job) then
    failed scoring its next checkpoint against it ("unsupported operand type(s) for *: 'float'
    and 'NoneType'", measured after a SLURM time-limit notice).

    `seconds`: how long training stood still per checkpoint (writing it, and with a waited-for
    upload, the upload too). With `background_upload`, Ray uploads from a thread while training
    goes on (`checkpoint_upload_mode=ASYNC`); `upload_seconds` times each upload either way.
    `after_report` runs after every report (the worker pushes its part of the run record then).
    """

    def __init__(
        self,
        every_n_epochs: Optional[int] = None,
        every_n_steps: Optional[int] = None,
        monitor: Optional[str] = None,
        mode: str = "max",
        background_upload: bool = False,
        after_report: Optional[Callable[[], None]] = None,
        local: Optional["LocalCheckpoints"] = None,
        saving: Optional[Callable[[int], Any]] = None,
    ) -> None:
        self.every_n_epochs = every_n_epochs or 1
        self.every_n_steps = every_n_steps
        self.monitor, self.mode = monitor, mode
        self.background_upload = background_upload
        self.after_report = after_report or (lambda: None)
        # Local mode: Ray Train keeps nothing that is reported; this keeps it instead.
        self.local = local
        # The hang watchdog's mark of a save (raydra.worker.watchdog.Progress.saving): its own deadline.
        self.saving = saving or (lambda step: contextlib.nullcontext())
        self.seconds: List[float] = []
        self.upload_seconds: List[float] = []
        self._flush_next = False
        self.last_saved_step = -1

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        # The row of the step a checkpoint was saved at is logged after the checkpoint.
        if self._flush_next:
            self._flush_next = False
            for logger in trainer.loggers:
                logger.save()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if (
            not self.every_n_steps
            or step % self.every_n_steps
            or step == self.last_saved_step
            # The epoch's last batch: its checkpoint waits for the epoch end, with validation's metrics.
            or batch_idx + 1 >= trainer.num_training_batches
            or (trainer.max_steps > 0 and step >= trainer.max_steps)
        ):
            return
        self.checkpoint(trainer, mid_epoch=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        step = trainer.global_step
        last = (
            trainer.current_epoch + 1 >= trainer.max_epochs or trainer.should_stop or (trainer.max_steps > 0 and step >= trainer.max_steps)
        )
        if self.every_n_steps:
            due = step % self.every_n_steps == 0 and step != self.last_saved_step
        else:
            due = (trainer.current_epoch + 1) % self.every_n_epochs == 0
        if due or last:
            self.checkpoint(trainer, mid_epoch=False)
        else:
            metrics = self._metrics(trainer, mid_epoch=False)
            ray.train.report(metrics=metrics)
            if self.local:
                self.local.history.append(metrics)
            self.after_report()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # A restored checkpoint's step is saved already: an attempt that trains no further saves nothing.
        self.last_saved_step = max(self.last_saved_step, trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        # A stop this callback's epoch end could not see coming: Lightning runs EarlyStopping's epoch
        # end (and a Timer's) after every other callback's, so that epoch may have gone without the
        # checkpoint the end of training always gets.
        if trainer.global_step != self.last_saved_step:
            self.checkpoint(trainer, mid_epoch=False)

    def _metrics(self, trainer: Any, mid_epoch: bool) -> Dict[str, Any]:
        metrics = {k: v.item() for k, v in trainer.callback_metrics.items()}
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step, mid_epoch=int(mid_epoch))
        if mid_epoch and self.monitor:
            metrics[self.monitor] = UNVALIDATED[self.mode]
        return metrics

    def checkpoint(self, trainer: Any, mid_epoch: bool, wait_upload: bool = False) -> None:
        """Save a Lightning checkpoint into a fresh directory of this worker's and report it to Ray,
        which copies it to the run's storage (Ray Train's documented Lightning recipe).
        `wait_upload`: upload before returning even with background uploads (a preempted worker
        must not stop before its checkpoint is in storage)."""
        with self.saving(trainer.global_step):
            self._checkpoint(trainer, mid_epoch, wait_upload)

    def _checkpoint(self, trainer: Any, mid_epoch: bool, wait_upload: bool) -> None:
        start = time.perf_counter()
        for logger in trainer.loggers:
            logger.save()
        self._flush_next = mid_epoch
        self.last_saved_step = trainer.global_step
        # Every worker saves: sharded strategies write one shard each, and Ray merges the workers'
        # directories in storage. A worker that wrote nothing (not rank 0, under DDP) hands over no
        # checkpoint, so no empty directory is uploaded from its node.
        tmpdir = tempfile.mkdtemp(prefix=f"raydra-checkpoint-rank{trainer.global_rank}-")
        try:
            trainer.save_checkpoint(Path(tmpdir, CHECKPOINT_FILE).as_posix(), weights_only=False)
        except OSError as error:
            shutil.rmtree(tmpdir, ignore_errors=True)
            full = out_of_space(error, tmpdir, "a checkpoint before handing it to Ray")
            if full:
                raise full from None
            raise
        wrote = bool(os.listdir(tmpdir))
        metrics = self._metrics(trainer, mid_epoch)
        for logger in trainer.loggers:
            # Rank 0's W&B logger (logger.wandb.log_model=all): the checkpoint as an artifact, before Ray moves it.
            saved = getattr(logger, "checkpoint_saved", None)
            if saved is not None:
                saved(Path(tmpdir, CHECKPOINT_FILE), metrics)
        if self.local:
            self.local.keep(tmpdir, metrics)
            self.seconds.append(time.perf_counter() - start)
            self.after_report()
            return
        background = self.background_upload and not wait_upload
        ray.train.report(
            metrics=metrics,
            checkpoint=ray.train.Checkpoint.from_directory(tmpdir) if wrote else None,
            checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC if background else ray.train.CheckpointUploadMode.SYNC,
            checkpoint_upload_fn=self._timed_upload if wrote else None,
            # A background upload still reads the directory: Ray removes it once uploaded.
            delete_local_checkpoint_after_upload=background and wrote,
        )
        # Every worker has handed its files over before any removes its temporary copy. Every rank
        # takes part, whatever it wrote: a barrier only some ranks enter never opens.
        trainer.strategy.barrier()
        if not (background and wrote):
            shutil.rmtree(tmpdir, ignore_errors=True)
        self.seconds.append(time.perf_counter() - start)
        self.after_report()

    def _timed_upload(self, checkpoint: Any, checkpoint_dir_name: str) -> Any:
        """Ray's own upload (the one it makes without an upload function), timed."""
        started = time.perf_counter()
        storage = ray.train.get_context().get_storage()
        try:
            persisted = storage.persist_current_checkpoint(checkpoint, checkpoint_dir_name)
        except OSError as error:
            # Ray copies straight into the final checkpoint_* directory and registers it only after
            # this returns: a half-written copy is never the run's checkpoint, but it is removed here
            # so that nothing listing the run's checkpoints finds it, and so its space is free again.
            destination = storage.build_checkpoint_path_from_name(checkpoint_dir_name)
            with contextlib.suppress(OSError):
                storage.storage_filesystem.delete_dir(destination)
            full = out_of_space(error, destination, f"checkpoint {checkpoint_dir_name}")
            if full:
                raise full from None
            raise
        self.upload_seconds.append(time.perf_counter() - started)
        return persisted


class LocalCheckpoints:
    """Local mode's stand-in for Ray Train's checkpoint manager, which runs only with workers: each
    reported checkpoint lands where Ray would put it (`<directory>/checkpoint_<time>/`), and the
    best `num_to_keep` by the monitored metric stay, with the latest, as Ray keeps them. `history`
    holds every report's metrics (Ray's metrics_dataframe)."""

    def __init__(self, directory: Path, num_to_keep: Optional[int], monitor: str, mode: str) -> None:
        self.directory, self.num_to_keep, self.monitor, self.mode = Path(directory), num_to_keep, monitor, mode
        self.history: List[Dict[str, Any]] = []
        self.kept: List[Dict[str, Any]] = []

    def keep(self, tmpdir: str, metrics: Dict[str, Any]) -> None:
        self.history.append(metrics)
        self.directory.mkdir(parents=True, exist_ok=True)
        # Written whole under a temporary name first: a checkpoint_* directory is always complete.
        final = self.directory / f"checkpoint_{datetime.now():%Y-%m-%d_%H-%M-%S.%f}"
        partial = final.with_name(f".{final.name}.partial")
        try:
            shutil.move(tmpdir, partial)
        except OSError as error:
            shutil.rmtree(partial, ignore_errors=True)
            shutil.rmtree(tmpdir, ignore_errors=True)
            full = out_of_space(error, final, f"checkpoint {final.name}")
            if full:
                raise full from None
            raise
        partial.rename(final)
        self.kept.append({"path": str(final), "metrics": metrics})
        if self.num_to_keep is not None:
            best = sorted(self.kept, key=self._score, reverse=True)[: self.num_to_keep]
            for dropped in [k for k in self.kept[:-1] if k not in best]:
                shutil.rmtree(dropped["path"], ignore_errors=True)
                self.kept.remove(dropped)

    def _score(self, kept: Dict[str, Any]) -> float:
        """Higher is better; an unvalidated (mid-epoch: UNVALIDATED, or NaN as before) or missing value ranks last."""
        value = kept["metrics"].get(self.monitor)
        if not isinstance(value, (int, float)) or math.isnan(value):
            return -math.inf
        return value if self.mode == "max" else -value

    def record(self) -> Dict[str, Any]:
        """What the driver's summary needs: the metrics history and the checkpoints kept."""
        return {"history": self.history, "checkpoints": self.kept, "last": self.kept[-1]["path"] if self.kept else None}
