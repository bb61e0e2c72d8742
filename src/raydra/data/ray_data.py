"""`data.loader=ray_data`: the same data as a Ray Data stream instead of per-worker loading.

The driver builds one `ray.data.Dataset` per split (`build`), as the data module's class says in
its `ray_datasets` staticmethod: CIFAR-10 arrays, image-folder files through `read_images`, a
Hugging Face dataset through `from_huggingface`, parquet through `read_parquet`. Decoding,
resizing, normalisation and training augmentation run as `map_batches` tasks on Ray's CPUs, apart
from the training workers; TorchTrainer gets the datasets through `datasets=` and splits each one
over the workers (`streaming_split(equal=True)`).

Each worker's `RayDataModule` hands Lightning one `ShardBatches` per split: an iterable over
`get_dataset_shard(split).iter_torch_batches(...)` that knows its length from the split's row
count, which the driver counted, because Lightning needs a length to place validation and to
size schedulers, and Ray's iterators have none. Validation shards are split too, so the run keeps
`trainer.num_sanity_val_steps=0`: a sanity pass that reads only part of a split shard leaves
Ray's split coordinator waiting for the rest (schema.validate refuses it).
"""

import math
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np
import torch

from raydra.data.device_batches import DeviceSplitsDataModule, crop_flip
from raydra.data.images import image_processor, to_uint8
from raydra.errors import RaydraError

ROLES = ("train", "val", "test")
# Rows a worker shuffles among before batching (Ray's local shuffle): cheap, no all-to-all.
SHUFFLE_BUFFER_BATCHES = 8
_PROCESSORS: Dict[str, Any] = {}


class Preprocess:
    """A map_batches function: any image column (decoded arrays, encoded bytes, {bytes, path}
    structs, file paths) -> {"image": float32 (n, C, H, W) normalised, "label": int64}."""

    def __init__(
        self,
        image_column: str,
        label_column: str,
        size: int,
        channels: int,
        mean: Sequence[float],
        std: Sequence[float],
        processor: Optional[str] = None,
        augment: bool = False,
        crop_padding: int = 0,
        flip: bool = False,
        label_values: Optional[list] = None,
        keep_hashes: Optional[np.ndarray] = None,
        drop_hashes: Optional[np.ndarray] = None,
        labels_by_path: Optional[Dict[str, int]] = None,
    ) -> None:
        self.image_column, self.label_column = image_column, label_column
        self.size, self.channels, self.processor = size, channels, processor
        self.mean = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1) * 255
        self.std = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1) * 255
        self.augment, self.crop_padding, self.flip = augment, crop_padding, flip
        self.label_lookup = None if label_values is None else {v: i for i, v in enumerate(label_values)}
        self.keep_hashes, self.drop_hashes = keep_hashes, drop_hashes
        self.labels_by_path = labels_by_path

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        if self.keep_hashes is not None or self.drop_hashes is not None:
            hashes = batch["row_hash"]
            keep = np.isin(hashes, self.keep_hashes) if self.keep_hashes is not None else ~np.isin(hashes, self.drop_hashes)
            batch = {key: value[keep] for key, value in batch.items()}
        if self.labels_by_path is not None:
            labels = np.asarray([self.labels_by_path[p] for p in batch["path"]], dtype=np.int64)
        elif self.label_lookup is not None:
            labels = np.asarray([self.label_lookup[v] for v in batch[self.label_column].tolist()], dtype=np.int64)
        else:
            labels = np.asarray(batch[self.label_column], dtype=np.int64)
        images = self._uint8(batch[self.image_column]).astype(np.float32)
        if self.augment:
            # A fresh, randomly seeded generator per batch: Ray Data runs batches in any order on any
            # process, so there is no stream of draws to continue.
            generator = torch.Generator()
            generator.seed()
            images = crop_flip(torch.from_numpy(images), self.crop_padding, self.flip, generator).numpy()
        return {"image": (images - self.mean) / self.std, "label": labels}

    def _uint8(self, column: Any) -> np.ndarray:
        if isinstance(column, np.ndarray) and column.dtype == np.uint8 and column.ndim == 4:
            if column.shape[-1] == self.channels and column.shape[1] != self.channels:
                column = column.transpose(0, 3, 1, 2)  # read_images gives HWC
            if column.shape[2:] == (self.size, self.size) and self.processor is None:
                return column
        return to_uint8(list(column), self._processor(), self.size, self.channels, "a Ray Data batch")

    def _processor(self) -> Any:
        if self.processor is None:
            return None
        if self.processor not in _PROCESSORS:  # once per Ray Data worker process, not per batch
            _PROCESSORS[self.processor] = image_processor(self.processor)
        return _PROCESSORS[self.processor]


