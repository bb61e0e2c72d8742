"""A Hugging Face image-classification dataset: a hub id (`beans`), a `save_to_disk` folder, a
parquet file or folder, or any local folder `datasets.load_dataset` reads.

Splits are taken from the dataset (train / validation / test by their usual names, or as
`splits` maps them); missing ones are made from train with a seeded stratified split. The label
column's ClassLabel names are the classes (a plain int or string column is encoded into one), so
num_classes and class names come from the data, not from the user. With a pretrained model its
image processor resizes the images and its mean/std normalise them; otherwise a plain resize to
`image_size` and `mean`/`std`. Decoded images are held as uint8 on each worker's device
(raydra.data.device_batches); `loader=ray_data` streams them through Ray Data instead.
"""

import contextlib
import os
import socket
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlparse

import numpy as np

from raydra.data.device_batches import FoundClassesDataModule, FoundSplits
from raydra.data.images import ImageInputs, first_line, image_processor, normalisation, processor_shape, settings, to_uint8, vit_processor
from raydra.data.splits import stratified_split
from raydra.errors import RaydraError
from raydra.private_apis.hugging_face import hub_offline

ROLES = ("train", "val", "test")
# The names datasets on the hub use for each role, first match wins.
SPLIT_NAMES = {"train": ("train",), "val": ("validation", "valid", "val", "dev"), "test": ("test",)}


def is_parquet(name: str) -> bool:
    path = Path(name).expanduser()
    return path.suffix == ".parquet" or (path.is_dir() and any(path.rglob("*.parquet")) and not (path / "dataset_dict.json").exists())


def parquet_files(name: str) -> List[str]:
    path = Path(name).expanduser()
    files = [str(path)] if path.is_file() else sorted(str(p) for p in path.rglob("*.parquet"))
    if not files:
        raise RaydraError(f"data.name={name} holds no parquet files; point it at a .parquet file or a folder of them.")
    return files


def _is_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


def _offline_env() -> Optional[str]:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return var
    return None


def _hub_reachable(timeout: float = 3.0) -> bool:
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load(name: str, subset: Optional[str] = None, revision: Optional[str] = None) -> Any:
    """A DatasetDict from a save_to_disk folder, parquet, a local folder or a hub id (cache only
    when offline). Errors name data.name and what to do."""
    import datasets

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    if _is_local(name):
        path = Path(name).expanduser()
        if not path.exists():
            raise RaydraError(f"data.name={name} does not exist; point it at a save_to_disk folder, parquet or a hub id.")
        try:
            if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
                loaded = datasets.load_from_disk(str(path))
            elif is_parquet(name):
                loaded = datasets.load_dataset("parquet", data_files=parquet_files(name))
            else:
                loaded = datasets.load_dataset(str(path), subset)
        except RaydraError:
            raise
        except Exception as error:
            raise RaydraError(
                f"data.name={name} could not be read as a dataset ({first_line(error)}); "
                "check the files are complete (a save_to_disk folder, parquet or an image folder)."
            ) from None
        return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({"train": loaded})
    offline = _offline_env() or (None if _hub_reachable() else "no route to the Hugging Face Hub")
    try:
        with hub_offline() if offline else contextlib.nullcontext():
            return datasets.load_dataset(name, subset, revision=revision)
    except (ConnectionError, FileNotFoundError) as error:
        if offline:
            raise RaydraError(
                f"data.name={name} is not in the local Hugging Face cache and this machine is offline ({offline}); "
                "load it once where there is network, or point data.name at a save_to_disk folder or parquet copy."
            ) from None
        raise RaydraError(
            f"data.name={name} could not be loaded from the Hugging Face Hub ({first_line(error)}); "
            "check the id (and data.subset), or point data.name at a local copy."
        ) from None


def _check_columns(name: str, dataset: Any, image_column: str, label_column: str) -> None:
    columns = list(dataset.column_names)
    for key, column in (("data.image_column", image_column), ("data.label_column", label_column)):
        if column not in columns:
            raise RaydraError(f"{key}={column} is not a column of {name} (columns: {', '.join(columns)}); set {key} to one of them.")


