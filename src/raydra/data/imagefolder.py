"""A folder of images, one subfolder per class: `root/<class>/<image>`, or `root/{train,val,test}/<class>/<image>`.

Images are decoded once, resized to `image_size` and held as uint8 on each worker's device
(raydra.data.device_batches), which suits the small and medium sets researchers bring.
Without split subfolders, train/val/test come from a stratified split with a fixed seed.
"""

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from raydra.data.device_batches import FoundClassesDataModule, FoundSplits
from raydra.data.images import ImageInputs, settings, vit_processor
from raydra.data.splits import stratified_split
from raydra.errors import RaydraError

EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
SPLITS = ("train", "val", "test")


def scan(folder: Path) -> Dict[str, List[Path]]:
    """Class name -> its image files, for a folder of class subfolders."""
    classes = sorted(p for p in folder.iterdir() if p.is_dir())
    if not classes:
        raise RaydraError(f"{folder} has no class subfolders; lay images out as {folder}/<class>/<image>.")
    found = {}
    for class_dir in classes:
        images = sorted(p for p in class_dir.rglob("*") if p.suffix.lower() in EXTENSIONS)
        if not images:
            raise RaydraError(f"class folder {class_dir} holds no images ({', '.join(sorted(EXTENSIONS))}).")
        found[class_dir.name] = images
    return found


def decode(paths: Sequence[Path], size: int, channels: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    mode = {1: "L", 3: "RGB"}[channels]
    out = np.empty((len(paths), channels, size, size), dtype=np.uint8)
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as image:
                pixels = np.asarray(image.convert(mode).resize((size, size), Image.BILINEAR))
        except (UnidentifiedImageError, OSError) as error:
            raise RaydraError(f"{path} is not a readable image ({error}); remove or replace it.") from None
        out[i] = pixels.reshape(size, size, channels).transpose(2, 0, 1)
    return out


def find_splits(
    root: str, val_fraction: float, test_fraction: float, seed: int
) -> Tuple[List[str], Dict[str, Tuple[List[Path], np.ndarray]]]:
    """Class names and {split: (image paths, labels)}: from train/val/test subfolders, or a
    stratified seeded split of one folder of class subfolders."""
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise RaydraError(f"data.root={root} is not a folder; point it at <root>/<class>/<image> files.")
    if (folder / "train").is_dir():
        per_split = {name: scan(folder / name) for name in SPLITS if (folder / name).is_dir()}
        classes = sorted(per_split["train"])
        index = {name: i for i, name in enumerate(classes)}
        return classes, {
            split: ([p for c in sorted(found) for p in found[c]], np.array([index[c] for c in sorted(found) for _ in found[c]]))
            for split, found in per_split.items()
        }
    found = scan(folder)
    classes = sorted(found)
    paths = [p for name in classes for p in found[name]]
    labels = np.array([label for label, name in enumerate(classes) for _ in found[name]])
    cut = stratified_split(labels, {"val": val_fraction, "test": test_fraction}, seed, f"data.root={root}")
    return classes, {split: ([paths[i] for i in index], labels[index]) for split, index in cut.items() if len(index)}


def describe(root: str, **_: object) -> Dict[str, object]:
    """The class folders, for the driver to fill data.num_classes (and the model's) before resolving."""
    folder = Path(root).expanduser()
    classes = sorted(scan(folder / "train" if (folder / "train").is_dir() else folder)) if folder.is_dir() else []
    if not classes:
        raise RaydraError(f"data.root={root} is not a folder; point it at <root>/<class>/<image> files.")
    return {"num_classes": len(classes), "class_names": classes}


class ImageFolderDataModule(FoundClassesDataModule):
    def __init__(
        self,
        root: str,
        num_classes: int,
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
        class_names: Optional[List[str]] = None,
        # data.loader, which raydra reads (RunSpec.loader): how the run feeds this module, not the module's to act on.
        loader: Optional[str] = None,
    ) -> None:
        super().__init__()

    describe = staticmethod(describe)

    @classmethod
    def image_inputs(cls, data: Dict[str, Any]) -> ImageInputs:
        """The class folders' names, and the processor that decodes an image as `decode` does:
        converted to RGB (or given greyscale, with one channel), resized to image_size with PIL's
        bilinear filter, normalised by mean and std."""
        hp = settings(cls, data)
        return ImageInputs(hp["class_names"], vit_processor(hp["image_size"], hp["num_channels"], hp["mean"], hp["std"]))

    def decoded_splits(self) -> FoundSplits:
        hp = self.hparams
        classes, splits = find_splits(hp.root, hp.val_fraction, hp.test_fraction, hp.split_seed)
        decoded = ((split, decode(paths, hp.image_size, hp.num_channels), labels) for split, (paths, labels) in splits.items())
        return FoundSplits(classes, f"data.root={hp.root}", decoded, hp.mean[: hp.num_channels], hp.std[: hp.num_channels])

    @staticmethod
    def ray_datasets(data: Dict[str, Any]) -> Dict[str, Tuple[Any, int, Any]]:
        """data.loader=ray_data: {split: (ray.data.Dataset, rows, its Preprocess)}, the same split's
        files through read_images, for raydra.data.ray_data.build."""
        import ray.data

        from raydra.data.ray_data import preprocess

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
            parts[role] = (
                dataset,
                len(files),
                preprocess(data, role, "image", "label", size, data["mean"][:channels], data["std"][:channels], labels_by_path=by_path),
            )
        return parts