def build(data: Dict[str, Any], verbose: bool) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """{split: ray.data.Dataset} for TorchTrainer's `datasets=`, and each split's row count, from the
    run's data config (RunSpec.data). `verbose`: Ray Data's own progress reaches the console."""
    import logging

    import ray.data
    from hydra.utils import get_class

    if not verbose:
        # Ray Data logs every execution's plan and progress to the console; raydra keeps it quiet
        # (its SplitCoordinator still writes them to logs/ray.log).
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        ray.data.DataContext.get_current().enable_progress_bars = False
    # The data module's class says how its data becomes Ray Data datasets (its ray_datasets), as it
    # says how it loads otherwise; nothing here knows the modules.
    ray_datasets = getattr(get_class(data["_target_"]), "ray_datasets", None)
    if ray_datasets is None:
        raise RaydraError(
            f"data.loader=ray_data needs {data['_target_']} to build Ray Data datasets (a ray_datasets "
            "staticmethod, as data=cifar10, imagefolder and hf have); set data.loader=dataloader or add one."
        )
    parts = ray_datasets(data)
    datasets, rows = {}, {}
    for role, (dataset, count, prepare) in parts.items():
        if count == 0:
            continue
        datasets[role] = dataset.map_batches(prepare, batch_format="numpy", zero_copy_batch=False)
        rows[role] = count
    if "train" not in rows:
        raise RaydraError("the training split is empty; add data or lower data.val_fraction and data.test_fraction.")
    return datasets, rows


def preprocess(
    data: Dict[str, Any],
    role: str,
    image_column: str,
    label_column: str,
    size: int,
    mean: Sequence[float],
    std: Sequence[float],
    processor: Optional[str] = None,
    **extra: Any,
) -> Preprocess:
    """The Preprocess for one split of `data` (the data config): only "train" is augmented."""
    train = role == "train"
    return Preprocess(
        image_column,
        label_column,
        size,
        data["num_channels"],
        mean,
        std,
        processor=processor,
        augment=train and data.get("augment", False),
        crop_padding=data.get("crop_padding", 0),
        flip=data.get("flip", False),
        **extra,
    )


def from_arrays(images: np.ndarray, labels: np.ndarray, block_rows: int = 2048) -> Any:
    """A ray.data.Dataset of in-memory images and labels, in blocks of `block_rows` rows."""
    import pyarrow as pa
    import ray.data
    from ray.data.extensions import ArrowTensorArray

    tables = [
        pa.table({"image": ArrowTensorArray.from_numpy(images[i : i + block_rows]), "label": pa.array(labels[i : i + block_rows])})
        for i in range(0, max(len(labels), 1), block_rows)
    ]
    return ray.data.from_arrow(tables)


class ShardBatches:
    """This worker's shard of one split as Lightning batches (images, labels) on its device.

    `rows` is the split's row count; streaming_split(equal=True) gives every worker rows //
    world_size of them, so the batch count is known before the first batch arrives."""

    def __init__(self, split: str, rows: int, batch_size: int, world_size: int, train: bool, seed: int) -> None:
        self.split, self.batch_size, self.train, self.seed = split, batch_size, train, seed
        self.per_worker = rows // world_size
        self.epoch = 0

    def __len__(self) -> int:
        if self.train:  # drop_last: every worker takes the same number of optimizer steps
            return self.per_worker // self.batch_size
        return math.ceil(self.per_worker / self.batch_size)

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        import ray.train
        import ray.train.torch

        shard = ray.train.get_dataset_shard(self.split)
        self.epoch += 1
        batches = shard.iter_torch_batches(
            batch_size=self.batch_size,
            drop_last=self.train,
            # Page-locked host batches copy to a GPU asynchronously.
            pin_memory=ray.train.torch.get_device().type == "cuda",
            local_shuffle_buffer_size=self.batch_size * SHUFFLE_BUFFER_BATCHES if self.train else None,
            local_shuffle_seed=self.seed + self.epoch if self.train else None,
        )
        for batch in batches:
            yield batch["image"], batch["label"]


class RayDataModule(DeviceSplitsDataModule):
    """What every worker trains from under data.loader=ray_data: the driver's datasets, sharded.
    Splits are what the driver built (`rows`): one it left out is not there, as under setup."""

    def __init__(self, rows: Dict[str, int], batch_size: int, world_size: int, seed: int = 0) -> None:
        super().__init__()
        per_worker = batch_size // world_size
        # As place_splits: a split with fewer rows than workers would leave some workers without a batch.
        self.loaders = {
            role: ShardBatches(role, count, per_worker, world_size, train=role == "train", seed=seed)
            for role, count in rows.items()
            if count >= world_size
        }
