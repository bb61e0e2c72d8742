"""Exact resumption: what Lightning's checkpoint leaves out but a continuation needs (RNG, where the
training data stood, the world size that trained it, the module's class)."""

import itertools
import logging
import time
import warnings
from typing import Any, Dict, List, Optional

import torch

from raydra.cluster.worker_output import PROGRESS_MARK
from raydra.lightning import pl
from raydra.private_apis.lightning import restart_train_iterator
from raydra.records.envelope import now


class Resumable(pl.Callback):
    """What Lightning's checkpoint leaves out but an exact continuation needs.

    - torch's RNG state (dropout, augmentation) rides in the checkpoint as tensors, so it still
      loads with weights_only=True.
    - Where the training data stood. Lightning restores a mid-epoch checkpoint's step and batch
      counters but restarts the dataloader at the epoch's first batch (it warns "your dataloader
      is not resumable"), so the rest of that epoch would train its first batches twice and never
      see its last ones. This callback records how many batches of the epoch were trained and, on
      restart, skips them: in a DataLoader's sampler (the order is DistributedSampler's, a function
      of seed and epoch) or through `set_epoch`/`skip` on other loaders (DeviceBatches).
    - Logger rows are flushed at each epoch start: everything up to the last checkpoint is on disk
      before a worker can die in the next epoch (TimedReport also flushes at each checkpoint).
    - The world size that trained up to the checkpoint, and every resize so far (an elastic group,
      scale.num_workers=[min, max], restarts on another size). Skipping stays exact across a resize:
      the global batch is fixed, and both DistributedSampler and DeviceBatches deal the epoch's one
      seeded order out by stride, so N batches on W workers are the order's first N x batch_size
      samples whatever W is. A loader that cannot skip restarts the epoch (`restarted_epoch`).
    - The module's class, so `raydra.load` can rebuild it from the checkpoint alone.
    """

    def __init__(self, world_size: int = 1, elastic: bool = False) -> None:
        # elastic: each epoch's row in metrics.csv also says how many workers trained it.
        self.world_size, self.elastic = world_size, elastic
        self._trainer: Any = None
        self._batches = 0  # trained in the current epoch
        self._in_epoch = False
        self._restored: Optional[Dict[str, Any]] = None
        self.resumed_at: Optional[Dict[str, int]] = None
        # Every change of world size this run has seen, carried from checkpoint to checkpoint.
        self.resizes: List[Dict[str, Any]] = []

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._trainer = trainer

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        # FSDP2 swaps a sharded module's class for a generated FSDP<Name> subclass: name the user's.
        cls = next(c for c in type(pl_module).__mro__ if not c.__module__.startswith("torch."))
        checkpoint["module_class"] = f"{cls.__module__}.{cls.__qualname__}"

    def state_dict(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        if self._trainer is not None:
            state["data"] = {
                "epoch": self._trainer.current_epoch,
                "batches": self._batches,
                "mid_epoch": self._in_epoch,
                "world_size": self.world_size,
            }
        state["resizes"] = list(self.resizes)
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])
        self._restored = state_dict.get("data")
        self.resizes = list(state_dict.get("resizes", []))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        restored, self._restored = self._restored, None
        if restored is None:
            return
        epoch, skip = trainer.current_epoch, 0
        if restored["mid_epoch"] and restored["epoch"] == epoch and 0 < restored["batches"] < trainer.num_training_batches:
            skip = restored["batches"]
        self._batches, self._in_epoch = skip, skip > 0
        self.resumed_at = {"epoch": epoch, "batches": skip, "of": int(trainer.num_training_batches), "global_step": trainer.global_step}
        exact = all([_position(loader, epoch, skip) for loader in _train_loaders(trainer)])
        # Checkpoints written before raydra recorded it hold no world size: no resize is claimed.
        before = restored.get("world_size")
        if before is not None and before != self.world_size:
            self._record_resize(trainer, before, epoch, skip, exact)
        # The train iterator was made before this hook (Lightning's setup_data); a DataLoader with
        # worker processes has already queued batches from it, so make it again from the new position.
        restart_train_iterator(trainer)

    def _record_resize(self, trainer: Any, before: int, epoch: int, skip: int, exact: bool) -> None:
        """One entry in `resizes` (summary.json), one row in metrics.csv, one line in the worker log."""
        resize = {
            "at": now(),
            "from": before,
            "to": self.world_size,
            "step": trainer.global_step,
            "epoch": epoch,
            # Batches of the interrupted epoch skipped as trained (0: the checkpoint was at an epoch's end).
            "skipped_batches": skip if exact else 0,
            # The epoch trained again from its first batch, when a loader could not skip exactly.
            "restarted_epoch": None if exact or not skip else epoch,
        }
        self.resizes.append(resize)
        where = f"epoch {epoch}, batch {skip}" if exact else f"epoch {epoch} from its first batch (its loader cannot skip)"
        line = f"resized from {before} to {self.world_size} workers at global step {trainer.global_step}: continuing at {where}"
        logging.getLogger("raydra").info(line)
        if trainer.global_rank == 0:
            # Marked for the driver's console (raydra.cluster.worker_output picks rank 0's marked lines out of Ray's stream).
            print(f"{PROGRESS_MARK}{line}", flush=True)
        for logger in trainer.loggers:
            logger.log_metrics(
                {"epoch": epoch, "resize/from_workers": before, "resize/to_workers": self.world_size, "resize/time": time.time()},
                step=trainer.global_step,
            )

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._batches, self._in_epoch = 0, True
        for loader in _train_loaders(trainer):
            if not isinstance(loader, torch.utils.data.DataLoader) and hasattr(loader, "set_epoch"):
                loader.set_epoch(trainer.current_epoch)
        for logger in trainer.loggers:
            logger.save()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._batches += 1

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        # Runs before TimedReport's epoch-end checkpoint: that one resumes at the next epoch's start.
        self._in_epoch = False
        if self.elastic:
            pl_module.log("train/world_size", float(self.world_size), rank_zero_only=True)


