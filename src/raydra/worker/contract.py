"""What raydra needs of a user's LightningModule while it trains, checked the first time it can be
(docs/own-project.md). What the driver can check before Ray starts, it does (raydra.config.project).

    model/data _target_        importable on this worker: a project that did not travel with the
                               run is named as such
    the first training batch   raydra counts samples in it (train/samples_per_s): a tensor, a dict of
                               tensors or a tuple/list whose first item is one
    checkpoint.monitor         logged by the time an epoch's metrics go to Ray, once the module has
                               validated (or at the first epoch's end if it never validates):
                               otherwise Ray ranks every checkpoint by nothing and "best" means oldest
"""

import importlib
from typing import Any, List

from raydra.errors import RaydraError
from raydra.lightning import pl
from raydra.worker.throughput import batch_size


def check_importable(node: Any, group: str) -> None:
    """The `_target_` of `group` imports on this worker. Its usual failure on a cluster is a project
    that did not travel with the run; Hydra would say only that the module is not installed."""
    target = str(node.get("_target_") or "")
    module, top = target.rpartition(".")[0], target.split(".")[0]
    if not module:
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name and (module == error.name or module.startswith(error.name + ".")):
            import ray.util

            raise RaydraError(
                f"{group}._target_={target}: the worker on {ray.util.get_node_ip_address()} cannot import {error.name}, "
                f"so your project did not reach it; run from the project's directory (the one holding {top}/) with "
                "ray.working_dir=auto, set ray.working_dir=<that directory>, or install it on every node."
            ) from None
        raise


class Contract(pl.Callback):
    """Fails the run with one sentence when the module breaks what raydra relies on. Placed before
    the callbacks that rely on it, so its sentence comes first."""

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor
        self._batch_checked = False
        self._validated = False

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._batch_checked:
            return
        self._batch_checked = True
        try:
            batch_size(batch)
        except (TypeError, IndexError, StopIteration, AttributeError):
            raise RaydraError(
                f"{type(pl_module).__name__}'s training batches are {_describe(batch)}; raydra counts samples in a tensor, "
                "a dict of tensors or a tuple/list whose first item is a tensor: return one of those from the train "
                "DataLoader (its collate_fn)."
            ) from None

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        # Before a first validation (check_val_every_n_epoch > 1) a validation metric cannot be there yet.
        if self.monitor in trainer.callback_metrics or (trainer.enable_validation and not self._validated):
            return
        logged = _shown(sorted(trainer.callback_metrics))
        where = "validation_step" if self.monitor.startswith("val") else "training_step or validation_step"
        raise RaydraError(
            f"checkpoint.monitor={self.monitor} is not a metric {type(pl_module).__name__} logs (after epoch "
            f"{trainer.current_epoch + 1} it had logged {logged}); log it in {where} with "
            f'self.log("{self.monitor}", value, sync_dist=True), or set checkpoint.monitor to a metric it logs '
            "(and checkpoint.mode to min or max)."
        )


def _shown(names: List[str], most: int = 8) -> str:
    if not names:
        return "nothing"
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _describe(batch: Any) -> str:
    if isinstance(batch, (list, tuple)) and batch:
        return f"{type(batch).__name__}s starting with a {type(batch[0]).__name__}"
    return f"{type(batch).__name__} objects"
