"""The checks a composed config must pass before a run starts, each problem one sentence naming its
key (validate, problems_of), and what Hydra refuses while composing said the same way
(composition_error).
"""

import dataclasses
import difflib
import importlib.util
import math
import re
import typing
from typing import Any, Dict, Iterator, List, Optional, Tuple, cast

from omegaconf import DictConfig, OmegaConf

from raydra.config.schema import (
    GPU_ONLY_PRECISIONS,
    LOADERS,
    PRECISIONS,
    SCHEDULERS,
    SEARCHES,
    TEMPLATE_TRAINER_KEYS,
    data_loader,
    is_elastic,
    is_worker_count,
    worker_range,
)
from raydra.errors import RaydraError
from raydra.records.wandb_run import problems as wandb_problems


def _check_num_workers(cfg: DictConfig) -> Iterator[str]:
    """scale.num_workers is a count, or [min, max] with 1 <= min <= max."""
    value = cfg.scale.num_workers
    shown = f"scale.num_workers={_shown(value)}"
    if not is_worker_count(value):
        yield (f"{shown} is neither a count of workers nor [min, max]; use e.g. scale.num_workers=4 or scale.num_workers=[2,4].")
        return
    if isinstance(value, int):
        if value < 0:
            yield (f"{shown} is negative; ask for 1 or more workers, or 0 for local mode.")
        return
    low, high = worker_range(value)
    if low < 1:
        yield (f"{shown} must start at 1 or more workers (local mode, 0, cannot grow); use e.g. [1,{max(high, 1)}].")
    if low > high:
        yield (f"{shown} has min {low} above max {high}; write it as [min, max], e.g. [{high},{low}].")
    if cfg.get("tune") is not None:
        yield (
            f"{shown} (elastic) cannot run inside a Tune sweep, whose trials reserve a fixed share of the cluster; "
            f"give a plain count, e.g. scale.num_workers={high}, or drop tune."
        )
    if cfg.failure.max_failures == 0:
        yield (
            f"{shown} continues after losing a node by restarting its workers, which failure.max_failures=0 forbids; "
            "set failure.max_failures to the losses to survive (e.g. 3, or -1 for no limit)."
        )


def _shown(value: Any) -> str:
    """A list as it is typed on the command line ([1,2]), anything else as it is."""
    if OmegaConf.is_list(value) or isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def validate(cfg: DictConfig) -> None:
    """Checks that need more than one key or a value range. Raises one RaydraError that names every
    problem of the config, one sentence each (each naming its key), so that one attempt shows them all."""
    problems = list(problems_of(cfg))
    if problems:
        raise RaydraError(" ".join(problems))


def problems_of(cfg: DictConfig) -> Iterator[str]:
    """Each problem validate() finds in `cfg`, as a sentence that names its key, in a fixed order.
    A number that is not finite is said once, as that: the range checks after it would call
    `nan` in range or not as their comparisons fall, and say it again."""
    unfinite = list(_non_finite(cfg))
    said = tuple(f"{key}=" for key, _ in unfinite for key in _and_parents(key))
    yield from _check_unknown_keys(cfg)
    for key, value in unfinite:
        default = _default_of(cfg, key)
        yield f"{key}={value} is not a finite number; give it one{f', e.g. {key}={default}' if default is not None else ''}."
    yield from (problem for problem in _range_problems(cfg) if not problem.startswith(said))


def _non_finite(cfg: DictConfig) -> Iterator[Tuple[str, float]]:
    """(key, value) of every number that is not finite (nan, inf, -inf: Hydra's grammar reads
    them as floats) under the sections the schema types: `failure.step_timeout_min_s=nan` would
    turn the watchdog's deadlines into NaN, and `inf` reach summary.json as a number JSON has not.
    The user's groups (model, data, logger, callbacks) are their classes' arguments."""
    plain = cast(Dict[str, Any], OmegaConf.to_container(cfg, resolve=False))
    yield from _numbers_not_finite({key: value for key, value in plain.items() if key not in OPEN_GROUPS})


