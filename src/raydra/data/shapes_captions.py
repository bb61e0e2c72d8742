"""Captioned synthetic images made on the spot: a coloured shape on a plain background, captioned
"a red circle on a blue background", so a tiny text-to-image model has something learnable and a
sample grid shows at a glance whether it follows the prompt.
"""

from typing import Iterator, List, Tuple

import numpy as np

from raydra.data.image_captions import ImageCaptionsDataModule

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 30),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
}
SHAPES = ("circle", "square", "triangle")


def draw(shape: str, colour: str, background: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One (3, size, size) uint8 image: the shape at a random place and scale."""
    radius = size * rng.uniform(0.22, 0.34)
    cy, cx = rng.uniform(radius, size - radius, 2)
    y, x = np.mgrid[0:size, 0:size] + 0.5
    if shape == "circle":
        mask = (y - cy) ** 2 + (x - cx) ** 2 <= radius**2
    elif shape == "square":
        mask = (np.abs(y - cy) <= radius * 0.85) & (np.abs(x - cx) <= radius * 0.85)
    else:  # apex up: inside when below the apex and within the widening sides
        top, bottom = cy - radius, cy + radius * 0.8
        half_width = (y - top) / (bottom - top) * radius
        mask = (y >= top) & (y <= bottom) & (np.abs(x - cx) <= half_width)
    image = np.empty((size, size, 3), dtype=np.uint8)
    image[:] = COLOURS[background]
    image[mask] = COLOURS[colour]
    return image.transpose(2, 0, 1)


def make(count: int, size: int, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    images, captions = np.empty((count, 3, size, size), dtype=np.uint8), []
    for i in range(count):
        shape = SHAPES[rng.integers(len(SHAPES))]
        colour, background = rng.choice(names, 2, replace=False)
        images[i] = draw(shape, colour, background, size, rng)
        captions.append(f"a {colour} {shape} on a {background} background")
    return images, captions


class ShapesCaptionsDataModule(ImageCaptionsDataModule):
    """ImageCaptionsDataModule over shapes made on the spot instead of a folder: only the data differs."""

    def __init__(self, num_samples: int = 2048, val_samples: int = 64, resolution: int = 32, batch_size: int = 16, seed: int = 0) -> None:
        super().__init__(root="", resolution=resolution, batch_size=batch_size, split_seed=seed)
        # The folder's settings mean nothing here; Lightning drops what a subclass ignores.
        self.save_hyperparameters(ignore=["root", "val_fraction", "split_seed", "caption_column"])

    def captioned_splits(self) -> Iterator[Tuple[str, np.ndarray, List[str]]]:
        hp = self.hparams
        for name, count, seed in (("train", hp.num_samples, hp.seed), ("val", hp.val_samples, hp.seed + 1)):
            yield (name, *make(count, hp.resolution, seed))
