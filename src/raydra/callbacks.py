"""Lightning callbacks raydra adds to every run: throughput, rank-0 console lines, exact resumption, checkpoint reports."""

import dataclasses
import itertools
import os
import resource
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

import ray.train
import torch
from ray.train.lightning import RayTrainReportCallback
from torch.utils.flop_counter import FlopCounterMode

from raydra.console import PROGRESS_MARK
from raydra.lightning import pl

# The first steps pay for lazy initialisation (allocator warm-up, DDP bucket building); steady-state
# throughput leaves them out. The FLOPs of one step are counted on the step after them.
WARMUP_STEPS = 5

# Dense (no sparsity) peak TFLOP/s per device from NVIDIA's datasheets, by compute dtype: the
# denominator of model FLOPs utilisation. Lightning's own table quotes sparse peaks, which would
# halve every MFU. First match of the lower-cased device name wins.
PEAK_TFLOPS = (
    ("h100 pcie", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("h100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("h200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("a100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("l40s", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    ("l4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
)


def peak_flops(device: torch.device, precision: str) -> Optional[float]:
    """The device's dense peak FLOP/s for the run's compute dtype; None on CPU or unknown GPUs."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    if precision.startswith("bf16"):
        dtype = "bf16"
    elif precision.startswith("16"):
        dtype = "fp16"
    else:
        dtype = "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    for chip, peaks in PEAK_TFLOPS:
        if chip in name:
            return peaks[dtype] * 1e12
    return None


class Throughput(pl.Callback):
    """Samples/s, step time and data-wait time of the training loop.

    A step runs from batch start to batch end (forward, backward, optimizer); its data wait is the
    gap before it, where the loop waited for the batch. Logged per epoch as train/samples_per_s
    (all workers together), train/step_time_s and train/data_wait_s.

    The device is not synchronised every step: that would stop the host from queueing the next
    step's kernels while the GPU works, and cost the very throughput being measured. Steps are
    timed in stretches instead, synchronised only where a stretch begins and ends (an epoch's
    first step, validation, the epoch's end), so a stretch's wall time is exact and step time is
    its average; data wait is what the host spent getting batches.
    """

    def __init__(self, world_size: int, peak_flops: Optional[float] = None) -> None:
        self.world_size = world_size
        self.peak_flops = peak_flops
        self.flops_per_step: Optional[int] = None
        self._flop_counter: Optional[FlopCounterMode] = None
        self._steps_seen = 0
        self._stretch: Optional[Dict[str, Any]] = None
        self._steady = _Tally()
        self._epoch = _Tally()

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._epoch = _Tally()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        # Validation in the middle of an epoch is neither step time nor time waiting for data.
        self._close_stretch(pl_module.device)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._steps_seen == 0:
            self.first_step_at = time.time()  # wall clock, so start-up can be measured from launch
        if self._steps_seen == WARMUP_STEPS:
            # Counting dispatches every op through Python, so this one step is left out of the timing.
            self._close_stretch(pl_module.device)
            self._flop_counter = FlopCounterMode(display=False)
            self._flop_counter.__enter__()
            return
        if self._stretch is None:
            _synchronize(pl_module.device)
            self._stretch = {"start": time.perf_counter(), "tally": _Tally(), "steady": self._steps_seen > WARMUP_STEPS}
        else:
            self._stretch["tally"].wait_s += time.perf_counter() - self._stretch["last_end"]

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._steps_seen += 1
        if self._flop_counter is not None:
            self._flop_counter.__exit__(None, None, None)
            # Forward and backward of this worker's batch; the optimizer step is negligible.
            self.flops_per_step = self._flop_counter.get_total_flops()
            self._flop_counter = None
            return
        tally = self._stretch["tally"]
        tally.samples += _batch_size(batch)
        tally.steps += 1
        self._stretch["last_end"] = time.perf_counter()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._close_stretch(pl_module.device)
        epoch = self._epoch
        if not epoch.steps or not epoch.seconds:
            return
        metrics = {
            "train/samples_per_s": epoch.samples * self.world_size / epoch.seconds,
            "train/step_time_s": (epoch.seconds - epoch.wait_s) / epoch.steps,
            "train/data_wait_s": epoch.wait_s / epoch.steps,
        }
        metrics.update(self._flops_metrics(epoch.seconds / epoch.steps))
        pl_module.log_dict(metrics, rank_zero_only=True)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close_stretch(pl_module.device)  # a run stopped by max_steps mid-epoch

    def _close_stretch(self, device: torch.device) -> None:
        stretch, self._stretch = self._stretch, None
        if stretch is None:
            return
        _synchronize(device)  # the last step's kernels have finished
        tally = stretch["tally"]
        tally.seconds = time.perf_counter() - stretch["start"]
        self._epoch.add(tally)
        if stretch["steady"]:
            self._steady.add(tally)

    def _flops_metrics(self, seconds_per_step: float) -> Dict[str, float]:
        if not self.flops_per_step:
            return {}
        achieved = self.flops_per_step / seconds_per_step  # per worker
        metrics = {"train/tflops_per_s_per_worker": achieved / 1e12}
        if self.peak_flops:
            metrics["train/mfu"] = achieved / self.peak_flops
        return metrics

    def summary(self) -> Dict[str, float]:
        steady = self._steady
        if not steady.seconds:
            return {}
        summary = {
            "samples_per_s": steady.samples * self.world_size / steady.seconds,
            "samples_per_s_per_worker": steady.samples / steady.seconds,
            "step_time_s": steady.seconds / steady.steps,
            "steady_steps": steady.steps,
            "first_step_at": self.first_step_at,
            "flops_per_step_per_worker": self.flops_per_step,
        }
        summary.update({k.split("/")[1]: v for k, v in self._flops_metrics(summary["step_time_s"]).items()})
        return summary


@dataclasses.dataclass
class _Tally:
    samples: int = 0
    steps: int = 0
    seconds: float = 0.0  # wall time, data waits included
    wait_s: float = 0.0

    def add(self, other: "_Tally") -> None:
        self.samples += other.samples
        self.steps += other.steps
        self.seconds += other.seconds
        self.wait_s += other.wait_s


class ConsoleProgress(pl.Callback):
    """Rank 0's lines on the console: a step line every `every_s` seconds, a metrics line per epoch."""

    def __init__(self, max_epochs: int, max_steps: int, world_size: int, every_s: float = 15.0) -> None:
        self.max_epochs, self.max_steps, self.world_size, self.every_s = max_epochs, max_steps, world_size, every_s
        self._last_print = time.monotonic()
        self._samples = 0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._samples += _batch_size(batch) * self.world_size
        now = time.monotonic()
        if now - self._last_print < self.every_s:
            return
        rate = self._samples / (now - self._last_print)
        self._last_print, self._samples = now, 0
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        line = f"step {trainer.global_step}"
        if self.max_steps > 0:
            line += f"/{self.max_steps}"
        if loss is not None:
            line += f"  loss {float(loss):.4f}"
        print(f"{PROGRESS_MARK}{line}  {rate:.0f} samples/s", flush=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        # Step-level values and Lightning's duplicated _epoch/_step twins would only crowd the line.
        shown = "  ".join(
            f"{k} {_fmt(v)}" for k, v in sorted(metrics.items()) if not k.endswith(("_step", "_epoch", "step_time_s"))
        )
        total = f"/{self.max_epochs}" if self.max_epochs > 0 else ""
        print(f"{PROGRESS_MARK}epoch {trainer.current_epoch + 1}{total}  step {trainer.global_step}  {shown}", flush=True)


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
    - The module's class, so `raydra.load` can rebuild it from the checkpoint alone.
    """

    def __init__(self) -> None:
        self._trainer: Any = None
        self._batches = 0  # trained in the current epoch
        self._in_epoch = False
        self._restored: Optional[Dict[str, Any]] = None
        self.resumed_at: Optional[Dict[str, int]] = None

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
            state["data"] = {"epoch": self._trainer.current_epoch, "batches": self._batches, "mid_epoch": self._in_epoch}
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])
        self._restored = state_dict.get("data")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        restored, self._restored = self._restored, None
        if restored is None:
            return
        epoch, skip = trainer.current_epoch, 0
        if restored["mid_epoch"] and restored["epoch"] == epoch and 0 < restored["batches"] < trainer.num_training_batches:
            skip = restored["batches"]
        self._batches, self._in_epoch = skip, skip > 0
        self.resumed_at = {"epoch": epoch, "batches": skip, "of": int(trainer.num_training_batches),
                           "global_step": trainer.global_step}
        for loader in _train_loaders(trainer):
            _position(loader, epoch, skip)
        # The train iterator was made before this hook (Lightning's setup_data); a DataLoader with
        # worker processes has already queued batches from it, so make it again from the new position.
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        if fetcher is not None:
            iter(fetcher)

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


def _train_loaders(trainer: Any) -> List[Any]:
    loaders = trainer.train_dataloader
    if isinstance(loaders, dict):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


def _position(loader: Any, epoch: int, skip: int) -> None:
    """Put a train loader at batch `skip` of epoch `epoch`."""
    if isinstance(loader, torch.utils.data.DataLoader):
        batch_sampler = loader.batch_sampler
        for sampler in {id(s): s for s in (loader.sampler, getattr(batch_sampler, "sampler", None))}.values():
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        if not skip:
            return
        if type(batch_sampler) is not torch.utils.data.BatchSampler:
            warnings.warn(f"raydra cannot skip the first {skip} batches of a DataLoader with a custom batch sampler; "
                          f"after this mid-epoch restart epoch {epoch} trains its first batches again.")
            return
        batch_sampler.sampler = _SkipFirst(batch_sampler.sampler, skip * batch_sampler.batch_size)
    elif hasattr(loader, "set_epoch") and hasattr(loader, "skip"):
        loader.set_epoch(epoch)
        loader.skip(skip)
    elif skip:
        warnings.warn(f"raydra cannot skip the first {skip} batches of a {type(loader).__name__} (it has no "
                      f"set_epoch/skip); after this mid-epoch restart epoch {epoch} trains its first batches again.")


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


class TimedReport(RayTrainReportCallback):
    """Ray's checkpoint and report, at the run's checkpoint frequency and timed: training stands
    still while a checkpoint is written and handed to Ray, so its cost is part of what a strategy costs.

    Every epoch end reports its metrics (what Tune schedules on and Ray's history records); a
    checkpoint goes with it every `every_n_epochs` epochs, and at the end of training. With
    `every_n_steps`, a checkpoint is saved after every that many optimizer steps instead, inside
    the epoch; such a report carries `mid_epoch=1` and the monitored metric as NaN, since
    validation has not seen those weights, so Ray never ranks it best.
    """

    def __init__(self, every_n_epochs: Optional[int] = None, every_n_steps: Optional[int] = None,
                 monitor: Optional[str] = None) -> None:
        super().__init__()
        self.every_n_epochs = every_n_epochs or 1
        self.every_n_steps = every_n_steps
        self.monitor = monitor
        self.seconds: List[float] = []
        self._flush_next = False
        self._last_saved_step = -1

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        # The row of the step a checkpoint was saved at is logged after the checkpoint.
        if self._flush_next:
            self._flush_next = False
            for logger in trainer.loggers:
                logger.save()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if (not self.every_n_steps or step % self.every_n_steps or step == self._last_saved_step
                # The epoch's last batch: its checkpoint waits for the epoch end, with validation's metrics.
                or batch_idx + 1 >= trainer.num_training_batches
                or (trainer.max_steps > 0 and step >= trainer.max_steps)):
            return
        self._checkpoint(trainer, mid_epoch=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        step = trainer.global_step
        last = (trainer.current_epoch + 1 >= trainer.max_epochs or trainer.should_stop
                or (trainer.max_steps > 0 and step >= trainer.max_steps))
        if self.every_n_steps:
            due = step % self.every_n_steps == 0 and step != self._last_saved_step
        else:
            due = (trainer.current_epoch + 1) % self.every_n_epochs == 0
        if due or last:
            self._checkpoint(trainer, mid_epoch=False)
        else:
            ray.train.report(metrics=self._metrics(trainer, mid_epoch=False))

    def _metrics(self, trainer: Any, mid_epoch: bool) -> Dict[str, Any]:
        metrics = {k: v.item() for k, v in trainer.callback_metrics.items()}
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step, mid_epoch=int(mid_epoch))
        if mid_epoch and self.monitor:
            metrics[self.monitor] = float("nan")
        return metrics

    def _checkpoint(self, trainer: Any, mid_epoch: bool) -> None:
        """RayTrainReportCallback.on_train_epoch_end's save and report, with this run's metrics."""
        start = time.perf_counter()
        for logger in trainer.loggers:
            logger.save()
        self._flush_next = mid_epoch
        self._last_saved_step = trainer.global_step
        tmpdir = Path(self.tmpdir_prefix, f"{trainer.current_epoch}-{trainer.global_step}").as_posix()
        os.makedirs(tmpdir, exist_ok=True)
        trainer.save_checkpoint(Path(tmpdir, self.CHECKPOINT_NAME).as_posix(), weights_only=False)
        ray.train.report(
            metrics=self._metrics(trainer, mid_epoch), checkpoint=ray.train.Checkpoint.from_directory(tmpdir),
            checkpoint_upload_mode=self.checkpoint_upload_mode, validation=self.validation,
        )
        # Every worker has handed its files over before any removes its temporary copy.
        trainer.strategy.barrier()
        shutil.rmtree(tmpdir, ignore_errors=True)
        self.seconds.append(time.perf_counter() - start)


def model_state_bytes(module: torch.nn.Module, optimizers: List[torch.optim.Optimizer]) -> int:
    """Bytes of parameters and optimizer state this worker holds: its shard under FSDP, all of it under DDP."""
    tensors = list(module.parameters())
    tensors += [v for opt in optimizers for state in opt.state.values() for v in state.values() if torch.is_tensor(v)]
    # A sharded (DTensor) parameter's own memory is its local shard.
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return int(sum(t.numel() * t.element_size() for t in local))


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA's peak allocation on GPU; the process's peak resident set on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _batch_size(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        return _batch_size(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)):
        return _batch_size(batch[0])
    raise TypeError(f"cannot tell the batch size of a {type(batch).__name__}")


def _synchronize(device: torch.device) -> None:
    # CUDA runs asynchronously: without a sync the step time would only measure the kernel launch.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.4f}"