def _numbers_not_finite(node: Any, where: str = "") -> Iterator[Tuple[str, float]]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        path = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key)
        if isinstance(value, float) and not math.isfinite(value):
            yield path, value
        else:
            yield from _numbers_not_finite(value, path)


def _default_of(cfg: DictConfig, key: str) -> Optional[float]:
    """The schema's default number for `key`, if its section is a schema and the default is a number."""
    parent, _, leaf = key.rpartition(".")
    schema = OmegaConf.get_type(OmegaConf.select(cfg, parent) if parent else cfg)
    if not dataclasses.is_dataclass(schema):
        return None
    found = {f.name: f.default for f in dataclasses.fields(schema)}.get(leaf)
    return found if isinstance(found, (int, float)) and not isinstance(found, bool) else None


# The root keys that are a user's classes' arguments (raydra.config.arguments checks those), and Hydra's own node.
OPEN_GROUPS = ("model", "data", "logger", "callbacks", "hydra")


def _and_parents(key: str) -> List[str]:
    """`key` and the keys it is inside of below its section: trainer.max_time.hours, trainer.max_time;
    scale.num_workers[1], scale.num_workers."""
    parts = re.sub(r"\[\d+\]", "", key).split(".")
    return [key, *(".".join(parts[:n]) for n in range(2, len(parts) + 1))]


