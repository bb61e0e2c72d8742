"""A Vision Transformer image classifier: Hugging Face's ViTForImageClassification in Lightning."""

from typing import Any, Optional, Sequence

import torch
import torchmetrics
from transformers import ViTConfig, ViTForImageClassification

from raydra.errors import RaydraError
from raydra.lightning import pl
from raydra.models import partial_of


class ViTClassifier(pl.LightningModule):
    """Built from a ViTConfig, or fine-tuned from `pretrained` (a hub id or a local folder).

    optimizer/scheduler arrive as partials (Hydra builds the `_partial_` nodes of model/vit.yaml),
    completed with the parameters and the run's length in configure_optimizers; the `_partial_`
    configs themselves, as a checkpoint written before keeps them, are taken too.
    """

    def __init__(
        self,
        image_size: int,
        num_channels: int,
        num_classes: int,
        optimizer: Any,
        scheduler: Optional[Any] = None,
        pretrained: Optional[str] = None,
        patch_size: int = 16,
        hidden_size: int = 768,
        num_layers: int = 12,
        num_heads: int = 12,
        mlp_size: int = 3072,
        dropout: float = 0.0,
        label_smoothing: float = 0.0,
        conv_stem: Sequence[int] = (),
    ) -> None:
        super().__init__()
        # Into every checkpoint (raydra.load builds the module again from them), not to the loggers:
        # they get the run's whole config from raydra, and a partial is no value to log.
        self.save_hyperparameters(logger=False)
        conv_stem = list(conv_stem or [])
        if pretrained and conv_stem:
            raise RaydraError(
                f"model.conv_stem={conv_stem} adds layers that model.pretrained={pretrained} has no weights for; "
                "set model.conv_stem=[] to fine-tune the pretrained model as it is."
            )
        # Early convolutions (Xiao et al. 2021, "Early Convolutions Help Transformers See Better"):
        # 3x3 convolutions at full resolution before the patch embedding give the transformer the
        # locality a plain ViT must learn from data; on 1,257 digits that is ~2 points of accuracy.
        stem: list = []
        for channels_in, channels_out in zip([num_channels, *conv_stem], conv_stem):
            stem += [torch.nn.Conv2d(channels_in, channels_out, kernel_size=3, padding=1), torch.nn.GELU()]
        self.stem = torch.nn.Sequential(*stem)
        if pretrained:
            # A new head sized for this data; the backbone keeps its pretrained weights.
            self.net = ViTForImageClassification.from_pretrained(pretrained, num_labels=num_classes, ignore_mismatched_sizes=True)
        else:
            self.net = ViTForImageClassification(
                ViTConfig(
                    image_size=image_size,
                    num_channels=conv_stem[-1] if conv_stem else num_channels,
                    num_labels=num_classes,
                    patch_size=patch_size,
                    hidden_size=hidden_size,
                    num_hidden_layers=num_layers,
                    num_attention_heads=num_heads,
                    intermediate_size=mlp_size,
                    hidden_dropout_prob=dropout,
                    attention_probs_dropout_prob=dropout,
                )
            )
        self.loss = torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values=self.stem(images)).logits

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = self.loss(self(images), labels)
        # Rank 0's own loss: syncing it would add an all-reduce to every training step.
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_acc)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_acc)

    def _evaluate(self, batch: Any, stage: str, accuracy: torchmetrics.Metric) -> None:
        images, labels = batch
        logits = self(images)
        self.log(f"{stage}/loss", self.loss(logits, labels), sync_dist=True)
        accuracy(logits, labels)
        # Logging the metric object lets torchmetrics all-reduce counts across workers.
        self.log(f"{stage}/acc", accuracy)

    def configure_optimizers(self) -> Any:
        optimizer = partial_of(self.hparams.optimizer)(params=self.parameters())
        if not self.hparams.scheduler:
            return optimizer
        scheduler = partial_of(self.hparams.scheduler)(optimizer=optimizer, num_training_steps=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
