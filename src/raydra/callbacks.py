"""Lightning callbacks raydra adds to every run: throughput, rank-0 console lines, timed checkpoint reports."""

import resource
import time
from typing import Any, Dict, List, Optional

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

    A step's time runs from batch start to batch end (forward, backward, optimizer); its data wait
    is the gap before it, where the loop waited for the batch. Logged per epoch as
    train/samples_per_s (all workers together), train/step_time_s and train/data_wait_s.
    """

    def __init__(self, world_size: int, peak_flops: Optional[float] = None) -> None:
        self.world_size = world_size
        self.peak_flops = peak_flops
        self.flops_per_step: Optional[int] = None
        self._flop_counter: Optional[FlopCounterMode] = None
        self._steps_seen = 0
        self._steady_samples = 0
        self._steady_seconds = 0.0
        self._steady_steps = 0
        self._reset_epoch()

    def _reset_epoch(self) -> None:
        self._epoch_samples = 0
        self._epoch_step_s = 0.0
        self._epoch_wait_s = 0.0
        self._epoch_steps = 0
        self._last_end: Optional[float] = None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._reset_epoch()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        # Validation in the middle of an epoch is not time the training loop waited for data.
        self._last_end = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        _synchronize(pl_module.device)
        if self._steps_seen == 0:
            self.first_step_at = time.time()  # wall clock, so start-up can be measured from launch
        if self._steps_seen == WARMUP_STEPS:
            # Counting dispatches every op through Python, so this one step is left out of the timing.
            self._flop_counter = FlopCounterMode(display=False)
            self._flop_counter.__enter__()
        self._start = time.perf_counter()
        self._wait = 0.0 if self._last_end is None else self._start - self._last_end

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        _synchronize(pl_module.device)
        self._last_end = time.perf_counter()
        step_s = self._last_end - self._start
        samples = _batch_size(batch)
        self._epoch_samples += samples
        self._epoch_step_s += step_s
        self._epoch_wait_s += self._wait
        self._epoch_steps += 1
        self._steps_seen += 1
        if self._flop_counter is not None:
            self._flop_counter.__exit__(None, None, None)
            # Forward and backward of this worker's batch; the optimizer step is negligible.
            self.flops_per_step = self._flop_counter.get_total_flops()
            self._flop_counter = None
        elif self._steps_seen > WARMUP_STEPS:
            self._steady_samples += samples
            self._steady_seconds += step_s + self._wait
            self._steady_steps += 1

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._epoch_steps:
            return
        elapsed = self._epoch_step_s + self._epoch_wait_s
        metrics = {
            "train/samples_per_s": self._epoch_samples * self.world_size / elapsed,
            "train/step_time_s": self._epoch_step_s / self._epoch_steps,
            "train/data_wait_s": self._epoch_wait_s / self._epoch_steps,
        }
        metrics.update(self._flops_metrics(elapsed / self._epoch_steps))
        pl_module.log_dict(metrics, rank_zero_only=True)

    def _flops_metrics(self, seconds_per_step: float) -> Dict[str, float]:
        if not self.flops_per_step:
            return {}
        achieved = self.flops_per_step / seconds_per_step  # per worker
        metrics = {"train/tflops_per_s_per_worker": achieved / 1e12}
        if self.peak_flops:
            metrics["train/mfu"] = achieved / self.peak_flops
        return metrics

    def summary(self) -> Dict[str, float]:
        if not self._steady_seconds:
            return {}
        summary = {
            "samples_per_s": self._steady_samples * self.world_size / self._steady_seconds,
            "samples_per_s_per_worker": self._steady_samples / self._steady_seconds,
            "step_time_s": self._steady_seconds / self._steady_steps,
            "steady_steps": self._steady_steps,
            "first_step_at": self.first_step_at,
            "flops_per_step_per_worker": self.flops_per_step,
        }
        summary.update({k.split("/")[1]: v for k, v in self._flops_metrics(summary["step_time_s"]).items()})
        return summary


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
      loads with weights_only=True; the data order needs nothing, DistributedSampler derives it
      from seed + epoch.
    - Logger rows are flushed at each epoch start: everything up to the last checkpoint is on disk
      before a worker can die in the next epoch.
    - The module's class, so `raydra.load` can rebuild it from the checkpoint alone.
    """

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        # FSDP2 swaps a sharded module's class for a generated FSDP<Name> subclass: name the user's.
        cls = next(c for c in type(pl_module).__mro__ if not c.__module__.startswith("torch."))
        checkpoint["module_class"] = f"{cls.__module__}.{cls.__qualname__}"

    def state_dict(self) -> Dict[str, Any]:
        state = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        for logger in trainer.loggers:
            logger.save()


class TimedReport(RayTrainReportCallback):
    """Ray's per-epoch checkpoint and report, timed: training stands still while a checkpoint is
    written and handed to Ray, so its cost is part of what a strategy costs."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: List[float] = []

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        start = time.perf_counter()
        super().on_train_epoch_end(trainer, pl_module)
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