def _range_problems(cfg: DictConfig) -> Iterator[str]:
    """problems_of's checks of values, ranges and keys together."""
    scale, trainer, ckpt = cfg.scale, cfg.trainer, cfg.checkpoint
    yield from _check_template_keys(cfg)
    yield from _check_num_workers(cfg)
    countable = is_worker_count(scale.num_workers)
    if scale.num_workers == 0:
        yield from _validate_local_mode(cfg)
    if countable and is_elastic(scale.num_workers):
        yield from _positive("scale.resize_check_s", scale.resize_check_s)
    yield from _positive("scale.cpus_per_worker", scale.cpus_per_worker)
    if scale.use_gpu:
        yield from _positive("scale.gpus_per_worker", scale.gpus_per_worker)
    for key, value in scale.resources_per_worker.items():
        if value < 0:
            yield f"scale.resources_per_worker.{key}={value} is negative; ask for 0 or more."
    if scale.placement_strategy not in {"PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"}:
        yield (
            f"scale.placement_strategy={scale.placement_strategy} is not a Ray placement strategy; "
            "use PACK, SPREAD, STRICT_PACK or STRICT_SPREAD."
        )
    if trainer.max_epochs < 1 and trainer.max_steps < 1:
        yield "trainer.max_epochs and trainer.max_steps are both below 1; set one of them to a positive count."
    yield from _positive("trainer.accumulate_grad_batches", trainer.accumulate_grad_batches)
    yield from _positive("trainer.check_val_every_n_epoch", trainer.check_val_every_n_epoch)
    yield from _positive("trainer.log_every_n_steps", trainer.log_every_n_steps)
    if not 0 < trainer.val_check_interval <= 1:
        yield f"trainer.val_check_interval={trainer.val_check_interval} must be a fraction of an epoch in (0, 1]."
    precision = str(trainer.precision)
    if precision not in PRECISIONS:
        yield f"trainer.precision={precision} is not a Lightning precision; use one of 32, bf16-mixed, 16-mixed, bf16-true."
    if precision in GPU_ONLY_PRECISIONS and not scale.use_gpu:
        yield (
            f"trainer.precision={precision} needs GPU workers; on CPU use trainer.precision=bf16-mixed or 32, or set scale.use_gpu=true."
        )
    if trainer.benchmark not in ("auto", True, False, None):
        yield f"trainer.benchmark={trainer.benchmark} must be auto, true, false or null."
    yield from _validate_strategy(cfg.strategy, scale, precision)
    if ckpt.num_to_keep is not None and ckpt.num_to_keep < 1:
        yield f"checkpoint.num_to_keep={ckpt.num_to_keep} must be at least 1, or null to keep all."
    if ckpt.upload not in {"auto", "background", "wait"}:
        yield f"checkpoint.upload={ckpt.upload} must be auto, background or wait."
    if ckpt.mode not in {"min", "max"}:
        yield f"checkpoint.mode={ckpt.mode} must be min or max."
    if ckpt.every_n_epochs is not None and ckpt.every_n_steps is not None:
        yield (
            f"checkpoint.every_n_epochs={ckpt.every_n_epochs} and checkpoint.every_n_steps={ckpt.every_n_steps} are both set; "
            "keep one and set the other to null."
        )
    for key in ("every_n_epochs", "every_n_steps"):
        if ckpt[key] is not None:
            yield from _positive(f"checkpoint.{key}", ckpt[key])
    yield from _check_lightning_unions(trainer)
    for key, node in (("ray.runtime_env", cfg.ray.runtime_env), ("strategy.config", cfg.strategy.get("config"))):
        if node is not None and not OmegaConf.is_dict(node):
            yield f"{key}={_shown(node)} is not a dict; give it one, e.g. {key}={{name: value}} (or leave it out)."
    if cfg.failure.max_failures < -1:
        yield f"failure.max_failures={cfg.failure.max_failures} must be -1 (no limit) or a count from 0."
    for key in ("startup_timeout_s", "step_timeout_factor", "step_timeout_min_s", "checkpoint_timeout_s", "straggler_window"):
        yield from _positive(f"failure.{key}", cfg.failure[key])
    if cfg.failure.straggler_threshold < 0:
        yield f"failure.straggler_threshold={cfg.failure.straggler_threshold} must be a share of a step from 0 (0: never name stragglers), e.g. 0.2."
    for key in ("price_per_hour", "price_per_gpu_hour", "price_per_cpu_hour"):
        if cfg.ledger[key] is not None and cfg.ledger[key] < 0:
            yield f"ledger.{key}={cfg.ledger[key]} is not a price; give what an hour costs, e.g. ledger.{key}=2.5 (or null for none)."
    yield from _validate_slurm(cfg.slurm)
    yield from _validate_wandb(cfg)
    if cfg.get("tune") is not None:
        yield from _validate_tune(cfg.tune)
        if cfg.tune.scheduler == "pbt":
            yield from _validate_pbt(cfg.tune, cfg.checkpoint)
    loader = cfg.data.get("loader")
    if loader is not None:
        if loader not in LOADERS:
            yield f"data.loader={loader} is not a loader raydra knows; use one of {', '.join(LOADERS)}."
        if loader == "ray_data" and trainer.num_sanity_val_steps != 0:
            # A sanity pass reads part of a split validation shard; Ray's split coordinator then
            # waits for the rest of that epoch, and the first real validation never starts.
            yield (
                f"trainer.num_sanity_val_steps={trainer.num_sanity_val_steps} with data.loader=ray_data would stall on "
                "the split validation shard; set trainer.num_sanity_val_steps=0."
            )
    batch_size = cfg.data.get("batch_size")
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            yield f"data.batch_size={batch_size} must be a whole number of samples (the global batch), e.g. data.batch_size=32."
        elif batch_size <= 0:
            yield from _positive("data.batch_size", batch_size)
        elif countable:
            yield from _check_batch_splits(batch_size, scale.num_workers)


# A duration as Lightning's Timer (trainer.max_time) reads one: "DD:HH:MM:SS", or a dict of timedelta's arguments.
DURATION = re.compile(r"\d+:\d\d:\d\d:\d\d")


TIMEDELTA_KEYS = ("weeks", "days", "hours", "minutes", "seconds", "milliseconds", "microseconds")


