"""A researcher's own project on raydra: their classes checked on the driver, their code shipped to
the workers. What raydra needs of their classes is written down in docs/own-project.md.

    check_classes(cfg)   model._target_ and data._target_ import, are a LightningModule and a
                         LightningDataModule and define what training calls; each callbacks.<name>
                         is a Callback and each logger.<name> (but raydra's csv and wandb) a
                         Logger; the arguments of all of them fit their signatures (raydra.config.arguments);
                         one sentence naming what is missing, before Ray starts
    runtime_env(cfg)     what ray.init gets so that every worker imports the project's code as the
                         driver does: the current directory as Ray's working_dir (ray.working_dir)
    shadowed_configs()   the project's config files that raydra's own groups hide (Hydra searches
                         raydra's before a --config-dir), said in one sentence

raydra's own classes (`raydra.*`) are tested with raydra and installed wherever raydra is: they
are neither checked here (importing them would cost the driver seconds of Lightning) nor shipped;
their arguments are checked where they are imported anyway (raydra.config.arguments).
"""

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, cast

from omegaconf import DictConfig, OmegaConf

from raydra.config import arguments
from raydra.config.arguments import RAYDRA_LOGGERS, import_target
from raydra.errors import RaydraError

# What Ray's working_dir never needs from a project directory (gitignore patterns, as Ray takes
# them; Ray also honours the project's own .gitignore): version control, virtual environments,
# caches, checkpoints and W&B's files. paths.outputs is added when it lies inside.
EXCLUDES = [".git", ".venv", "venv", "__pycache__", "*.pyc", "*.ckpt", "wandb", ".ipynb_checkpoints"]


def check_classes(cfg: DictConfig, own_classes: bool = False, check_arguments: bool = True) -> None:
    """Raise RaydraError, naming the key, if the model or data class cannot serve as one, or if
    the arguments of any `_target_` of the run do not fit its signature (raydra.config.arguments); those
    of raydra's own model and data classes with `own_classes` (importing them imports Lightning).
    `check_arguments=False`: the classes only; the caller checks the arguments."""
    _check_class(cfg.model, "model", "LightningModule", ("training_step", "configure_optimizers"))
    if cfg.data.get("loader") != "ray_data":  # under ray_data the workers get raydra's own module
        _check_class(cfg.data, "data", "LightningDataModule", ("train_dataloader",))
    for name, node in entries(cfg, "callbacks"):
        cls = target_class(node, f"callbacks.{name}", "callbacks")
        if not entries(cfg, "logger") and writes_to_loggers(cls):
            raise RaydraError(
                f"callbacks.{name} ({cls.__name__}) writes to the run's loggers, and logger=none leaves none; add one, e.g. logger=csv."
            )
    for name, node in entries(cfg, "logger"):
        if name not in RAYDRA_LOGGERS:
            target_class(node, f"logger.{name}", "loggers")
    # Last, the arguments of what was imported here, and of every `_target_` nested in the model and
    # data (an optimizer, a scheduler): each one that does not fit its signature, all in one error.
    if check_arguments:
        arguments.check(cfg, raydras_own=None if own_classes else False)


def writes_to_loggers(cls: type) -> bool:
    """Whether a callback class only writes to the run's loggers (Lightning refuses it on a Trainer
    without any): refused with logger=none here, built on rank 0 alone on the workers."""
    from raydra.lightning import pl

    return issubclass(cls, (pl.callbacks.LearningRateMonitor, pl.callbacks.DeviceStatsMonitor))


def entries(cfg: DictConfig, key: str) -> List[Any]:
    """(name, node) of the root key `key`, a dict of named `_target_` entries (callbacks, logger); a
    null entry is left out, as is a null or empty dict: none."""
    node = cfg.get(key)
    if node is not None and not (OmegaConf.is_dict(node) or isinstance(node, dict)):
        raise RaydraError(
            f"{key} is a {'list' if OmegaConf.is_list(node) or isinstance(node, list) else type(node).__name__}, not a dict of named "
            f"entries; give each one a name, e.g. {key}.early_stopping._target_=... (or pick options: {key}=[a,b])."
        )
    return [(name, value) for name, value in (node or {}).items() if value is not None]


