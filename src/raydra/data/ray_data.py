"""`data.loader=ray_data`: the same data as a Ray Data stream instead of per-worker loading.

The driver builds one `ray.data.Dataset` per split (`build`): CIFAR-10 arrays, image-folder files
through `read_images`, a Hugging Face dataset through `from_huggingface`, parquet through
`read_parquet`. Decoding, resizing, normalisation and training augmentation run as `map_batches`
tasks on Ray's CPUs, apart from the training workers; TorchTrainer gets the datasets through
`datasets=` and splits each one over the workers (`streaming_split(equal=True)`).

Each worker's `RayDataModule` hands Lightning one `ShardBatches` per split: an iterable over
`get_dataset_shard(split).iter_torch_batches(...)` that knows its length from the split's row
count, which the driver counted, because Lightning needs a length to place validation and to
size schedulers, and Ray's iterators have none. Validation shards are split too, so the run keeps
`trainer.num_sanity_val_steps=0`: a sanity pass that reads only part of a split shard leaves
Ray's split coordinator waiting for the rest (schema.validate refuses it).
"""

import math
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np
import torch

from raydra.data.device_batches import crop_flip
from raydra.errors import RaydraError
from raydra.lightning import pl

ROLES = ("train", "val", "test")
# Rows a worker shuffles among before batching (Ray's local shuffle): cheap, no all-to-all.
SHUFFLE_BUFFER_BATCHES = 8
_PROCESSORS: Dict[str, Any] = {}


class Preprocess:
    """A map_batches function: any image column (decoded arrays, encoded bytes, {bytes, path}
    structs, file paths) -> {"image": float32 (n, C, H, W) normalised, "label": int64}."""

    def __init__(self, image_column: str, label_column: str, size: int, channels: int, mean: Sequence[float],
                 std: Sequence[float], processor: Optional[str] = None, augment: bool = False,
                 crop_padding: int = 0, flip: bool = False, label_values: Optional[list] = None,
                 keep_hashes: Optional[np.ndarray] = None, drop_hashes: Optional[np.ndarray] = None,
                 labels_by_path: Optional[Dict[str, int]] = None) -> None:
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
        from raydra.data.hf import to_uint8

        return to_uint8(list(column), self._processor(), self.size, self.channels, "a Ray Data batch")

    def _processor(self) -> Any:
        if self.processor is None:
            return None
        if self.processor not in _PROCESSORS:  # once per Ray Data worker process, not per batch
            from raydra.data.hf import image_processor

            _PROCESSORS[self.processor] = image_processor(self.processor)
        return _PROCESSORS[self.processor]