def splits(
    name: str,
    loaded: Any,
    image_column: str,
    label_column: str,
    split_names: Optional[Dict[str, str]],
    val_fraction: float,
    test_fraction: float,
    split_seed: int,
) -> Tuple[Dict[str, Any], List[str]]:
    """{role: Dataset} for train/val(/test) with a ClassLabel label column, and the class names.

    A role the dataset lacks is cut from train, stratified by class, with `split_seed`."""
    from datasets import ClassLabel

    chosen: Dict[str, str] = {}
    for role in ROLES:
        wanted = (split_names or {}).get(role)
        if wanted is not None:
            if wanted not in loaded:
                raise RaydraError(
                    f"data.splits.{role}={wanted} is not a split of {name} (splits: {', '.join(loaded)}); set it to one of them."
                )
            chosen[role] = wanted
        else:
            found = [s for s in SPLIT_NAMES[role] if s in loaded]
            if found:
                chosen[role] = found[0]
    if "train" not in chosen:
        raise RaydraError(f"{name} has no train split (splits: {', '.join(loaded)}); set data.splits.train to one of them.")
    parts = {role: loaded[split] for role, split in chosen.items()}
    for part in parts.values():
        _check_columns(name, part, image_column, label_column)
    feature = parts["train"].features[label_column]
    if not isinstance(feature, ClassLabel):
        # Plain ints or strings: one ClassLabel over every split's values, so ids agree across splits.
        values = sorted({v for part in parts.values() for v in part.unique(label_column)}, key=lambda v: (str(type(v)), v))
        feature = ClassLabel(names=[str(v) for v in values])
        parts = {
            role: part.map(lambda row: {label_column: values.index(row[label_column])}).cast_column(label_column, feature)
            for role, part in parts.items()
        }
    names = list(feature.names)
    missing = {role: fraction for role, fraction in (("val", val_fraction), ("test", test_fraction)) if role not in parts}
    cut = stratified_split(np.asarray(parts["train"][label_column]), missing, split_seed, f"data.name={name}")
    parts = {**parts, **{role: parts["train"].select(index) for role, index in cut.items()}}
    return parts, names


def parquet_classes(name: str, image_column: str, label_column: str) -> Tuple[List[str], Optional[list]]:
    """Class names of a parquet source, and the raw label values they stand for (None when the
    column is a ClassLabel, whose stored values already are class ids). Reads the schema and the
    label column only, so a large image table costs next to nothing here."""
    import json

    import pyarrow.parquet as pq

    files, schema = parquet_files(name), None
    try:
        schema = pq.read_schema(files[0])
        if label_column in schema.names:
            labels = pq.ParquetDataset(files).read(columns=[label_column]).column(label_column)
    except Exception as error:  # pyarrow raises ArrowInvalid, OSError or its own types for broken files
        raise RaydraError(
            f"data.name={name} is not readable parquet ({first_line(error)}); write it again (e.g. Dataset.to_parquet)."
        ) from None
    for key, column in (("data.image_column", image_column), ("data.label_column", label_column)):
        if column not in schema.names:
            raise RaydraError(f"{key}={column} is not a column of {name} (columns: {', '.join(schema.names)}); set {key} to one of them.")
    features = json.loads((schema.metadata or {}).get(b"huggingface", b"{}")).get("info", {}).get("features", {})
    label = features.get(label_column) or {}
    if label.get("_type") == "ClassLabel" and label.get("names"):
        return list(label["names"]), None
    values = sorted(set(labels.to_pylist()), key=lambda v: (str(type(v)), v))
    return [str(v) for v in values], values


def describe(
    name: str,
    subset: Optional[str] = None,
    revision: Optional[str] = None,
    label_column: str = "label",
    image_column: str = "image",
    **_: Any,
) -> Dict[str, Any]:
    """What the driver fills in before resolving the config: the class count and names, from the
    label column's ClassLabel feature (or the distinct values of a plain column)."""
    if _is_local(name) and Path(name).expanduser().exists() and is_parquet(name):
        names, _values = parquet_classes(name, image_column, label_column)
        return {"num_classes": len(names), "class_names": names}
    loaded = load(name, subset, revision)
    train = loaded["train"] if "train" in loaded else next(iter(loaded.values()))
    _check_columns(name, train, image_column, label_column)
    from datasets import ClassLabel

    feature = train.features[label_column]
    if isinstance(feature, ClassLabel):
        names = list(feature.names)
    else:
        names = [
            str(v) for v in sorted({v for part in loaded.values() for v in part.unique(label_column)}, key=lambda v: (str(type(v)), v))
        ]
    return {"num_classes": len(names), "class_names": names}


def decode_split(
    part: Any, image_column: str, label_column: str, processor: Any, size: int, channels: int, where: str, chunk: int = 256
) -> Tuple[np.ndarray, np.ndarray]:
    images, labels = [], np.asarray(part[label_column], dtype=np.int64)
    for start in range(0, len(part), chunk):
        rows = part.select(range(start, min(start + chunk, len(part))))
        try:
            column = rows[image_column]
        except Exception as error:
            raise RaydraError(f"{where} holds an image that does not decode ({first_line(error)}); remove or replace it.") from None
        images.append(to_uint8(column, processor, size, channels, where))
    return np.concatenate(images), labels