def target_class(node: Any, key: str, kind: str) -> type:
    """The Lightning Callback (kind "callbacks") or Logger ("loggers") class of the entry `key`,
    imported (its arguments are raydra.config.arguments' to check)."""
    from raydra.lightning import pl

    base = pl.Callback if kind == "callbacks" else pl.loggers.Logger
    example = "lightning.pytorch.callbacks.EarlyStopping" if kind == "callbacks" else "lightning.pytorch.loggers.TensorBoardLogger"
    if not OmegaConf.is_dict(node) and not isinstance(node, dict) or not node.get("_target_"):
        raise RaydraError(
            f"{key} has no _target_; name the {base.__name__} class, e.g. {key}._target_={example} (or set {key}=null to leave it out)."
        )
    target = str(node["_target_"])
    cls = _lightning_subclass(
        target,
        key,
        base,
        use_instead=f"use the class from lightning.pytorch (e.g. {example})",
        not_one=f"is not a Lightning {base.__name__}; point it at one (e.g. {example})",
    )
    return cls


def _check_class(node: Any, group: str, base_name: str, needed: tuple) -> None:
    target = node.get("_target_") if node is not None else None
    if not target:
        raise RaydraError(
            f"{group} has no _target_; name your class, e.g. {group}._target_=my_project.{group}.MyClass (docs/own-project.md)."
        )
    if str(target).startswith("raydra."):
        return
    from raydra.lightning import pl

    base = getattr(pl, base_name)
    cls = _lightning_subclass(
        target,
        group,
        base,
        use_instead="import Lightning in your module as `from raydra.lightning import pl`",
        not_one=f"is not a {base.__name__} subclass; point it at your {base.__name__} class "
        "(raydra builds it and hands it to Lightning's Trainer)",
    )
    missing = [name for name in needed if getattr(cls, name) is getattr(base, name)]
    if missing:
        raise RaydraError(
            f"{group}._target_={target} does not define {' or '.join(missing)}, which training calls; add it to the class "
            "(docs/own-project.md shows a complete one)."
        )


def _lightning_subclass(target: str, key: str, base: type, use_instead: str, not_one: str) -> type:
    """The class `target` names, imported and checked to subclass `base`; one sentence if it
    subclasses the other Lightning package's `base` (`use_instead` says what to do) or not at all."""
    cls = import_target(target, key)
    if inspect.isclass(cls) and issubclass(cls, base):
        return cls
    other = _other_lightning_base(cls, base)
    if other:
        package = base.__module__.split(".")[0] + (".pytorch" if base.__module__.startswith("lightning.") else "")
        raise RaydraError(
            f"{key}._target_={target} subclasses {other}, but raydra and Ray's Lightning integration run {package}; {use_instead}."
        )
    raise RaydraError(f"{key}._target_={target} {not_one}.")


def _other_lightning_base(cls: Any, base: type) -> Optional[str]:
    """`pytorch_lightning.X` when `cls` subclasses the Lightning package raydra does not run."""
    if not inspect.isclass(cls):
        return None
    for klass in cls.__mro__:
        if klass.__name__ == base.__name__ and klass is not base:
            return f"{klass.__module__.split('.')[0]}.{base.__name__}"
    return None


def runtime_env(cfg: DictConfig, cwd: Optional[Path] = None) -> Optional[Dict[str, Any]]:
    """What ray.init gets as runtime_env: ray.runtime_env, plus the project's code as working_dir
    (and any src/-layout package as py_modules) when ray.working_dir asks for it; None for nothing."""
    env = cast(Dict[str, Any], OmegaConf.to_container(cfg.ray.runtime_env, resolve=True)) if cfg.ray.runtime_env else {}
    if "working_dir" in env:
        raise RaydraError(
            f"ray.runtime_env.working_dir={env['working_dir']}: set ray.working_dir instead (raydra adds its excludes there)."
        )
    cwd = (cwd or Path.cwd()).resolve()
    directory = _directory_to_ship(cfg, cwd)
    if directory is None:
        return env or None
    outputs = Path(str(cfg.paths.outputs)).expanduser()
    outputs = (outputs if outputs.is_absolute() else cwd / outputs).resolve()
    excludes = list(EXCLUDES)
    if outputs.is_relative_to(directory) and outputs != directory:
        excludes.append("/" + outputs.relative_to(directory).as_posix())
    env["working_dir"] = str(directory)
    env["excludes"] = excludes + list(env.get("excludes", []))
    # A package under src/ (or any folder below the project) is not importable from the working_dir's
    # root, which is what Ray puts on the workers' path: ship it on its own as well.
    nested = [str(p) for p in _project_packages(cfg, directory) if p.parent != directory]
    if nested:
        env["py_modules"] = list(env.get("py_modules", [])) + nested
    return env