def build(config: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """{split: ray.data.Dataset} for TorchTrainer's `datasets=`, and each split's row count."""
    import logging

    import ray.data

    data = config["data"]
    if not config.get("verbose"):
        # Ray Data logs every execution's plan and progress to the console; raydra keeps it quiet
        # (its SplitCoordinator still writes them to logs/ray.log).
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        ray.data.DataContext.get_current().enable_progress_bars = False
    target = data["_target_"].rsplit(".", 1)[-1]
    if target == "CIFAR10DataModule":
        parts = _cifar10(data)
    elif target == "ImageFolderDataModule":
        parts = _imagefolder(data)
    elif target == "HFImageDataModule":
        parts = _hf(data)
    else:
        raise RaydraError(f"data.loader=ray_data is not available for {data['_target_']}; use data=cifar10, "
                          "imagefolder or hf, or data.loader=dataloader.")
    datasets, rows = {}, {}
    for role, (dataset, count, preprocess) in parts.items():
        if count == 0:
            continue
        datasets[role] = dataset.map_batches(preprocess, batch_format="numpy", zero_copy_batch=False)
        rows[role] = count
    if "train" not in rows:
        raise RaydraError("the training split is empty; add data or lower data.val_fraction and data.test_fraction.")
    return datasets, rows


def _preprocess(data: Dict[str, Any], role: str, image_column: str, label_column: str, size: int,
                mean: Sequence[float], std: Sequence[float], processor: Optional[str] = None, **extra: Any) -> Preprocess:
    train = role == "train"
    return Preprocess(image_column, label_column, size, data["num_channels"], mean, std, processor=processor,
                      augment=train and data.get("augment", False), crop_padding=data.get("crop_padding", 0),
                      flip=data.get("flip", False), **extra)


def _cifar10(data: Dict[str, Any]) -> Dict[str, Tuple[Any, int, Preprocess]]:

    from raydra.data.cifar10 import TEST_FILE, TRAIN_FILES, locate, read_batches
    from raydra.data.splits import stratified_split

    folder = locate(data["root"], data["download"])
    train_x, train_y = read_batches(folder, TRAIN_FILES)
    test_x, test_y = read_batches(folder, [TEST_FILE])
    cut = stratified_split(train_y, {"val": data["val_fraction"]}, data["split_seed"], f"data.root={data['root']}")
    parts = {}
    for role, x, y in (*((role, train_x[index], train_y[index]) for role, index in cut.items()), ("test", test_x, test_y)):
        # Seeded shuffle once, so Ray's blocks are not one class after another; the local
        # shuffle buffer and a random block order then vary it per epoch.
        order = np.random.default_rng(data["split_seed"]).permutation(len(y)) if role == "train" else np.arange(len(y))
        dataset = _from_arrays(x[order], y[order])
        if role == "train":
            dataset = dataset.randomize_block_order()
        parts[role] = (dataset, len(y), _preprocess(data, role, "image", "label", 32, data["mean"], data["std"]))
    return parts


def _from_arrays(images: np.ndarray, labels: np.ndarray, block_rows: int = 2048) -> Any:
    import pyarrow as pa
    import ray.data
    from ray.data.extensions import ArrowTensorArray

    tables = [pa.table({"image": ArrowTensorArray.from_numpy(images[i:i + block_rows]),
                        "label": pa.array(labels[i:i + block_rows])}) for i in range(0, max(len(labels), 1), block_rows)]
    return ray.data.from_arrow(tables)


def _imagefolder(data: Dict[str, Any]) -> Dict[str, Tuple[Any, int, Preprocess]]:
    import ray.data

    from raydra.data.imagefolder import find_splits

    _, splits = find_splits(data["root"], data["val_fraction"], data["test_fraction"], data["split_seed"])
    size, channels = data["image_size"], data["num_channels"]
    parts = {}
    for role, (paths, labels) in splits.items():
        order = np.random.default_rng(data["split_seed"]).permutation(len(paths)) if role == "train" else np.arange(len(paths))
        files = [str(Path(paths[i]).resolve()) for i in order]
        dataset = ray.data.read_images(files, size=(size, size), mode={1: "L", 3: "RGB"}[channels], include_paths=True)
        if role == "train":
            dataset = dataset.randomize_block_order()
        by_path = {str(Path(p).resolve()): int(label) for p, label in zip(paths, labels)}
        parts[role] = (dataset, len(files), _preprocess(data, role, "image", "label", size, data["mean"][:channels],
                                                         data["std"][:channels], labels_by_path=by_path))
    return parts


def _hf(data: Dict[str, Any]) -> Dict[str, Tuple[Any, int, Preprocess]]:
    import ray.data

    from raydra.data import hf

    processor = hf.image_processor(data.get("processor"))
    mean, std = hf.normalisation(processor, data["mean"], data["std"], data["num_channels"])
    size = hf.processor_shape(processor, data["image_size"])[0]
    common = dict(image_column=data["image_column"], label_column=data["label_column"], size=size, mean=mean, std=std,
                  processor=data.get("processor"))
    name = data["name"]
    if Path(name).expanduser().exists() and hf.is_parquet(name):
        return _parquet(data, common)
    parts, _ = hf.splits(name, hf.load(name, data.get("subset"), data.get("revision")), data["image_column"],
                         data["label_column"], data.get("splits"), data["val_fraction"], data["test_fraction"],
                         data["split_seed"])
    out = {}
    for role, part in parts.items():
        if role == "train":
            part = part.shuffle(seed=data["split_seed"])
        keep = part.select_columns([data["image_column"], data["label_column"]]).flatten_indices()
        dataset = ray.data.from_huggingface(keep)
        out[role] = (dataset.randomize_block_order() if role == "train" else dataset, len(keep),
                     _preprocess(data, role, **common))
    return out


def _parquet(data: Dict[str, Any], common: Dict[str, Any]) -> Dict[str, Tuple[Any, int, Preprocess]]:
    """read_parquet for every split. Parquet has no split names here, so val/test are cut by row:
    a stratified seeded split over each row's deterministic hash (file path + position), chosen
    from the label column alone before any image is read."""
    import ray.data

    from raydra.data import hf
    from raydra.data.splits import stratified_split

    name, label_column = data["name"], data["label_column"]
    _, values = hf.parquet_classes(name, data["image_column"], label_column)
    files = hf.parquet_files(name)
    try:
        index = ray.data.read_parquet(files, columns=[label_column], include_row_hash=True).to_pandas()
    except Exception as error:
        raise RaydraError(f"data.name={name} is not readable parquet ({hf._first_line(error)}); write it again.") from None
    lookup = {v: i for i, v in enumerate(values)} if values is not None else None
    labels = np.asarray([lookup[v] for v in index[label_column]] if lookup else index[label_column], dtype=np.int64)
    hashes = index["row_hash"].to_numpy()
    cut = stratified_split(labels, {"val": data["val_fraction"], "test": data["test_fraction"]}, data["split_seed"],
                           f"data.name={name}")
    held = {role: hashes[index] for role, index in cut.items() if role != "train"}
    dropped = np.concatenate(list(held.values())) if held else np.empty(0, dtype=hashes.dtype)
    parts = {}
    for role in ("train", *held):
        dataset = ray.data.read_parquet(files, include_row_hash=True)
        extra = dict(label_values=values, **({"drop_hashes": dropped} if role == "train" else {"keep_hashes": held[role]}))
        if role == "train":
            dataset = dataset.randomize_block_order()
        count = len(cut[role])
        parts[role] = (dataset, count, _preprocess(data, role, **common, **extra))
    return parts


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
            batch_size=self.batch_size, drop_last=self.train,
            # Page-locked host batches copy to a GPU asynchronously.
            pin_memory=ray.train.torch.get_device().type == "cuda",
            local_shuffle_buffer_size=self.batch_size * SHUFFLE_BUFFER_BATCHES if self.train else None,
            local_shuffle_seed=self.seed + self.epoch if self.train else None,
        )
        for batch in batches:
            yield batch["image"], batch["label"]


class RayDataModule(pl.LightningDataModule):
    """What every worker trains from under data.loader=ray_data: the driver's datasets, sharded."""

    def __init__(self, rows: Dict[str, int], batch_size: int, world_size: int, seed: int = 0) -> None:
        super().__init__()
        per_worker = batch_size // world_size
        self.loaders = {role: ShardBatches(role, count, per_worker, world_size, train=role == "train", seed=seed)
                        for role, count in rows.items()}

    def train_dataloader(self) -> ShardBatches:
        return self.loaders["train"]

    # By key, not `or`: a loader with no batches is falsy.
    def val_dataloader(self) -> ShardBatches:
        return self.loaders["val" if "val" in self.loaders else "test"]

    def test_dataloader(self) -> ShardBatches:
        return self.loaders["test" if "test" in self.loaders else "val"]
