"""The composed config resolved once on the driver into the run's typed spec (raydra.config.spec.RunSpec).

resolve(cfg, run_dir, run_id)   composed config -> RunSpec: every interpolation resolved (the
                                workers have no Hydra), "auto" values decided, the place added
check_data_paths                data.root of raydra's data groups is there, before the workers start
describe_data / data_to_describe   what the data states about itself, filled in before resolving
wandb_mode                      W&B's mode, decided where the shell's key and WANDB_MODE are seen
"""

import copy
import dataclasses
import netrc
import os
from pathlib import Path
from typing import Any, Dict, Optional, cast
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf, open_dict

from raydra import storage
from raydra.config.schema import STRATEGY_SCHEMAS
from raydra.config.spec import Place, RunSpec
from raydra.errors import RaydraError
from raydra.records import layout
from raydra.redact import redact
from raydra.run.prepare import writable


def resolve(
    cfg: DictConfig, run_dir: Path, run_id: str, wandb_group: Optional[str] = None, kind: str = "run", label: Optional[str] = None
) -> RunSpec:
    """The run's spec from its prepared config (raydra.run.prepare), which is left as it is: a copy gets
    its run directory as paths.output_dir and what describe_data finds, then every interpolation
    resolved. `wandb_group`: the W&B group of a run whose logger.wandb.group is null (a multirun's).
    `kind`: "run", "job" (of a multirun) or "trial" (of a Tune sweep), W&B's job_type unless
    logger.wandb.job_type says otherwise; `label`: what tells a job or trial apart from the others
    of its multirun or sweep (its overrides, its sampled values), its W&B name unless
    logger.wandb.name says otherwise (a run's is its run id)."""
    cfg = writable(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(run_dir)
    check_data_paths(cfg)
    describe_data(cfg)
    resolved = copy.deepcopy(cfg)
    OmegaConf.resolve(resolved)
    plain = cast(Dict[str, Any], OmegaConf.to_container(resolved, throw_on_missing=True))
    location = layout.location(plain["paths"]["storage"], plain["paths"]["outputs"], run_dir)
    # What loggers may record: masked here, where the secrets are known (a worker's environment is
    # its Ray node's, which need not hold the variables this process was started with), and before
    # the "auto" values below are decided, as the user wrote them.
    logged = redact(plain)
    if resolved.logger and "wandb" in resolved.logger:
        with open_dict(resolved):
            decided = _wandb_decided(resolved.logger.wandb, run_id, wandb_group, kind, label)
            resolved.logger.wandb.update(decided)
        # The logged config says what W&B ran with (its mode and group), not the null that meant "decide".
        logged["logger"]["wandb"].update(decided)
    place = Place(dir=str(run_dir), id=run_id, storage=location, logged_config=logged)
    if plain["ckpt_path"]:
        place = dataclasses.replace(place, init_weights=_initial_weights(plain["ckpt_path"]))
    with open_dict(resolved):
        if resolved.checkpoint.upload == "auto":
            resolved.checkpoint.upload = "background" if location else "wait"
        if resolved.trainer.precision == "auto":
            resolved.trainer.precision = "bf16-mixed" if resolved.scale.use_gpu else "32-true"
        if resolved.trainer.benchmark == "auto":
            # null on CPU: Lightning leaves torch's setting as it is.
            resolved.trainer.benchmark = True if resolved.scale.use_gpu and not resolved.trainer.deterministic else None
    # The schema's groups become their dataclasses (strategy and tune too: their options extend a
    # schema); model, data, logger and callbacks become plain dicts.
    typed = {f.name: _typed(f.name, resolved[f.name]) for f in dataclasses.fields(RunSpec) if f.name != "place"}
    return RunSpec(**typed, place=place)


def _wandb_decided(wandb: Any, run_id: str, group: Optional[str], kind: str, label: Optional[str]) -> Dict[str, Any]:
    """What logger.wandb leaves to raydra, decided: the mode, the multirun's or sweep's group, the
    job type (run, job or trial) and the name (a job's or trial's label, a run's id)."""
    return {
        "mode": wandb_mode(wandb.get("mode")),
        "group": wandb.get("group") if wandb.get("group") is not None else group,
        "job_type": wandb.get("job_type") or kind,
        "name": wandb.get("name") or label or run_id,
    }


def _typed(key: str, node: Any) -> Any:
    if key == "strategy" and OmegaConf.get_type(node) is dict:
        # A primary config that states the strategy's keys itself (a sweep's best_config.yaml) has
        # no option schema behind them: its name picks the schema.
        schema = STRATEGY_SCHEMAS.get(node.get("name"))
        if schema is None:
            raise RaydraError(
                f"strategy.name={node.get('name')} is not a strategy raydra knows; pick one of {', '.join(STRATEGY_SCHEMAS)}."
            )
        node = OmegaConf.merge(OmegaConf.structured(schema), node)
    return OmegaConf.to_object(node) if OmegaConf.is_config(node) else node


def _initial_weights(ckpt_path: str) -> str:
    """The checkpoint ckpt_path names (itself, or a run's best), checked to be there; local paths made
    absolute, since the workers run elsewhere."""
    from raydra.records import checkpoints

    try:
        found = checkpoints.locate(ckpt_path, "best")
        if not storage.is_uri(found):
            # Each worker loads it; a file cut short is named here, before any worker starts.
            checkpoints.check_whole(found)
    except RaydraError as error:
        raise RaydraError(f"ckpt_path={ckpt_path}: {error}") from None
    return found if storage.is_uri(found) else str(Path(found).resolve())


def check_data_paths(cfg: DictConfig) -> None:
    """data.root of raydra's own data groups (cifar10, imagefolder, image_captions: a folder each
    reads) exists, unless the data is to be downloaded (data.download=true), checked on the driver
    before the workers start when they run on this machine and so read its disk: local mode, or the
    local Ray this driver starts. data=cifar10 data.root=/nonexistent was refused by the workers 31 s
    after the run started. Checked without importing the data module (Lightning, ~3 s on the driver
    of a Ray run); what the folder must hold, the module says as it reads it."""
    data = cfg.data
    if not str(data.get("_target_")).startswith("raydra.data.") or not data.get("root") or data.get("download"):
        return
    if cfg.scale.num_workers != 0 and cfg.ray.address:
        return  # a cluster's workers read their own disks
    if not Path(str(data.root)).expanduser().exists():
        fetch = ", or set data.download=true to fetch it there" if "download" in data else ""
        raise RaydraError(
            f"data.root={data.root} does not exist on this machine, whose disk the workers read; point it at your data{fetch}."
        )


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
    facts = describe(**{k: v for k, v in cast(Dict[str, Any], OmegaConf.to_container(cfg.data, resolve=True)).items() if k != "_target_"})
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
