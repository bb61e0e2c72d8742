"""The user's Lightning callbacks (root key `callbacks`) on a worker, and what they ended.

Each entry is built with hydra.utils.instantiate on every worker, after raydra's own callbacks,
except those whose nature is rank 0's: LearningRateMonitor and DeviceStatsMonitor only write to
the loggers, which only rank 0 has (raydra.worker.loggers). What the driver stands in for (a
ModelCheckpoint, a progress bar) never reaches a worker (raydra.config.user_callbacks).
"""

import logging
from typing import Any, Dict, List, Optional, Tuple

from hydra.utils import get_class, instantiate

from raydra.config.project import writes_to_loggers
from raydra.lightning import pl
from raydra.worker.contract import check_importable

log = logging.getLogger("raydra")


def build_callbacks(entries: Optional[Dict[str, Any]], rank: int) -> List[Tuple[str, Any]]:
    """(name, callback) for each entry of `callbacks` this worker runs; null or {}: none."""
    built = []
    for name, node in (entries or {}).items():
        if node is None:
            continue
        check_importable(node, f"callbacks.{name}")
        if rank != 0 and writes_to_loggers(get_class(node["_target_"])):
            continue
        built.append((name, instantiate(node)))
    return built


def stop_record(trainer: Any, callbacks: List[Tuple[str, Any]]) -> Optional[Dict[str, Any]]:
    """summary.json's `stopped_early`: which EarlyStopping ended training, at which epoch (counted
    from 0, as metrics.csv counts) and optimizer step, on what metric and value, in Lightning's words.
    Every worker ends at the same step (EarlyStopping reduces its decision over the process group),
    and each one's log says where it stopped."""
    not_stopped = pl.callbacks.early_stopping.EarlyStoppingReason.NOT_STOPPED
    for name, callback in callbacks:
        if not isinstance(callback, pl.callbacks.EarlyStopping) or callback.stopping_reason == not_stopped:
            continue
        value = trainer.callback_metrics.get(callback.monitor)
        record = {
            "by": f"callbacks.{name}",
            "epoch": callback.stopped_epoch,
            "step": trainer.global_step,
            "monitor": callback.monitor,
            "value": float(value) if value is not None else None,
            "reason": callback.stopping_reason_message or callback.stopping_reason.name.lower(),
        }
        log.info(f"stopped early at epoch {record['epoch']}, step {record['step']}, by {record['by']}: {record['reason']}")
        return record
    return None
