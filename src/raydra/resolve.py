"""The composed config resolved once on the driver, into what the workers can use without Hydra.

resolve(cfg, run_dir, run_id)   composed config -> plain data (every interpolation resolved,
                                "auto" values decided, the run's place added)
describe_data / data_to_describe   what the data states about itself, filled in before resolving
wandb_mode                      W&B's mode, decided where the shell's key and WANDB_MODE are seen
"""

import netrc
import os
from pathlib import Path
from typing import Any, Dict, Optional
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf, open_dict

from raydra import run_record, storage
from raydra.errors import RaydraError
from raydra.redact import redact


def resolve(cfg: DictConfig, run_dir: Path, run_id: str, wandb_group: Optional[str] = None) -> Dict[str, Any]:
    """Plain data for the workers: they have no Hydra, so every interpolation is resolved here.
    `cfg` gets its run directory as paths.output_dir (and what describe_data finds) first.
    `wandb_group`: the W&B group of a run whose logger.wandb.group is null (a multirun's)."""
    with open_dict(cfg):
        cfg.paths.output_dir = str(run_dir)
    describe_data(cfg)
    config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    # What loggers may record: masked here, where the secrets are known. A worker's environment
    # is its Ray node's, which need not hold the variables this process was started with.
    config["run"] = {
        "dir": str(run_dir),
        "id": run_id,
        "logged_config": redact(dict(config)),
        "storage": run_record.location(config["paths"]["storage"], config["paths"]["outputs"], run_dir),
    }
    if config["ckpt_path"]:
        config["run"]["init_weights"] = _initial_weights(config["ckpt_path"])
    if config["checkpoint"]["upload"] == "auto":
        config["checkpoint"]["upload"] = "background" if config["run"]["storage"] else "wait"
    if config["trainer"]["precision"] == "auto":
        config["trainer"]["precision"] = "bf16-mixed" if config["scale"]["use_gpu"] else "32-true"
    if "wandb" in config["logger"]:
        config["logger"]["wandb"]["mode"] = wandb_mode(config["logger"]["wandb"].get("mode"))
        if config["logger"]["wandb"].get("group") is None:
            config["logger"]["wandb"]["group"] = wandb_group
    return config


def _initial_weights(ckpt_path: str) -> str:
    """The checkpoint ckpt_path names (itself, or a run's best), checked to be there; local paths made
    absolute, since the workers run elsewhere."""
    from raydra import checkpoints

    try:
        found = checkpoints.locate(ckpt_path, "best")
    except RaydraError as error:
        raise RaydraError(f"ckpt_path={ckpt_path}: {error}") from None
    return found if storage.is_uri(found) else str(Path(found).resolve())


def describe_data(cfg: DictConfig) -> None:
    """Fill what the data can state about itself (a Hugging Face ClassLabel's names, an image
    folder's class folders) into data.num_classes and data.class_names, before resolving, so the
    model's `${data.num_classes}` follows and the user never repeats it. A stated count must agree."""
    target = data_to_describe(cfg)
    if not target:
        return
    from hydra.utils import get_class

    describe = getattr(get_class(target), "describe", None)
    if describe is None:
        return
    facts = describe(**{k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items() if k != "_target_"})
    stated = cfg.data.get("num_classes")
    if stated is not None and stated != facts["num_classes"]:
        where = cfg.data.get("name") or cfg.data.get("root")
        raise RaydraError(
            f"{where} has {facts['num_classes']} classes ({', '.join(facts['class_names'][:5])}"
            f"{', ...' if facts['num_classes'] > 5 else ''}) but data.num_classes={stated}; "
            f"set data.num_classes={facts['num_classes']} or leave it null."
        )
    with open_dict(cfg):
        cfg.data.num_classes = facts["num_classes"]
        cfg.data.class_names = facts["class_names"]


def data_to_describe(cfg: DictConfig) -> Optional[str]:
    """The data module's `_target_` when its class is to describe the data: its config leaves
    num_classes or class_names null (data=hf, data=imagefolder). A data config that states its
    classes and has no class_names key (digits, cifar10, synthetic) is not asked, so the driver
    need not import the class's module, and Lightning with it (~3 s of CPU before the fit)."""
    data = cfg.data
    if not data.get("_target_"):
        return None
    asks = data.get("num_classes") is None or ("class_names" in data and data.class_names is None)
    return data._target_ if asks else None


def wandb_mode(requested: Any) -> str:
    """online only when an API key is configured; never prompt, never wait on the network."""
    if requested:
        return str(requested)
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if _wandb_api_key_configured() else "offline"


def _wandb_api_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    import wandb

    # `wandb login` stores the key in ~/.netrc under the server's host name.
    hosts = {"api.wandb.ai", urlparse(wandb.Settings().base_url).hostname}
    try:
        entries = netrc.netrc().hosts
    except (FileNotFoundError, netrc.NetrcParseError):
        return False
    return any(host in entries for host in hosts)
