"""Rank 0's lines on the driver's console: a step line now and then, a metrics line per epoch."""

import time
from typing import Any

from raydra.console import PROGRESS_MARK
from raydra.lightning import pl
from raydra.worker.throughput import batch_size


class ConsoleProgress(pl.Callback):
    """Rank 0's lines on the console: a step line every `every_s` seconds, a metrics line per epoch."""

    def __init__(self, max_epochs: int, max_steps: int, world_size: int, every_s: float = 15.0) -> None:
        self.max_epochs, self.max_steps, self.world_size, self.every_s = max_epochs, max_steps, world_size, every_s
        self._last_print = time.monotonic()
        self._samples = 0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._samples += batch_size(batch) * self.world_size
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
        shown = "  ".join(f"{k} {_fmt(v)}" for k, v in sorted(metrics.items()) if not k.endswith(("_step", "_epoch", "step_time_s")))
        total = f"/{self.max_epochs}" if self.max_epochs > 0 else ""
        print(f"{PROGRESS_MARK}epoch {trainer.current_epoch + 1}{total}  step {trainer.global_step}  {shown}", flush=True)


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.4f}"
