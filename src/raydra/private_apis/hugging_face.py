"""Hugging Face's private API (raydra.private_apis says why such a module exists)."""

import contextlib
from typing import Iterator


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Make `datasets` and `huggingface_hub` answer from the local cache only, for this block.

    HF_HUB_OFFLINE is read once, at import; after that only these module constants switch it. Going
    offline keeps a cached hub id from contacting the hub (which, without network, waits on time-outs).
    """
    import datasets.config
    import huggingface_hub.constants

    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved
