"""The user's Lightning callbacks (root key `callbacks`) and loggers, as the driver prepares them
before the run's record is written and Ray starts.

    resolve_and_validate(cfg, overrides)
        what a run checks before Ray starts: take_over_callbacks, then the schema's checks, then the user's classes
    take_over_callbacks(cfg, overrides)
        what raydra does itself takes the place of an entry that would do it a second time: a
        ModelCheckpoint sets checkpoint.* (monitor, mode, top-k, frequency), so one checkpointing
        system runs, raydra's, which resume and Ray's fault tolerance rely on; a progress bar gives
        way to raydra's progress lines

Whether each entry is a Callback (or Logger) taking its keys is project.check_classes' job; the
workers build what is left after raydra's own callbacks (raydra.worker.loop).
"""

import copy
import logging
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from raydra.config.project import RAYDRA_LOGGERS, check_classes, entries, target_class
from raydra.errors import RaydraError

log = logging.getLogger("raydra")

# A ModelCheckpoint's arguments and the checkpoint.* key each one sets.
DRIVES = {
    "monitor": "monitor",
    "mode": "mode",
    "save_top_k": "num_to_keep",
    "every_n_epochs": "every_n_epochs",
    "every_n_train_steps": "every_n_steps",
}
# What raydra's run record decides itself: where checkpoints go and what they are called, and that
# the last one is always kept, whole (optimizer and loops too, for resume).
LEFT_TO_THE_RECORD = ("dirpath", "filename", "save_last", "save_weights_only", "auto_insert_metric_name", "save_on_train_epoch_end")


def resolve_and_validate(
    cfg: DictConfig, overrides: Sequence[str] = (), own_classes: Optional[bool] = None, check_arguments: bool = True
) -> DictConfig:
    """What a run (a single run, a sweep, each multirun job as its launcher checks it first) checks
    before Ray starts, on `cfg` in place: take_over_callbacks, then the schema's checks (raydra.config.checks.validate),
    then the user's classes with every `_target_`'s arguments (project.check_classes). With
    `own_classes`, the arguments of raydra's own model and data classes too (raydra.config.arguments), which
    import Lightning; None: where this process imports them anyway, local mode. Elsewhere the
    workers check them before building them: on the driver of a Ray run the import delayed the first
    step by seconds. `check_arguments=False`: the `_target_`s' arguments are left to the caller (raydra.run.prepare).
    Returns the config as composed, before take_over_callbacks changed it: what a resumed run is compared with
    its record by."""
    from raydra.config.checks import validate

    composed = copy.deepcopy(cfg)
    take_over_callbacks(cfg, overrides)
    validate(cfg)
    # Last: it imports the user's classes, which is worth doing only for an otherwise valid config.
    check_classes(cfg, own_classes=own_classes or own_classes is None and cfg.scale.num_workers == 0, check_arguments=check_arguments)
    return composed


def take_over_callbacks(cfg: DictConfig, overrides: Sequence[str] = ()) -> None:
    """Turn the callbacks raydra stands in for into its own settings, in place. `overrides`: the
    command line's, so that an explicitly given checkpoint.* value that a ModelCheckpoint would
    change is refused rather than silently replaced. Idempotent: what it handles leaves `callbacks`."""
    for name, node in entries(cfg, "callbacks"):
        if not OmegaConf.is_dict(node) or not node.get("_target_"):
            continue  # project.check_classes names it
        # Here, with a callback to look at: the driver of a run without any never imports Lightning.
        from raydra.lightning import pl

        key = f"callbacks.{name}"
        cls = target_class(node, key, "callbacks")
        if issubclass(cls, pl.callbacks.ProgressBar):
            log.info(
                f"{key} ({cls.__name__}) left out: raydra prints one progress line per epoch itself "
                "(a progress bar on every worker would interleave on the console)."
            )
        elif issubclass(cls, pl.callbacks.ModelCheckpoint):
            _drive_checkpointing(cfg, key, node, overrides)
        elif issubclass(cls, pl.callbacks.Checkpoint):
            raise RaydraError(
                f"{key}._target_={node._target_} is a checkpointing callback, and raydra's own checkpointing (checkpoint.*) "
                "is what resume and Ray's restarts rely on; drop it and set checkpoint.* (or use a ModelCheckpoint, which sets them)."
            )
        else:
            continue
        with open_dict(cfg):
            del cfg.callbacks[name]
    for name in RAYDRA_LOGGERS:
        node = (cfg.get("logger") or {}).get(name)
        if isinstance(node, DictConfig) and node.get("_target_"):
            log.info(
                f"logger.{name} is raydra's own ({'metrics.csv in the run directory, what raydra compare reads' if name == 'csv' else 'W&B, one run per raydra run'}): "
                f"its _target_ {node._target_} is not used (name another logger to build yours)."
            )


def _drive_checkpointing(cfg: DictConfig, key: str, node: DictConfig, overrides: Sequence[str]) -> None:
    settings = {argument: node.get(argument) for argument in DRIVES if node.get(argument) is not None}
    if settings.get("monitor") is None:
        # Without a monitor ModelCheckpoint keeps the latest; raydra keeps ranking by its own.
        settings.pop("mode", None)
    if node.get("train_time_interval") is not None:
        raise RaydraError(
            f"{key}.train_time_interval={node.train_time_interval}: raydra checkpoints every N epochs or optimizer steps; "
            f"set {key}.every_n_train_steps (or checkpoint.every_n_steps) instead."
        )
    explicit = _explicit_checkpoint_keys(cfg, overrides)
    changes: Dict[str, Any] = {}
    for argument, value in settings.items():
        target = DRIVES[argument]
        value = _as_checkpoint_value(key, argument, value)
        if value is _UNSET:
            continue
        current = cfg.checkpoint[target]
        if target in explicit and current != value:
            raise RaydraError(
                f"{key}.{argument}={settings[argument]} and checkpoint.{target}={current} disagree: a ModelCheckpoint in callbacks "
                f"sets checkpoint.{target}, so keep one of the two (or make them agree)."
            )
        changes[target] = value
    with open_dict(cfg):
        for target, value in changes.items():
            cfg.checkpoint[target] = value
    shown = ", ".join(f"checkpoint.{k}={v}" for k, v in changes.items()) or "nothing"
    ignored = [argument for argument in LEFT_TO_THE_RECORD if node.get(argument) is not None]
    log.info(
        f"{key} ({node._target_}) drives raydra's checkpointing: {shown}"
        + (
            f"; {', '.join(ignored)} are the run record's business (checkpoints/ of the run directory, the last one always kept)"
            if ignored
            else ""
        )
        + "."
    )


_UNSET = object()


def _as_checkpoint_value(key: str, argument: str, value: Any) -> Any:
    if argument == "save_top_k":
        if value == -1:
            return None  # every checkpoint
        if value < 1:
            raise RaydraError(
                f"{key}.save_top_k={value} would keep no checkpoint, which resume and Ray's restarts need; keep at least 1 (or -1 for all)."
            )
    if argument in ("every_n_epochs", "every_n_train_steps") and value == 0:
        return _UNSET  # Lightning's "not at this frequency": the other one (or every epoch) applies
    return value


def _explicit_checkpoint_keys(cfg: DictConfig, overrides: Sequence[str]) -> List[str]:
    """checkpoint.* keys the user set: on the command line, or (in a YAML, an experiment) to a value
    other than the schema's default."""
    from raydra.config.schema import CheckpointConfig

    defaults = OmegaConf.structured(CheckpointConfig)
    typed = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    return [key for key in DRIVES.values() if f"checkpoint.{key}" in typed or cfg.checkpoint[key] != defaults[key]]
