"""MNIST-shaped data that needs no download: 28x28 one-channel images of 10 classes, each image its
class's pattern under noise, made once from a fixed seed into `data_dir` (as a template project's
MNISTDataModule downloads MNIST there) and split train/val/test. The global batch is split over
the devices in `setup`, as lightning-hydra-template's data module does."""

import os
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, Dataset, TensorDataset, random_split

FILE = "synthetic_mnist.pt"


class SyntheticMNISTDataModule(LightningDataModule):
    def __init__(
        self,
        data_dir: str = "data/",
        train_val_test_split: Sequence[int] = (55_000, 5_000, 10_000),
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        noise: float = 0.8,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.data_train: Optional[Dataset] = None
        self.data_val: Optional[Dataset] = None
        self.data_test: Optional[Dataset] = None
        self.batch_size_per_device = batch_size

    @property
    def num_classes(self) -> int:
        return 10

    def _file(self) -> Path:
        return Path(self.hparams.data_dir) / FILE

    def prepare_data(self) -> None:
        """Once per node: write the images unless a file of this size and seed is there already."""
        hp = self.hparams
        size = sum(hp.train_val_test_split)
        if self._file().is_file():
            saved = torch.load(self._file(), weights_only=True)
            if len(saved["labels"]) == size and int(saved["seed"]) == hp.seed and float(saved["noise"]) == hp.noise:
                return
        generator = torch.Generator().manual_seed(hp.seed)
        patterns = torch.rand(10, 1, 28, 28, generator=generator)
        labels = torch.randint(0, 10, (size,), generator=generator)
        images = (1 - hp.noise) * patterns[labels] + hp.noise * torch.rand(size, 1, 28, 28, generator=generator)
        self._file().parent.mkdir(parents=True, exist_ok=True)
        # Written beside and renamed over: a process reading it never sees half a file.
        partial = self._file().with_name(f".{FILE}.{os.getpid()}")
        torch.save({"images": images, "labels": labels, "seed": hp.seed, "noise": hp.noise}, partial)
        os.replace(partial, self._file())

    def setup(self, stage: Optional[str] = None) -> None:
        # The configured batch_size is the global batch: each device takes its share.
        if self.trainer is not None:
            if self.hparams.batch_size % self.trainer.world_size != 0:
                raise RuntimeError(
                    f"Batch size ({self.hparams.batch_size}) is not divisible by the number of devices ({self.trainer.world_size})."
                )
            self.batch_size_per_device = self.hparams.batch_size // self.trainer.world_size
        if self.data_train is None:
            saved = torch.load(self._file(), weights_only=True)
            # Normalised as MNIST's images usually are.
            images = (saved["images"] - 0.5) / 0.25
            self.data_train, self.data_val, self.data_test = random_split(
                TensorDataset(images, saved["labels"]), list(self.hparams.train_val_test_split), generator=torch.Generator().manual_seed(42)
            )

    def _loader(self, dataset: Dataset, shuffle: bool) -> DataLoader[Any]:
        hp = self.hparams
        return DataLoader(
            dataset, batch_size=self.batch_size_per_device, num_workers=hp.num_workers, pin_memory=hp.pin_memory, shuffle=shuffle
        )

    def train_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.data_train, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.data_val, shuffle=False)

    def test_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.data_test, shuffle=False)
