"""Lightning's private API (raydra.private_apis says why such a module exists)."""

import sys
from typing import Any, Dict, List, Tuple


def _model_parallel_module() -> Any:
    """The module of Lightning's ModelParallelStrategy, from whichever package Ray's strategies use."""
    from raydra.lightning import pl

    return sys.modules[pl.strategies.ModelParallelStrategy.__module__]


def materialize_distributed_module(module: Any, device: Any) -> None:
    """Initialise a meta-device module's parameters on `device` after sharding, as
    ModelParallelStrategy.setup does; the strategy exposes no public step for it."""
    _model_parallel_module()._materialize_distributed_module(module, device)


def optimizers_to_device(optimizers: List[Any], device: Any) -> None:
    """Move restored optimizer state to the worker's device, as ModelParallelStrategy.setup does."""
    _model_parallel_module()._optimizers_to_device(optimizers, device)


def save_distributed_checkpoint(shards: Any, path: Any) -> None:
    """torch.distributed.checkpoint save of this worker's shards, in the layout Lightning's
    ModelParallelStrategy.load_checkpoint reads back."""
    _model_parallel_module()._distributed_checkpoint_save(shards, path)


def distributed_checkpoint_metadata_file() -> str:
    """The file name Lightning's sharded checkpoints keep the non-tensor state in (meta.pt)."""
    return _model_parallel_module()._METADATA_FILENAME


def restart_train_iterator(trainer: Any) -> None:
    """Make the fit loop's train iterator again, from the loader's current position.

    Lightning makes it before `on_train_start`, and a DataLoader with worker processes has already
    queued batches from it by then; a resumed run moves the sampler there, so the iterator must be
    made again. The fit loop's data fetcher is the only handle on it.
    """
    fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
    if fetcher is not None:
        iter(fetcher)


def set_csv_columns(writer: Any, columns: List[str]) -> None:
    """Tell Lightning's CSV experiment writer which columns metrics.csv already has, so it appends
    to the rows raydra kept instead of rewriting the header. The writer has no public setter."""
    writer.metrics_keys = list(columns)


def csv_pending(writer: Any) -> Tuple[str, List[Dict[str, Any]], List[str], bool]:
    """What Lightning's CSV experiment writer holds for its next save: (metrics.csv's path, the rows
    logged since its last save, its columns before them, whether those rows bring new columns).
    The new rows' keys join the writer's columns (sorted), as its own save() does first. The
    writer's rows and columns have no public handle, and `_record_new_keys` is its own step."""
    before = list(writer.metrics_keys)
    new_keys = writer._record_new_keys()
    return writer.metrics_file_path, writer.metrics, before, bool(new_keys)


def csv_columns(writer: Any) -> List[str]:
    """The columns Lightning's CSV experiment writer writes metrics.csv under."""
    return list(writer.metrics_keys)


def csv_saved(writer: Any) -> None:
    """Tell Lightning's CSV experiment writer that its pending rows are on disk, as its save() ends."""
    writer.metrics = []


def epoch_end_logging_step(trainer: Any) -> int:
    """The step Lightning logs an epoch's end metrics at, read in on_train_epoch_end: its count of
    batches that stepped the optimizer, less the one its last batch added (the fit loop takes it off
    while it logs them, so that they share the step of the epoch's last batch and its validation).
    Not trainer.global_step, which counts optimizer steps: two a batch for a module with two
    optimizers under manual optimization. The count has no public handle."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped - 1


def tensorboard_default_hp_metric(logger: Any) -> bool:
    """Whether a TensorBoardLogger was built with `default_hp_metric=True`, which it keeps only in
    itself: False is how a user says they log `hp_metric` themselves (Lightning's own advice)."""
    return bool(logger._default_hp_metric)
