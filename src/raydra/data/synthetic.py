"""Random images of any shape, made on the spot: for benchmarks, smoke tests and sizing a cluster.

Each class blends its own fixed pattern into uniform noise, so a model can learn something and a
falling loss means the pipeline works end to end. Batches come from the worker's device, like a
real in-memory dataset (raydra.data.device_batches).
"""

from typing import Any, Dict, Optional, Tuple

import torch

from raydra.data.device_batches import DeviceBatches, place_splits
from raydra.data.images import ImageInputs, settings, vit_processor
from raydra.lightning import pl


class SyntheticImagesDataModule(pl.LightningDataModule):
    def __init__(
        self,
        num_samples: int = 50_000,
        val_samples: int = 10_000,
        image_size: int = 32,
        num_channels: int = 3,
        num_classes: int = 10,
        batch_size: int = 512,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.loaders: dict = {}

    def setup(self, stage: Optional[str] = None) -> None:
        if self.loaders:
            return
        hp = self.hparams
        generator = torch.Generator().manual_seed(hp.seed)
        shape = (hp.num_channels, hp.image_size, hp.image_size)
        patterns = torch.randint(0, 256, (hp.num_classes, *shape), generator=generator)

        def made(count: int) -> Tuple[torch.Tensor, torch.Tensor]:
            labels = torch.randint(0, hp.num_classes, (count,), generator=generator)
            noise = torch.randint(0, 256, (count, *shape), generator=generator)
            return ((noise + patterns[labels]) // 2).to(torch.uint8), labels

        self.loaders = place_splits(
            self.trainer,
            [("train", *made(hp.num_samples)), ("val", *made(hp.val_samples))],
            hp.batch_size,
            hp.seed,
            augment=False,
            mean=(0.5,) * hp.num_channels,
            std=(0.25,) * hp.num_channels,
            crop_padding=0,
            flip=False,
        )

    @classmethod
    def image_inputs(cls, data: Dict[str, Any]) -> ImageInputs:
        """No class names (the classes are patterns), and the processor that normalises a uint8
        image as setup does (mean 0.5, std 0.25), never resized."""
        hp = settings(cls, data)
        channels = hp["num_channels"]
        return ImageInputs(None, vit_processor(hp["image_size"], channels, (0.5,) * channels, (0.25,) * channels, resize=False))

    def train_dataloader(self) -> DeviceBatches:
        return self.loaders["train"]

    def val_dataloader(self) -> DeviceBatches:
        return self.loaders["val"]