def _directory_to_ship(cfg: DictConfig, cwd: Path) -> Optional[Path]:
    setting = cfg.ray.working_dir
    if setting is None:
        return None
    if setting != "auto":
        directory = Path(str(setting)).expanduser()
        directory = (directory if directory.is_absolute() else cwd / directory).resolve()
        if not directory.is_dir():
            raise RaydraError(f"ray.working_dir={setting} is not a directory; name your project's directory, or set ray.working_dir=auto.")
        return directory
    from raydra.private_apis.ray import submitted_job_working_dir

    # A local Ray's workers run on this machine and Ray puts the driver's directory on their path;
    # a job from `ray job submit --working-dir` already runs in its shipped copy.
    if not cfg.ray.address or submitted_job_working_dir():
        return None
    return cwd if _project_packages(cfg, cwd) else None


def _project_packages(cfg: DictConfig, directory: Path) -> List[Path]:
    """The files or package folders under `directory` that the run's `_target_`s come from."""
    found = []
    for target in targets(OmegaConf.to_container(cfg, resolve=False)):
        top = target.split(".")[0]
        if top == "raydra" or "${" in target:
            continue
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        locations = list(spec.submodule_search_locations or []) or ([spec.origin] if spec.origin else [])
        for location in locations:
            path = Path(location).resolve()
            if path.is_relative_to(directory) and not _installed(path) and path not in found:
                found.append(path)
    return found


def _installed(path: Path) -> bool:
    """An installed library (torch, transformers, ...), not the project's own code: it lives in a
    site-packages folder or an environment's prefix, even when that environment (a .venv) sits
    inside the project's directory."""
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return bool({"site-packages", "dist-packages"} & set(path.parts)) or any(path.is_relative_to(p) for p in prefixes)


# Where a run's classes come from when none is the user's: raydra's own and the libraries it runs on
# (transformers: the default learning-rate schedule, get_cosine_schedule_with_warmup).
# The metrics raydra's own models log (besides those every run's callbacks add: train/samples_per_s
# and the other train/* throughput figures), known before anything runs: hydra/sweeper=race refuses
# a metric they do not log. A user's model is checked as it trains (raydra.worker.contract).
OWN_MODEL_METRICS = {
    "raydra.models.vit.ViTClassifier": ("val/acc", "val/loss", "train/loss_epoch", "train/loss_step"),
    "raydra.models.stable_diffusion.StableDiffusion": ("val/loss", "train/loss_epoch", "train/loss_step"),
}
KNOWN_PACKAGES = ("raydra.", "torch.", "lightning.", "pytorch_lightning.", "lightning_fabric.", "transformers.")


def builds_only_known_classes(*nodes: Any) -> bool:
    """Whether every `_target_` in `nodes` (a spec's model, data, callbacks, logger) comes from
    KNOWN_PACKAGES: nothing of the user's runs on the workers (raydra.run.fit's lean imports)."""
    return all(target.startswith(KNOWN_PACKAGES) for node in nodes for target in targets(node))


def targets(node: Any) -> Iterator[str]:
    """Every `_target_` in a plain config tree (a spec's group, a container), outside Hydra's own node."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "hydra":
                continue
            if key == "_target_" and isinstance(value, str):
                yield value
            else:
                yield from targets(value)
    elif isinstance(node, list):
        for value in node:
            yield from targets(value)


def shadowed_configs(config_dirs: List[str], raydra_conf: Path) -> Optional[str]:
    """One sentence naming the files of the user's config directories that are never read because
    raydra ships a file of the same group and name, which Hydra finds first (its primary config's
    directory comes before any --config-dir); None when there are none. A project copied from
    lightning-hydra-template may hold trainer/default.yaml or callbacks/early_stopping.yaml."""
    hidden = []
    for directory in config_dirs:
        root = Path(directory)
        if root.resolve() == raydra_conf.resolve():
            continue
        for path in sorted(root.glob("*/**/*.yaml")):
            relative = path.relative_to(root)
            if (raydra_conf / relative).is_file():
                hidden.append(str(path))
    if not hidden:
        return None
    return (
        f"{', '.join(hidden)} {'is' if len(hidden) == 1 else 'are'} not read: raydra's own file of the same group and name comes "
        "first in Hydra's search path; rename yours (e.g. callbacks/my_early_stopping.yaml) and select that name, "
        "or set what differs in an experiment/ file (docs/from-lightning-hydra-template.md)."
    )
