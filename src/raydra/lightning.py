"""Lightning, imported the way Ray's Lightning integration imports it.

Ray's RayDDPStrategy/RayLightningEnvironment subclass `lightning.pytorch` when the `lightning`
package is installed (raydra depends on it) and `pytorch_lightning` otherwise, and a Trainer or
module from the other package is rejected. Every raydra module takes `pl` from here so the two
always agree, and so do lightning-hydra-template's `_target_`s (`lightning.pytorch.callbacks...`)
and modules (`from lightning import LightningModule`).
"""

import lightning.pytorch as pl

__all__ = ["pl"]
