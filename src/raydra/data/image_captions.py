"""A folder of images with captions, in Hugging Face's imagefolder convention:
`root/metadata.jsonl`, one JSON object per line with `file_name` (relative to root) and `text`.

Images are decoded once, resized (shorter side) and centre-cropped to `resolution`, and held as
uint8 on each worker's device (raydra.data.device_batches). A seeded `val_fraction` is held out.
"""

import json
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from raydra.data.device_batches import DeviceBatches, worker_placement
from raydra.errors import RaydraError
from raydra.lightning import pl


class CaptionedBatches:
    """DeviceBatches over (image, sample index) pairs, yielding {pixel_values in [-1, 1], index,
    indices, captions}: `index` the samples' indices on the device, `indices` the same as a list on
    the host (nothing in a step needs to wait for the device to read them).

    The indices let the model cache each training image's VAE latents and text embedding
    (model.cache_latents, model.cache_text)."""

    def __init__(
        self, images: torch.Tensor, captions: Sequence[str], batch_size: int, rank: int, world_size: int, train: bool, seed: int
    ) -> None:
        self.captions = list(captions)
        self.batches = DeviceBatches(
            images,
            torch.arange(len(self.captions), device=images.device),
            batch_size,
            rank,
            world_size,
            train=train,
            augment=False,
            seed=seed,
            mean=(0.5,) * images.shape[1],
            std=(0.5,) * images.shape[1],
            crop_padding=0,
            flip=False,
        )

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)

    def skip(self, batches: int) -> None:
        self.batches.skip(batches)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for pixels, index, indices in self.batches.with_indices():
            yield {"pixel_values": pixels, "index": index, "indices": indices, "captions": [self.captions[i] for i in indices]}


def split(count: int, val_fraction: float, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """Train and validation indices, sorted: a seeded split by scikit-learn (captions have no
    classes to stratify by), at least one validation sample."""
    from sklearn.model_selection import train_test_split

    train, val = train_test_split(np.arange(count), test_size=max(1, int(round(count * val_fraction))), random_state=seed)
    return np.sort(train), np.sort(val)


def read_metadata(root: Path, caption_column: str) -> Tuple[List[Path], List[str]]:
    path = root / "metadata.jsonl"
    if not path.is_file():
        raise RaydraError(
            f"{path} does not exist; write one JSON line per image, e.g. "
            '{"file_name": "0001.png", "text": "a red circle"} (Hugging Face imagefolder).'
        )
    files, captions = [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise RaydraError(f"{path} line {number} is not JSON; each line must be one object.") from None
        for key in ("file_name", caption_column):
            if key not in row:
                raise RaydraError(
                    f"{path} line {number} has no `{key}`; every line needs file_name and {caption_column}"
                    + ("" if key == "file_name" else " (or set data.caption_column to your caption key)")
                    + "."
                )
        image = root / row["file_name"]
        if not image.is_file():
            raise RaydraError(f"{path} line {number} names {image}, which does not exist.")
        files.append(image)
        captions.append(str(row[caption_column]))
    if len(files) < 2:
        raise RaydraError(f"{path} lists {len(files)} image(s); training and validation need at least 2.")
    return files, captions


def decode_square(paths: Sequence[Path], size: int) -> np.ndarray:
    """RGB uint8 (n, 3, size, size): shorter side resized to `size`, then centre-cropped."""
    from PIL import Image, UnidentifiedImageError

    out = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as image:
                image = image.convert("RGB")
                scale = size / min(image.size)
                w, h = max(size, round(image.width * scale)), max(size, round(image.height * scale))
                image = image.resize((w, h), Image.BICUBIC)
                left, top = (w - size) // 2, (h - size) // 2
                pixels = np.asarray(image.crop((left, top, left + size, top + size)))
        except (UnidentifiedImageError, OSError) as error:
            raise RaydraError(f"{path} is not a readable image ({error}); remove or replace it.") from None
        out[i] = pixels.transpose(2, 0, 1)
    return out


class ImageCaptionsDataModule(pl.LightningDataModule):
    """Captioned images on each worker's device as CaptionedBatches: "train" and "val".

    Where the images come from is `captioned_splits`: a folder with a metadata.jsonl here;
    data/shapes_captions.py makes them instead and shares the rest."""

    def __init__(
        self,
        root: str,
        resolution: int = 512,
        batch_size: int = 8,
        val_fraction: float = 0.05,
        split_seed: int = 0,
        caption_column: str = "text",
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.seed = split_seed  # shuffles the training batches
        self.loaders: Dict[str, CaptionedBatches] = {}
        self.train_captions: List[str] = []
        self.train_images: Optional[torch.Tensor] = None  # uint8 (n, 3, H, W), for fitting a VAE built from configs

    def captioned_splits(self) -> Iterator[Tuple[str, np.ndarray, List[str]]]:
        """(split, uint8 images (n, 3, resolution, resolution), their captions) for train and val."""
        hp = self.hparams
        root = Path(hp.root).expanduser()
        if not root.is_dir():
            raise RaydraError(f"data.root={hp.root} is not a folder; point it at images with a metadata.jsonl.")
        files, captions = read_metadata(root, hp.caption_column)
        train, val = split(len(files), hp.val_fraction, hp.split_seed)
        for name, index in (("train", train), ("val", val)):
            yield name, decode_square([files[i] for i in index], hp.resolution), [captions[i] for i in index]

    def setup(self, stage: Optional[str] = None) -> None:
        if self.loaders:
            return
        device, rank, world_size = worker_placement(self.trainer)
        for name, images, captions in self.captioned_splits():
            images = torch.from_numpy(images).to(device)
            if name == "train":
                self.train_captions, self.train_images = captions, images
            self.loaders[name] = CaptionedBatches(
                images, captions, self.hparams.batch_size // world_size, rank, world_size, train=name == "train", seed=self.seed
            )

    def train_dataloader(self) -> CaptionedBatches:
        return self.loaders["train"]

    def val_dataloader(self) -> CaptionedBatches:
        return self.loaders["val"]