def _train_loaders(trainer: Any) -> List[Any]:
    loaders = trainer.train_dataloader
    if isinstance(loaders, dict):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


def _position(loader: Any, epoch: int, skip: int) -> bool:
    """Put a train loader at batch `skip` of epoch `epoch`; False when it cannot skip (it then
    starts the epoch from its first batch)."""
    if isinstance(loader, torch.utils.data.DataLoader):
        batch_sampler = loader.batch_sampler
        for sampler in {id(s): s for s in (loader.sampler, getattr(batch_sampler, "sampler", None))}.values():
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        if not skip:
            return True
        if type(batch_sampler) is not torch.utils.data.BatchSampler:
            warnings.warn(
                f"raydra cannot skip the first {skip} batches of a DataLoader with a custom batch sampler; "
                f"after this mid-epoch restart epoch {epoch} trains its first batches again.",
                stacklevel=2,
            )
            return False
        batch_sampler.sampler = _SkipFirst(batch_sampler.sampler, skip * batch_sampler.batch_size)
    elif hasattr(loader, "set_epoch") and hasattr(loader, "skip"):
        loader.set_epoch(epoch)
        loader.skip(skip)
    elif skip:
        warnings.warn(
            f"raydra cannot skip the first {skip} batches of a {type(loader).__name__} (it has no "
            f"set_epoch/skip); after this mid-epoch restart epoch {epoch} trains its first batches again.",
            stacklevel=2,
        )
        return False
    return True


class _SkipFirst:
    """A sampler whose next pass leaves out its first `count` indices; later passes are whole."""

    def __init__(self, sampler: Any, count: int) -> None:
        self.sampler, self.count = sampler, count

    def __iter__(self) -> Any:
        indices = iter(self.sampler)
        count, self.count = self.count, 0
        return itertools.islice(indices, count, None)

    def __len__(self) -> int:
        # The loader's length stays the epoch's: Lightning counts the skipped batches as done.
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
