"""Resumable puts the training data where a mid-epoch checkpoint left it: plain Lightning, no Ray,
so every batch a restarted fit trains on can be compared with an uninterrupted fit's."""

import torch
from helpers import bare_trainer
from torch.utils.data import DataLoader, TensorDataset

from raydra.data.device_batches import DeviceBatches
from raydra.lightning import pl
from raydra.worker.resumable import Resumable

SAVE_AT_STEP = 3


class Recorder(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen: list = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch[0].flatten().tolist())
        return self.layer(batch[0].flatten(1)[:, :2]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SaveMidEpoch(pl.Callback):
    def __init__(self, path) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == SAVE_AT_STEP:
            trainer.save_checkpoint(self.path)


def _fit(loader_fn, tmp_path, ckpt_path=None):
    module, resumable = Recorder(), Resumable()
    trainer = bare_trainer(max_epochs=3, callbacks=[resumable, SaveMidEpoch(tmp_path / "mid.ckpt")])
    trainer.fit(module, loader_fn(), ckpt_path=ckpt_path, weights_only=True)
    return module.seen, resumable.resumed_at


def _dataloader():
    return DataLoader(TensorDataset(torch.arange(20.0).view(10, 2)), batch_size=2)


def _device_batches():
    images = torch.arange(10 * 4, dtype=torch.uint8).view(10, 1, 2, 2)
    # Training order reshuffled per epoch and augmented: both must continue where they stood.
    return DeviceBatches(
        images,
        torch.arange(10),
        batch_size=2,
        rank=0,
        world_size=1,
        train=True,
        augment=True,
        seed=7,
        mean=(0.0,),
        std=(1 / 255,),
        crop_padding=1,
        flip=True,
    )


def test_a_dataloader_restarted_mid_epoch_continues_with_the_batches_it_had_not_trained(tmp_path):
    full, _ = _fit(_dataloader, tmp_path)
    restarted, at = _fit(_dataloader, tmp_path, ckpt_path=tmp_path / "mid.ckpt")
    assert at == {"epoch": 0, "batches": SAVE_AT_STEP, "of": 5, "global_step": SAVE_AT_STEP}
    assert restarted == full[SAVE_AT_STEP:]


def test_device_batches_restarted_mid_epoch_continue_with_the_same_order_and_augmentation(tmp_path):
    full, _ = _fit(_device_batches, tmp_path)
    restarted, at = _fit(_device_batches, tmp_path, ckpt_path=tmp_path / "mid.ckpt")
    assert at["batches"] == SAVE_AT_STEP
    assert restarted == full[SAVE_AT_STEP:]
    # The epochs differ from each other, so matching them is not a coincidence of a fixed order.
    assert full[:5] != full[5:10]
