"""The config of raydra's ViT with a conv stem (raydra.models.vit.ViTClassifier), as Hugging Face
loads it with `trust_remote_code=True`: every export of such a model carries this file as it is
(raydra.records.hf_export), so it imports nothing but transformers."""

from transformers import ViTConfig


class RaydraViTConfig(ViTConfig):
    """ViTConfig with `conv_stem`: the channels of the 3x3 convolutions, each followed by a GELU, that
    see the image at full resolution before the patch embedding. `num_channels` is the image's; the
    transformer's patch embedding takes the stem's last channels."""

    model_type = "raydra_vit"

    def __init__(self, conv_stem=(), **kwargs):
        super().__init__(**kwargs)
        self.conv_stem = list(conv_stem)