def _check_lightning_unions(trainer: Any) -> Iterator[str]:
    """The trainer keys that Lightning takes in more than one type (typed Any here), read as
    Lightning reads them, so that a wrong one is named now rather than by every worker's Trainer."""
    runs = trainer.fast_dev_run
    if not (isinstance(runs, bool) or isinstance(runs, int) and runs >= 0):
        yield f"trainer.fast_dev_run={_shown(runs)} must be true, false or a number of batches from 0, e.g. trainer.fast_dev_run=5."
    limit = trainer.max_time
    if limit is not None and not (
        isinstance(limit, str)
        and DURATION.fullmatch(limit.strip())
        or isinstance(limit, DictConfig)
        and all(k in TIMEDELTA_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in limit.items())
    ):
        yield (
            f"trainer.max_time={_shown(limit)} is not a duration; give DD:HH:MM:SS (e.g. trainer.max_time=00:12:00:00) "
            "or a dict of timedelta's arguments (e.g. 'trainer.max_time={hours: 12}')."
        )
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "overfit_batches"):
        value = trainer[key]
        if value is None and key != "overfit_batches":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value <= 1 or value > 1 and value % 1 == 0):
            yield f"trainer.{key}={_shown(value)} must be a fraction in [0, 1] or a whole number of batches, e.g. trainer.{key}=0.25 or trainer.{key}=10."


def _check_unknown_keys(cfg: DictConfig, where: str = "") -> Iterator[str]:
    """A key that no schema field names, under the root or a section the schema types (scale,
    trainer, checkpoint, ...): Hydra refuses `scale.num_workerz=2` itself, but `+scale.num_workerz=2`
    adds the key, which nothing would ever read. The open groups (model, data, logger, callbacks)
    are the user's classes' arguments, which project.check_classes checks against their signatures."""
    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return
    fields = [f.name for f in dataclasses.fields(schema)]
    for key in cfg.keys():
        path = f"{where}{key}"
        if not where and key == "hydra":
            continue  # Hydra's own node, in the config a launcher composes for each job
        if key not in fields:
            yield _unknown_key(path, fields, "a `+` adds it, but nothing reads it")
        elif OmegaConf.is_dict(cfg._get_node(key)):
            yield from _check_unknown_keys(cfg[key], f"{path}.")


def _unknown_key(path: str, fields: List[str], why: str) -> str:
    """`path` names no field of its section (whose fields are `fields`), as one sentence."""
    where, _, key = path.rpartition(".")
    close = difflib.get_close_matches(key, fields, n=1)
    hint = f"did you mean {where + '.' if where else ''}{close[0]}? " if close else ""
    return f"{path} is not a key raydra knows ({why}); {hint}python train.py --cfg job lists the keys{' of ' + where if where else ''}."


