"""scikit-learn's handwritten digits as a LightningDataModule: real data that ships with the package."""

from typing import Any, Dict, Optional

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from raydra.data.images import ImageInputs, vit_processor
from raydra.data.splits import stratified_split
from raydra.errors import RaydraError
from raydra.lightning import pl


class DigitsDataModule(pl.LightningDataModule):
    """1,797 8x8 greyscale images of 0-9, split train/val/test stratified by class.

    `batch_size` is the global batch; each worker loads batch_size / world_size. The whole set is
    a few hundred KB, so it is held as tensors and no loader processes are started by default.
    """

    def __init__(
        self,
        batch_size: int = 32,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        num_workers: int = 0,
        image_size: int = 8,
        num_channels: int = 1,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.splits: dict = {}

    def setup(self, stage: Optional[str] = None) -> None:
        if self.splits:
            return
        world_size = self.trainer.world_size if self.trainer else 1
        self.batch_size_per_worker = self.hparams.batch_size // world_size
        images, labels = load_digits(return_X_y=True)
        # Pixel values are 0..16; centre them so the patch embedding starts well conditioned.
        images = ((images / 16.0 - 0.5) / 0.5).astype(np.float32).reshape(-1, 1, 8, 8)
        hp = self.hparams
        cut = stratified_split(labels, {"val": hp.val_fraction, "test": hp.test_fraction}, hp.split_seed, "data=digits")
        for name, index in cut.items():
            self.splits[name] = TensorDataset(torch.from_numpy(images[index]), torch.from_numpy(labels[index]).long())

    @staticmethod
    def image_inputs(data: Dict[str, Any]) -> ImageInputs:
        """The digits' names, and the processor for the images as scikit-learn holds them
        (`load_digits().images`: 8x8 values 0..16, one channel first): scaled and centred as
        setup does, never resized."""
        return ImageInputs([str(digit) for digit in range(10)], vit_processor(8, 1, [0.5], [0.5], rescale=1 / 16, resize=False))

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size_per_worker,
            shuffle=shuffle,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
            pin_memory=self.trainer is not None and self.trainer.strategy.root_device.type == "cuda",
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    @property
    def has_test_split(self) -> bool:
        """False with data.test_fraction=0; raydra's worker loop then runs no test."""
        return "test" in self.splits

    def test_dataloader(self) -> DataLoader:
        if not self.has_test_split:
            raise RaydraError("data=digits has no test split with data.test_fraction=0; raise it or set trainer.test=false.")
        return self._loader("test", shuffle=False)
