"""A small MLP classifier: a plain LightningModule that raydra builds from conf/model/mlp.yaml."""

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from raydra.lightning import pl  # the Lightning that Ray's integration runs


class MLPClassifier(pl.LightningModule):
    def __init__(self, num_features: int, num_classes: int, hidden_size: int, optimizer: Callable[..., torch.optim.Optimizer]):
        super().__init__()
        # Kept in every checkpoint (raydra.load rebuilds the module from them); raydra logs the run's config itself.
        self.save_hyperparameters(logger=False)
        self.net = nn.Sequential(nn.Linear(num_features, hidden_size), nn.ReLU(), nn.Linear(hidden_size, num_classes))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def _evaluate(self, batch, split):
        x, y = batch
        logits = self(x)
        # sync_dist: averaged over every worker's shard, so all workers (and checkpoint.monitor,
        # val/acc by default) see the same value.
        self.log(f"{split}/loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log(f"{split}/acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        # model.optimizer arrives as a partial (Hydra builds its `_partial_` node): complete it with the parameters.
        return self.hparams.optimizer(params=self.parameters())