def composition_error(error: BaseException) -> Optional[str]:
    """What OmegaConf refused while Hydra composed the config (a command-line override or a config
    file), for a key of the schema's sections: a value of the wrong type, or a key the section does
    not have, said in one sentence naming the full key and what it takes. None for anything else."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ConfigTypeError, ValidationError

    from raydra.config.arguments import UNKNOWN, checkable, phrase, shown

    path = getattr(error, "full_key", None)
    owner = getattr(error, "object_type", None)
    if not path:
        return None
    if isinstance(error, (ConfigAttributeError, ConfigKeyError)) and dataclasses.is_dataclass(owner):
        return _unknown_key(
            path, [f.name for f in dataclasses.fields(owner)], f"{path.rpartition('.')[0] or 'the root'} has a fixed set of keys"
        )
    if isinstance(error, ConfigTypeError) and owner is dict:
        # Something else merged into a dict (a list for scale.resources_per_worker): the value is not kept.
        expected = checkable(getattr(error, "ref_type", None))
        said = phrase(expected if expected is not UNKNOWN else dict)
        reason = str(error).splitlines()[0].rstrip(".")
        return f"{path} takes {said} ({reason[:1].lower()}{reason[1:]}); give it one, e.g. {path}={{name: value}}."
    if not isinstance(error, ValidationError):
        return None
    expected, example = UNKNOWN, None
    if dataclasses.is_dataclass(owner):
        found = {f.name: f for f in dataclasses.fields(owner)}.get(str(error.key))
        if found is not None:
            expected = checkable(found.type)
            default = found.default_factory() if found.default_factory is not dataclasses.MISSING else found.default
            example = default if isinstance(default, (bool, int, float, str)) else None
    elif typing.get_args(getattr(error, "ref_type", None)):  # an item of a typed dict or list
        expected = checkable(typing.get_args(error.ref_type)[-1])
    value = shown(error.value)
    if expected is UNKNOWN:
        reason = str(error).splitlines()[0].rstrip(".")
        return f"{path}={value}: {reason}; python train.py --cfg job shows what {path} holds."
    said = phrase(expected)
    return f"{path}={value} is not {said}; give it {said}{f', e.g. {path}={shown(example)}' if example is not None else ''}."


def _check_template_keys(cfg: DictConfig) -> Iterator[str]:
    """lightning-hydra-template's trainer keys whose job raydra does through its own keys: one
    sentence naming raydra's key for each. Read unresolved: `default_root_dir: ${paths.output_dir}`
    resolves to null until the run starts."""
    trainer = cast(Dict[str, Any], OmegaConf.to_container(cfg.trainer, resolve=False))
    found = [(key, trainer[key]) for key in TEMPLATE_TRAINER_KEYS if trainer.get(key) is not None]
    if found:
        named = ", ".join(f"trainer.{key}={_shown(value)}" for key, value in found)
        instead = "; ".join(f"for trainer.{key}, {TEMPLATE_TRAINER_KEYS[key]}" for key, _ in found)
        yield (f"{named}: raydra sets {'these' if len(found) > 1 else 'this'} itself; {instead} (docs/from-lightning-hydra-template.md).")
    if cfg.paths.output_dir is not None:
        yield (
            f"paths.output_dir={cfg.paths.output_dir} is the run's own directory, which raydra fills in; choose where runs go "
            "with paths.outputs (or hydra.run.dir) and leave paths.output_dir unset."
        )


def _check_batch_splits(batch_size: int, num_workers: Any) -> Iterator[str]:
    """The global batch must split evenly over every size the group can take, so an elastic run is
    refused here, before it starts, rather than at a resize."""
    low, high = worker_range(num_workers)
    sizes = range(max(1, low), max(1, high) + 1)
    uneven = [n for n in sizes if batch_size % n]
    if not uneven:
        return
    if not is_elastic(num_workers):
        yield (
            f"data.batch_size={batch_size} (the global batch) does not split evenly over "
            f"scale.num_workers={num_workers}; pick a multiple of {num_workers}."
        )
        return
    every = math.lcm(*sizes)
    yield (
        f"data.batch_size={batch_size} (the global batch) does not split evenly over {', '.join(map(str, uneven))} "
        f"worker(s), sizes scale.num_workers={_shown(num_workers)} may take; pick a multiple of {every}, or narrow the range."
    )


def _validate_local_mode(cfg: DictConfig) -> Iterator[str]:
    """scale.num_workers=0 trains in the driver's process on one device, without Ray: what needs
    workers, a cluster or storage for them is refused by name."""
    why = "scale.num_workers=0 (local mode) trains in this process on one device"
    if cfg.strategy.name != "ddp":
        yield (f"{why}; strategy={cfg.strategy.name} shards over workers: keep strategy=ddp or set scale.num_workers to 1 or more.")
    if cfg.get("tune") is not None:
        yield (f"{why}; a Tune sweep runs its trials on Ray workers: set scale.num_workers to 1 or more, or drop tune.")
    if cfg.paths.storage:
        yield (f"{why} and writes its record into its run directory; drop paths.storage or set scale.num_workers to 1 or more.")
    if data_loader(cfg.data) == "ray_data":
        yield (f"{why}; data.loader=ray_data streams from Ray Data tasks: use data.loader=dataloader or scale.num_workers>=1.")


def _validate_strategy(strategy: Any, scale: Any, precision: str) -> Iterator[str]:
    if strategy.name == "ddp" and strategy.bucket_cap_mb is not None:
        yield from _positive("strategy.bucket_cap_mb", strategy.bucket_cap_mb)
    if strategy.name == "fsdp":
        if strategy.sharding not in {"full", "grad_op", "hybrid"}:
            yield (f"strategy.sharding={strategy.sharding} is not an FSDP sharding; use full, grad_op or hybrid.")
        if strategy.checkpoint_layout not in {"sharded", "full"}:
            yield (f"strategy.checkpoint_layout={strategy.checkpoint_layout} must be sharded or full.")
        if strategy.mixed_precision not in {None, "bf16", "fp16"}:
            yield (f"strategy.mixed_precision={strategy.mixed_precision} must be null, bf16 or fp16.")
        if strategy.cpu_offload and not scale.use_gpu:
            yield (
                "strategy.cpu_offload=true moves GPU memory to the host, but these workers are CPU workers; "
                "drop it, or set scale.use_gpu=true."
            )
        if precision in {"16-mixed", "16-true"}:
            # Lightning's fp16 loss scaler checks only this worker's gradient shard for overflow, so the
            # workers would disagree on which steps to skip.
            yield (
                f"trainer.precision={precision} is not supported with strategy=fsdp; use trainer.precision=bf16-mixed, "
                "or strategy.mixed_precision=fp16 with trainer.precision=32."
            )
    if strategy.name == "deepspeed":
        if strategy.stage not in {1, 2, 3}:
            yield (f"strategy.stage={strategy.stage} is not a ZeRO stage; use 1, 2 or 3.")
        if strategy.offload_parameters and strategy.stage != 3:
            yield ("strategy.offload_parameters=true needs strategy.stage=3 (only stage 3 shards parameters).")
        if not scale.use_gpu:
            yield (
                "strategy=deepspeed runs on CUDA GPUs only (Lightning's DeepSpeed integration refuses CPU devices); "
                "use strategy=fsdp for sharded training on CPU workers, or scale=gpu."
            )
        if importlib.util.find_spec("deepspeed") is None:
            yield ("strategy=deepspeed needs the deepspeed package; install it with `pip install raydra[deepspeed]`.")


def _validate_wandb(cfg: DictConfig) -> Iterator[str]:
    """logger.wandb's keys, as W&B's logger takes them (raydra.records.wandb_run.problems), and a
    log_model=all that would log one worker's shard of a sharded checkpoint as the model."""
    logger = cfg.get("logger")
    wandb = logger.get("wandb") if OmegaConf.is_dict(logger) else None
    if not isinstance(wandb, DictConfig):
        return
    yield from wandb_problems(OmegaConf.to_container(wandb, resolve=False))
    sharded = cfg.strategy.name == "deepspeed" or (cfg.strategy.name == "fsdp" and cfg.strategy.checkpoint_layout == "sharded")
    several = is_worker_count(cfg.scale.num_workers) and worker_range(cfg.scale.num_workers)[1] > 1
    if wandb.get("log_model") == "all" and sharded and several:
        yield (
            f"logger.wandb.log_model=all logs each checkpoint as rank 0 saves it, but strategy={cfg.strategy.name} saves one shard "
            "per worker; set strategy.checkpoint_layout=full (fsdp), or logger.wandb.log_model=true (the best and last, whole, at the end)."
        )


