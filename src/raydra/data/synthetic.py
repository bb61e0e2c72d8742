"""Random images of any shape, made on the spot: for benchmarks, smoke tests and sizing a cluster.

Each class adds its own fixed pattern to Gaussian noise, so a model can learn something and a
falling loss means the pipeline works end to end.
"""

from typing import Optional

import torch
from torch.utils.data import DataLoader, TensorDataset

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
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.splits: dict = {}

    def setup(self, stage: Optional[str] = None) -> None:
        if self.splits:
            return
        hp = self.hparams
        world_size = self.trainer.world_size if self.trainer else 1
        self.batch_size_per_worker = hp.batch_size // world_size
        generator = torch.Generator().manual_seed(hp.seed)
        shape = (hp.num_channels, hp.image_size, hp.image_size)
        patterns = torch.randn((hp.num_classes, *shape), generator=generator)
        for name, count in (("train", hp.num_samples), ("val", hp.val_samples)):
            labels = torch.randint(0, hp.num_classes, (count,), generator=generator)
            images = torch.randn((count, *shape), generator=generator) + 0.5 * patterns[labels]
            self.splits[name] = TensorDataset(images, labels)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size_per_worker,
            shuffle=shuffle,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
            pin_memory=self.hparams.pin_memory,
            drop_last=shuffle,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)
