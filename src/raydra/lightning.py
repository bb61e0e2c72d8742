"""Lightning, imported the way Ray's Lightning integration imports it.

Ray's RayDDPStrategy/RayLightningEnvironment subclass `lightning.pytorch` when the `lightning`
package is installed (raydra depends on it) and `pytorch_lightning` otherwise, and a Trainer or
module from the other package is rejected. Every raydra module takes `pl` from here so the two
always agree, and so do lightning-hydra-template's `_target_`s (`lightning.pytorch.callbacks...`)
and modules (`from lightning import LightningModule`).
"""

# The submodules raydra reaches through `pl` (pl.callbacks.ModelCheckpoint, pl.loggers.Logger) are
# imported by name, and `pl` bound after them, so that a type checker knows them as its attributes
# (lightning.pytorch imports them itself: nothing more is imported at run time).
import lightning.pytorch
import lightning.pytorch.callbacks
import lightning.pytorch.loggers
import lightning.pytorch.strategies

pl = lightning.pytorch

__all__ = ["pl"]