def _validate_slurm(slurm: Any) -> Iterator[str]:
    yield from _positive("slurm.nodes", slurm.nodes)
    if slurm.cpus_per_node is not None:
        yield from _positive("slurm.cpus_per_node", slurm.cpus_per_node)
    if slurm.gpus_per_node is not None and slurm.gpus_per_node < 0:
        yield f"slurm.gpus_per_node={slurm.gpus_per_node} is negative; ask for 0 or more, or null for what the workers need."
    if slurm.notice_before_s is not None:
        yield from _positive("slurm.notice_before_s", slurm.notice_before_s)
    yield from _positive("slurm.join_timeout_s", slurm.join_timeout_s)


def _validate_tune(tune: Any) -> Iterator[str]:
    if tune.num_samples < 1:
        yield (f"tune.num_samples={tune.num_samples} must be at least 1.")
    if tune.search not in SEARCHES:
        yield (f"tune.search={tune.search} is not a search raydra knows; use one of {', '.join(SEARCHES)}.")
    if tune.scheduler not in SCHEDULERS:
        yield (f"tune.scheduler={tune.scheduler} is not a scheduler raydra knows; use one of {', '.join(SCHEDULERS)}.")
    if tune.mode is not None and tune.mode not in {"min", "max"}:
        yield (f"tune.mode={tune.mode} must be min or max (or null for checkpoint.mode).")
    if tune.max_concurrent is not None:
        yield from _positive("tune.max_concurrent", tune.max_concurrent)
    yield from _positive("tune.asha.grace_period", tune.asha.grace_period)
    if tune.asha.reduction_factor <= 1:
        yield (f"tune.asha.reduction_factor={tune.asha.reduction_factor} must be above 1.")
    if tune.asha.max_t is not None and tune.asha.max_t < tune.asha.grace_period:
        yield (f"tune.asha.max_t={tune.asha.max_t} is below tune.asha.grace_period={tune.asha.grace_period}.")
    # PBT's settings are checked whatever the scheduler, as ASHA's are.
    pbt = tune.pbt
    yield from _positive("tune.pbt.perturbation_interval", pbt.perturbation_interval)
    if not 0 < pbt.quantile_fraction <= 0.5:
        yield (
            f"tune.pbt.quantile_fraction={pbt.quantile_fraction} must be above 0 and at most 0.5 (the top and bottom shares of the trials)."
        )
    if not 0 <= pbt.resample_probability <= 1:
        yield (f"tune.pbt.resample_probability={pbt.resample_probability} is not a probability; give one from 0 to 1.")
    if not OmegaConf.is_dict(pbt.mutations):
        yield f"tune.pbt.mutations={_shown(pbt.mutations)} is not a dict; give it one as tune.space, or {{}} to perturb every key of tune.space."
    if not OmegaConf.is_dict(tune.space):
        yield f"tune.space={_shown(tune.space)} is not a dict; give it one, e.g. 'tune.space={{model.optimizer.lr: {{loguniform: [1e-4, 1e-1]}}}}'."
    elif not tune.space and not tune.resume:
        yield (
            "tune.space is empty, so there is nothing to search; add keys, e.g. "
            "'tune.space={model.optimizer.lr: {loguniform: [1e-4, 1e-1]}}'."
        )


