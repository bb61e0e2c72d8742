"""Points scattered around random centres, one centre per class: a LightningDataModule that needs
no files (conf/data/blobs.yaml)."""

import torch
from torch.utils.data import DataLoader, TensorDataset, random_split

from raydra.lightning import pl


class BlobsDataModule(pl.LightningDataModule):
    def __init__(self, batch_size: int, num_samples: int, num_features: int, num_classes: int, seed: int = 0):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage=None):
        hp = self.hparams
        g = torch.Generator().manual_seed(hp.seed)  # the same data on every worker
        centres = torch.randn(hp.num_classes, hp.num_features, generator=g) * 2
        y = torch.randint(hp.num_classes, (hp.num_samples,), generator=g)
        x = centres[y] + torch.randn(hp.num_samples, hp.num_features, generator=g)
        n = hp.num_samples // 10
        self.train, self.val, self.test = random_split(TensorDataset(x, y), [hp.num_samples - 2 * n, n, n], generator=g)
        # data.batch_size is the global batch: each worker loads its share (Lightning gives each
        # worker its own part of every split).
        self.per_worker = hp.batch_size // self.trainer.world_size

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.per_worker, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.per_worker)

    def test_dataloader(self):
        return DataLoader(self.test, batch_size=self.per_worker)
