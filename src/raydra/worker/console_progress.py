"""Rank 0's lines on the driver's console: a step line now and then, a metrics line per epoch."""

import time
from typing import Any, Callable, Optional

from raydra.cluster.worker_output import PROGRESS_MARK
from raydra.lightning import pl
from raydra.worker.throughput import batch_size


class ConsoleProgress(pl.Callback):
    """Rank 0's lines on the console: a step line every `every_s` seconds of training, a metrics line per epoch.

    The step line's samples/s has the basis of the epoch line's train/samples_per_s (raydra.worker.
    throughput): samples of all workers over the wall time of training steps, data waits included;
    start-up, validation and the time between epochs left out, so the two figures agree."""

    def __init__(self, max_steps: int, world_size: int, every_s: float = 15.0, emit: Optional[Callable[[str], None]] = None) -> None:
        self.max_steps, self.world_size, self.every_s = max_steps, world_size, every_s
        # A Ray worker prints, marked, for the driver to pick out of Ray's stream (raydra.cluster.worker_output).
        self.emit = emit or (lambda line: print(f"{PROGRESS_MARK}{line}", flush=True))
        self._samples, self._seconds = 0, 0.0
        self._batch_start: Optional[float] = None
        self._last_end: Optional[float] = None  # None: the next batch starts a new stretch

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_end = None

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_end = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        end = time.perf_counter()
        # Within a stretch the time since the previous batch ended counts (waiting for data is
        # training time); a stretch's first batch counts from its own start.
        self._seconds += end - (self._last_end if self._last_end is not None else self._batch_start)
        self._last_end = end
        self._samples += batch_size(batch) * self.world_size
        # A line per `every_s` of training: start-up and validation never make one due.
        if self._seconds < self.every_s:
            return
        rate = self._samples / self._seconds
        self._samples, self._seconds = 0, 0.0
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        line = f"step {trainer.global_step}"
        if self.max_steps > 0:
            line += f"/{self.max_steps}"
        if loss is not None:
            line += f"  loss {float(loss):.4f}"
        self.emit(f"{line}  train/samples_per_s {rate:.0f}")

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        # Step-level values and Lightning's duplicated _epoch/_step twins would only crowd the line.
        shown = "  ".join(f"{k} {_fmt(v)}" for k, v in sorted(metrics.items()) if not k.endswith(("_step", "_epoch", "step_time_s")))
        # Lightning's own count: fast_dev_run makes it 1 whatever trainer.max_epochs says.
        total = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        self.emit(f"epoch {trainer.current_epoch + 1}{total}  step {trainer.global_step}  {shown}")


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.4f}"
