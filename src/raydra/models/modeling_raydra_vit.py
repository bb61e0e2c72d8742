"""raydra's ViT with a conv stem (raydra.models.vit.ViTClassifier) as a Hugging Face model, loaded
with `trust_remote_code=True`: every export of such a model carries this file as it is
(raydra.records.hf_export), so it imports nothing but torch, transformers and its config's file.

Its weights are named as ViTClassifier names them (`stem.*`, then `net.*`: Hugging Face's own
ViTForImageClassification), so a run's checkpoint is its state dict as it stands."""

import torch
from transformers import PreTrainedModel, ViTConfig, ViTForImageClassification

from .configuration_raydra_vit import RaydraViTConfig


class RaydraViTForImageClassification(PreTrainedModel):
    config_class = RaydraViTConfig
    base_model_prefix = "raydra_vit"
    main_input_name = "pixel_values"

    def __init__(self, config: RaydraViTConfig) -> None:
        super().__init__(config)
        stem = []
        for channels_in, channels_out in zip([config.num_channels, *config.conv_stem], config.conv_stem):
            stem += [torch.nn.Conv2d(channels_in, channels_out, kernel_size=3, padding=1), torch.nn.GELU()]
        self.stem = torch.nn.Sequential(*stem)
        # The transformer's own config: the same, but its patch embedding takes the stem's channels.
        settings = {
            key: value for key, value in config.to_dict().items() if key not in ("conv_stem", "model_type", "auto_map", "architectures")
        }
        settings["num_channels"] = config.conv_stem[-1] if config.conv_stem else config.num_channels
        self.net = ViTForImageClassification(ViTConfig(**settings))
        self.post_init()

    def forward(self, pixel_values=None, labels=None, **kwargs):
        """ViTForImageClassification's forward (logits, and the loss with `labels`) on the stem's output."""
        return self.net(pixel_values=self.stem(pixel_values), labels=labels, **kwargs)
