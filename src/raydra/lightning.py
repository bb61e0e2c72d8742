"""Lightning, imported the way Ray's Lightning integration imports it.

Ray's RayDDPStrategy/RayLightningEnvironment subclass `lightning.pytorch` when that package is
installed and `pytorch_lightning` otherwise, and a Trainer or module from the other package is
rejected. Every raydra module takes `pl` from here so the two always agree.
"""

try:
    import lightning.pytorch as pl
except ModuleNotFoundError:
    import pytorch_lightning as pl

__all__ = ["pl"]