def _validate_pbt(tune: Any, checkpoint: Any) -> Iterator[str]:
    """PBT copies a trial at the epochs its trials checkpoint: tune.pbt.perturbation_interval (epochs)
    must fall on them, and a mid-epoch cadence (every_n_steps) gives no epoch a checkpoint for sure."""
    pbt = tune.pbt
    if tune.search == "optuna":
        # Ray's PBT refuses a search algorithm that learns from results: it changes the trials' values itself.
        yield (
            "tune.scheduler=pbt chooses each trial's next values itself, so it cannot run under tune.search=optuna; use tune.search=random."
        )
    if checkpoint.every_n_steps is not None:
        yield (
            f"tune.scheduler=pbt copies trials at epoch ends, but checkpoint.every_n_steps={checkpoint.every_n_steps} checkpoints "
            "inside epochs; drop it and set checkpoint.every_n_epochs (a divisor of tune.pbt.perturbation_interval) instead."
        )
    every = checkpoint.every_n_epochs or 1
    if pbt.perturbation_interval > 0 and pbt.perturbation_interval % every:
        yield (
            f"tune.pbt.perturbation_interval={pbt.perturbation_interval} is not a multiple of checkpoint.every_n_epochs={every}: "
            "PBT can only copy a trial at an epoch it checkpointed; make the interval a multiple of it."
        )


def _positive(key: str, value: float) -> Iterator[str]:
    if value <= 0:
        yield (f"{key}={value} must be positive.")