class HFImageDataModule(FoundClassesDataModule):
    def __init__(
        self,
        name: str,
        num_classes: int,
        subset: Optional[str] = None,
        revision: Optional[str] = None,
        image_column: str = "image",
        label_column: str = "label",
        splits: Optional[Dict[str, str]] = None,
        class_names: Optional[List[str]] = None,
        processor: Optional[str] = None,
        image_size: int = 224,
        num_channels: int = 3,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 0,
        augment: bool = True,
        flip: bool = True,
        crop_padding: int = 0,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        # data.loader, which raydra reads (RunSpec.loader): how the run feeds this module, not the module's to act on.
        loader: Optional[str] = None,
    ) -> None:
        super().__init__()

    describe = staticmethod(describe)

    @classmethod
    def image_inputs(cls, data: Dict[str, Any]) -> ImageInputs:
        """The label column's class names, and the processor that prepares an image as setup does:
        the pretrained model's own (data.processor: its resize and crop, then rescaled and normalised
        as `normalisation` says), or a plain bilinear resize to image_size and mean and std."""
        hp = settings(cls, data)
        channels = hp["num_channels"]
        processor = image_processor(hp["processor"])
        if processor is None:
            return ImageInputs(hp["class_names"], vit_processor(hp["image_size"], channels, hp["mean"], hp["std"]))
        mean, std = normalisation(processor, hp["mean"], hp["std"], channels)
        return ImageInputs(
            hp["class_names"],
            {
                **processor.to_dict(),
                "do_convert_rgb": channels == 3,
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": mean,
                "image_std": std,
            },
        )

    def decoded_splits(self) -> FoundSplits:
        hp = self.hparams
        parts, classes = splits(
            hp.name,
            load(hp.name, hp.subset, hp.revision),
            hp.image_column,
            hp.label_column,
            hp.splits,
            hp.val_fraction,
            hp.test_fraction,
            hp.split_seed,
        )
        processor = image_processor(hp.processor)
        mean, std = normalisation(processor, hp.mean, hp.std, hp.num_channels)
        decoded = (
            (
                role,
                *decode_split(
                    part, hp.image_column, hp.label_column, processor, hp.image_size, hp.num_channels, f"data.name={hp.name} ({role})"
                ),
            )
            for role, part in parts.items()
        )
        return FoundSplits(classes, f"data.name={hp.name} (column {hp.label_column})", decoded, mean, std)

    @staticmethod
    def ray_datasets(data: Dict[str, Any]) -> Dict[str, Tuple[Any, int, Any]]:
        """data.loader=ray_data: {split: (ray.data.Dataset, rows, its Preprocess)}, for
        raydra.data.ray_data.build: from_huggingface over the same splits as setup, or
        read_parquet for a parquet source."""
        import ray.data

        from raydra.data.ray_data import preprocess

        processor = image_processor(data.get("processor"))
        mean, std = normalisation(processor, data["mean"], data["std"], data["num_channels"])
        size = processor_shape(processor, data["image_size"])[0]
        common = dict(
            image_column=data["image_column"],
            label_column=data["label_column"],
            size=size,
            mean=mean,
            std=std,
            processor=data.get("processor"),
        )
        name = data["name"]
        if Path(name).expanduser().exists() and is_parquet(name):
            return _ray_parquet(data, common)
        parts, _ = splits(
            name,
            load(name, data.get("subset"), data.get("revision")),
            data["image_column"],
            data["label_column"],
            data.get("splits"),
            data["val_fraction"],
            data["test_fraction"],
            data["split_seed"],
        )
        out = {}
        for role, part in parts.items():
            if role == "train":
                part = part.shuffle(seed=data["split_seed"])
            keep = part.select_columns([data["image_column"], data["label_column"]]).flatten_indices()
            dataset = ray.data.from_huggingface(keep)
            out[role] = (dataset.randomize_block_order() if role == "train" else dataset, len(keep), preprocess(data, role, **common))
        return out


def _ray_parquet(data: Dict[str, Any], common: Dict[str, Any]) -> Dict[str, Tuple[Any, int, Any]]:
    """read_parquet for every split. Parquet has no split names here, so val/test are cut by row:
    a stratified seeded split over each row's deterministic hash (file path + position), chosen
    from the label column alone before any image is read."""
    import ray.data

    from raydra.data.ray_data import preprocess

    name, label_column = data["name"], data["label_column"]
    _, values = parquet_classes(name, data["image_column"], label_column)
    files = parquet_files(name)
    try:
        index = ray.data.read_parquet(files, columns=[label_column], include_row_hash=True).to_pandas()
    except Exception as error:
        raise RaydraError(f"data.name={name} is not readable parquet ({first_line(error)}); write it again.") from None
    lookup = {v: i for i, v in enumerate(values)} if values is not None else None
    labels = np.asarray([lookup[v] for v in index[label_column]] if lookup else index[label_column], dtype=np.int64)
    hashes = index["row_hash"].to_numpy()
    cut = stratified_split(labels, {"val": data["val_fraction"], "test": data["test_fraction"]}, data["split_seed"], f"data.name={name}")
    held = {role: hashes[index] for role, index in cut.items() if role != "train"}
    dropped = np.concatenate(list(held.values())) if held else np.empty(0, dtype=hashes.dtype)
    parts = {}
    for role in ("train", *held):
        dataset = ray.data.read_parquet(files, include_row_hash=True)
        extra = dict(label_values=values, **({"drop_hashes": dropped} if role == "train" else {"keep_hashes": held[role]}))
        if role == "train":
            dataset = dataset.randomize_block_order()
        parts[role] = (dataset, len(cut[role]), preprocess(data, role, **common, **extra))
    return parts
