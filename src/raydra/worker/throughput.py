"""Throughput: samples/s, step time, data wait and model FLOPs utilisation of the training loop,
and the memory figures every worker reports back to the driver."""

import contextlib
import dataclasses
import resource
import time
from typing import Any, Dict, List, Optional

import torch
from torch.utils.flop_counter import FlopCounterMode

from raydra.lightning import pl

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
        self.first_step_at: Optional[float] = None
        self._flop_counter: Optional[FlopCounterMode] = None
        self._counting: Optional[contextlib.ExitStack] = None
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
            self._counting = contextlib.ExitStack()
            # Compiled code runs eager for this one step: dynamo declines to trace under a dispatch
            # mode such as the counter and marks the code it was asked to run skipped for good, so
            # every later step would run eager (torch 2.11-2.13; compiled raydra measured 0.65x the
            # plain compiled loop on an H200). The stance is set back when the step ends.
            self._counting.enter_context(torch.compiler.set_stance("force_eager"))
            self._flop_counter = self._counting.enter_context(FlopCounterMode(display=False))
            return
        if self._stretch is None:
            _synchronize(pl_module.device)
            self._stretch = {"start": time.perf_counter(), "tally": _Tally(), "steady": self._steps_seen > WARMUP_STEPS}
        else:
            self._stretch["tally"].wait_s += time.perf_counter() - self._stretch["last_end"]

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._steps_seen += 1
        if self._flop_counter is not None:
            self._stop_counting()
            # Forward and backward of this worker's batch; the optimizer step is negligible.
            self.flops_per_step = self._flop_counter.get_total_flops()
            self._flop_counter = None
            return
        tally = self._stretch["tally"]
        tally.samples += batch_size(batch)
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

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # A step that failed while counted leaves neither the counter nor the eager stance behind
        # (in local mode this process is the driver's, which may train again).
        self._stop_counting()
        self._flop_counter = None

    def _stop_counting(self) -> None:
        counting, self._counting = self._counting, None
        if counting is not None:
            counting.close()

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


def batch_size(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        return batch_size(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)):
        return batch_size(batch[0])
    raise TypeError(f"cannot tell the batch size of a {type(batch).__name__}")


def _synchronize(device: torch.device) -> None:
    # CUDA runs asynchronously: without a sync the step time would only measure the kernel launch.
    if device.type == "cuda":
        torch.cuda.synchronize(device)
