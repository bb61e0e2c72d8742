"""A Vision Transformer image classifier: Hugging Face's ViTForImageClassification in Lightning.

A run exports it for `transformers` (`<run dir>/hf/`, raydra.records.hf_export): a plain ViT as
ViTForImageClassification, one with a conv stem as RaydraViTForImageClassification, whose code
(raydra.models.modeling_raydra_vit) the export carries for `trust_remote_code=True`.
"""

import copy
from typing import Any, Optional, Sequence

import torch
import torchmetrics
from transformers import ViTConfig, ViTForImageClassification

from raydra.data.images import ImageInputs
from raydra.errors import RaydraError
from raydra.lightning import pl
from raydra.models import partial_of
from raydra.models.configuration_raydra_vit import RaydraViTConfig
from raydra.records.hf_export import HFExport

# The files of raydra.models an export with a conv stem carries, and the names config.json's auto_map gives their classes.
REMOTE_CODE = ("configuration_raydra_vit.py", "modeling_raydra_vit.py")
AUTO_MAP = {
    "AutoConfig": "configuration_raydra_vit.RaydraViTConfig",
    "AutoModelForImageClassification": "modeling_raydra_vit.RaydraViTForImageClassification",
}


class ViTClassifier(pl.LightningModule):
    """Built from a ViTConfig, or fine-tuned from `pretrained` (a hub id or a local folder).

    optimizer/scheduler arrive as partials (Hydra builds the `_partial_` nodes of model/vit.yaml),
    completed with the parameters and the run's length in configure_optimizers; the `_partial_`
    configs themselves, as a checkpoint written before keeps them, are taken too.

    `export_hf`: the run ends with its best checkpoint exported for Hugging Face (hf_export).
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
        export_hf: bool = True,
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

    def hf_export(self, inputs: Optional[ImageInputs]) -> Optional[HFExport]:
        """What the run's Hugging Face export holds (None with export_hf=false): this network's
        config with the data's class names (`inputs`, from the data module), the weights that the
        Hugging Face model holds, and the data's image processor settings. The driver writes it
        with the best checkpoint's weights (raydra.records.hf_export).

        A plain ViT is ViTForImageClassification, its weights `net.*` without the prefix. The conv
        stem is no part of any Hugging Face model, and no folding into the patch embedding is exact
        (a GELU follows each convolution), so a model with one is RaydraViTForImageClassification:
        ViTForImageClassification behind the stem, its config and modeling code carried in the export
        (loaded with trust_remote_code=True), its weights named as here."""
        hp = self.hparams
        if not hp.export_hf:
            return None
        config = copy.deepcopy(self.net.config)
        # Hugging Face's own names where the data states none: a pretrained config's would be the
        # pretraining's labels, as many as its old head had.
        names = (inputs.class_names if inputs is not None else None) or [f"LABEL_{label}" for label in range(hp.num_classes)]
        config.id2label = dict(enumerate(names))
        config.label2id = {name: label for label, name in enumerate(names)}
        processor = inputs.processor if inputs is not None else None
        if not hp.conv_stem:
            config.architectures = ["ViTForImageClassification"]
            return HFExport(config.to_json_string(use_diff=False), weights=("net.",), strip="net.", preprocessor=processor)
        settings = {key: value for key, value in config.to_dict().items() if key not in ("model_type", "architectures")}
        config = RaydraViTConfig(**{**settings, "num_channels": hp.num_channels, "conv_stem": list(hp.conv_stem)})
        config.auto_map = AUTO_MAP
        config.architectures = ["RaydraViTForImageClassification"]
        return HFExport(config.to_json_string(use_diff=False), weights=("stem.", "net."), code=REMOTE_CODE, preprocessor=processor)
