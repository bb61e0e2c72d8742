"""Checkpoints whose hyperparameters are plain data, whatever the module was handed.

Lightning pickles a module's (and data module's) `save_hyperparameters()` into every checkpoint.
Built as Hydra builds it, a module holds objects there: lightning-hydra-template's keeps its `net`
(an nn.Module) and two partials, and nested config nodes arrive as DictConfigs. torch.load with
weights_only=True, which resume and raydra.load use so that loading a checkpoint runs no pickled
code, refuses such a file. So each value that is not plain data is written as the run's own config
node at the same key (`{_target_: ..., ...}`, from which it was built), and `raydra.load` builds the
module again from them the way the run did (the flags recorded under checkpoint["raydra"]).
"""

from typing import Any, Dict, Mapping, Optional

import torch
from omegaconf import OmegaConf

from raydra.lightning import pl

# What torch.load(weights_only=True) reads back besides tensors and containers of them.
PLAIN_TYPES = (type(None), bool, int, float, str)


def is_plain(value: Any) -> bool:
    if isinstance(value, (PLAIN_TYPES, torch.Tensor)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, PLAIN_TYPES) and is_plain(v) for k, v in value.items())
    return False


def plain_hyperparameters(hparams: Mapping[str, Any], config: Mapping[str, Any]) -> Dict[str, Any]:
    """`hparams` as plain data: OmegaConf nodes as containers, any other object as `config`'s node at
    its key (what it was built from). An object with no node there was a constructor's default,
    which building the class again makes again: it is left out."""
    plain: Dict[str, Any] = {}
    for key, value in hparams.items():
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        if is_plain(value):
            plain[key] = value
        elif key in config:
            plain[key] = config[key]
    return plain


def instantiation(config: Mapping[str, Any]) -> Dict[str, Any]:
    """How hydra.utils.instantiate built a class from `config`: the node's own flags, else Hydra's defaults."""
    return {"_recursive_": bool(config.get("_recursive_", True)), "_convert_": str(config.get("_convert_", "none"))}


class PlainHyperparameters(pl.Callback):
    """Rewrites a checkpoint's hyperparameters (the module's and the data module's) as plain data,
    and records how the module was instantiated, before Lightning writes it (every layout: a file,
    FSDP's sharded folder with its meta.pt, DeepSpeed's)."""

    def __init__(self, model_config: Mapping[str, Any], data_config: Optional[Mapping[str, Any]] = None) -> None:
        self.model_config, self.data_config = dict(model_config), dict(data_config or {})

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        for owner, config in ((pl.LightningModule, self.model_config), (pl.LightningDataModule, self.data_config)):
            if owner.CHECKPOINT_HYPER_PARAMS_KEY in checkpoint:
                checkpoint[owner.CHECKPOINT_HYPER_PARAMS_KEY] = plain_hyperparameters(checkpoint[owner.CHECKPOINT_HYPER_PARAMS_KEY], config)
            # The class of hyperparameters saved as one DictConfig: a class object is not plain data,
            # and they are a dict now.
            checkpoint.pop(owner.CHECKPOINT_HYPER_PARAMS_TYPE, None)
        checkpoint["raydra"] = {"instantiate": instantiation(self.model_config)}
