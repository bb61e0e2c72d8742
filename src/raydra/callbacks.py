"""Lightning callbacks raydra adds to every run: throughput measurement and rank-0 console lines."""

import resource
import time
from typing import Any, Dict, Optional

import torch

from raydra.console import PROGRESS_MARK
from raydra.lightning import pl

# The first steps pay for lazy initialisation (allocator warm-up, DDP bucket building); steady-state
# throughput leaves them out.
WARMUP_STEPS = 5


class Throughput(pl.Callback):
    """Samples/s, step time and data-wait time of the training loop.

    A step's time runs from batch start to batch end (forward, backward, optimizer); its data wait
    is the gap before it, where the loop waited for the batch. Logged per epoch as
    train/samples_per_s (all workers together), train/step_time_s and train/data_wait_s.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._steps_seen = 0
        self._steady_samples = 0
        self._steady_seconds = 0.0
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
        if self._steps_seen > WARMUP_STEPS:
            self._steady_samples += samples
            self._steady_seconds += step_s + self._wait

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._epoch_steps:
            return
        elapsed = self._epoch_step_s + self._epoch_wait_s
        pl_module.log_dict(
            {
                "train/samples_per_s": self._epoch_samples * self.world_size / elapsed,
                "train/step_time_s": self._epoch_step_s / self._epoch_steps,
                "train/data_wait_s": self._epoch_wait_s / self._epoch_steps,
            },
            rank_zero_only=True,
        )

    def summary(self) -> Dict[str, float]:
        if not self._steady_seconds:
            return {}
        return {
            "samples_per_s": self._steady_samples * self.world_size / self._steady_seconds,
            "samples_per_s_per_worker": self._steady_samples / self._steady_seconds,
            "steady_steps": self._steps_seen - WARMUP_STEPS,
            "first_step_at": self.first_step_at,
        }


class ConsoleProgress(pl.Callback):
    """Rank 0's lines on the console: a step line every `every_s` seconds, a metrics line per epoch."""

    def __init__(self, max_epochs: int, max_steps: int, every_s: float = 15.0) -> None:
        self.max_epochs, self.max_steps, self.every_s = max_epochs, max_steps, every_s
        self._last_print = time.monotonic()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.monotonic()
        if now - self._last_print < self.every_s:
            return
        self._last_print = now
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        line = f"step {trainer.global_step}"
        if self.max_steps > 0:
            line += f"/{self.max_steps}"
        if loss is not None:
            line += f"  loss {float(loss):.4f}"
        print(PROGRESS_MARK + line, flush=True)

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
    """

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
