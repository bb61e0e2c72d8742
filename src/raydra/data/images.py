"""Images as the data modules and Ray Data's preprocessing read them: decoded from whatever a
column holds, resized (by a pretrained model's image processor, or plainly) to uint8 arrays."""

import io
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from raydra.errors import RaydraError


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
