"""Images as the data modules and Ray Data's preprocessing read them: decoded from whatever a
column holds, resized (by a pretrained model's image processor, or plainly) to uint8 arrays."""

import io
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from raydra.errors import RaydraError

# PIL's bilinear filter (PIL.Image.BILINEAR), by the number Hugging Face's image processors take.
BILINEAR = 2


@dataclass(frozen=True)
class ImageInputs:
    """What a data module says about its images to a model's export (raydra.records.hf_export): the class
    names by label, when known, and the Hugging Face image processor settings
    (preprocessor_config.json) that turn one of its raw images into what the model saw, when it
    can say. Each raydra image data module gives it from its config: `image_inputs(data)`."""

    class_names: Optional[List[str]]
    processor: Optional[Dict[str, Any]]


def settings(cls: type, data: Dict[str, Any]) -> Dict[str, Any]:
    """A data config's constructor arguments for `cls`, with the constructor's defaults for those it leaves out."""
    import inspect

    defaults = {
        name: p.default for name, p in inspect.signature(cls.__init__).parameters.items() if p.default is not inspect.Parameter.empty
    }
    return {**defaults, **{key: value for key, value in data.items() if not key.startswith("_")}}


def vit_processor(
    size: int, channels: int, mean: Sequence[float], std: Sequence[float], rescale: float = 1 / 255, resize: bool = True
) -> Dict[str, Any]:
    """The settings of a ViTImageProcessor that does what raydra's image data modules do: convert to
    RGB (3 channels), resize to size x size with PIL's bilinear filter (`resize`), scale the pixel
    values by `rescale` and normalise by the channels' `mean` and `std` (DeviceBatches)."""
    return {
        "image_processor_type": "ViTImageProcessor",
        "do_convert_rgb": channels == 3,
        "do_resize": resize,
        "size": {"height": size, "width": size},
        "resample": BILINEAR,
        "do_rescale": True,
        "rescale_factor": rescale,
        "do_normalize": True,
        "image_mean": list(mean)[:channels],
        "image_std": list(std)[:channels],
    }


def first_line(error: BaseException) -> str:
    """An exception as "Type: its first line", for one-sentence errors."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def image_processor(pretrained: Optional[str]) -> Any:
    """The pretrained model's image processor (PIL backend: torchvision is not a dependency), or None."""
    if not pretrained:
        return None
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(pretrained, backend="pil")
    except TypeError:
        return AutoImageProcessor.from_pretrained(pretrained)
    except OSError as error:
        raise RaydraError(
            f"model.pretrained={pretrained} has no image processor that loads here ({first_line(error)}); "
            "point it at a local folder with preprocessor_config.json or a cached hub id."
        ) from None


def processor_shape(processor: Any, image_size: int) -> Tuple[int, int]:
    size = getattr(processor, "size", None) if processor is not None else None
    if size is not None:
        get = size.get if isinstance(size, dict) else lambda k, d=None: getattr(size, k, d)
        if get("height") and get("width"):
            return int(get("height")), int(get("width"))
        if get("shortest_edge"):
            return int(get("shortest_edge")), int(get("shortest_edge"))
    return image_size, image_size


def normalisation(processor: Any, mean: Sequence[float], std: Sequence[float], channels: int) -> Tuple[list, list]:
    if processor is not None and getattr(processor, "do_normalize", True) and getattr(processor, "image_mean", None):
        return list(processor.image_mean)[:channels], list(processor.image_std)[:channels]
    return list(mean)[:channels], list(std)[:channels]


def as_image(item: Any) -> Any:
    """A PIL image from what a dataset column holds: PIL already, encoded bytes, a {bytes, path}
    struct (Hugging Face's Image feature as stored in parquet), a file path, or an array."""
    from PIL import Image

    if isinstance(item, Image.Image):
        return item
    if isinstance(item, dict):
        item = item.get("bytes") or item.get("path")
    if isinstance(item, (bytes, bytearray)):
        return Image.open(io.BytesIO(item))
    if isinstance(item, str):
        return Image.open(item)
    return Image.fromarray(np.asarray(item))


def to_uint8(images: Sequence[Any], processor: Any, size: int, channels: int, where: str) -> np.ndarray:
    """(n, channels, H, W) uint8: the processor's resize (its rescale and normalisation are applied
    later as batched tensor ops), or a plain bilinear resize to size x size."""
    from PIL import Image

    mode = {1: "L", 3: "RGB"}[channels]
    try:
        pil = [as_image(image).convert(mode) for image in images]
    except Exception as error:
        raise RaydraError(f"{where} holds an image that does not decode ({first_line(error)}); remove or replace it.") from None
    if processor is not None:
        pixels = processor(images=pil, do_rescale=False, do_normalize=False, return_tensors="np")["pixel_values"]
        return np.clip(np.rint(np.asarray(pixels)), 0, 255).astype(np.uint8)
    out = np.empty((len(pil), channels, size, size), dtype=np.uint8)
    for i, image in enumerate(pil):
        out[i] = np.asarray(image.resize((size, size), Image.BILINEAR)).reshape(size, size, channels).transpose(2, 0, 1)
    return out
