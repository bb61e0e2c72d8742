"""tune.space: the search space as written in config, turned into Ray Tune domains and checked
against the composed config (every key exists, every value makes a valid run) before any trial starts."""

from typing import Any, Dict, List, Tuple

import ray.tune
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from raydra.config.checks import validate
from raydra.config.keys import ABSENT
from raydra.errors import RaydraError
from raydra.run.prepare import writable

# Tune's sampling functions by the name used in tune.space; `grid` is tune.grid_search.
DISTRIBUTIONS = (
    "uniform",
    "quniform",
    "loguniform",
    "qloguniform",
    "randn",
    "qrandn",
    "randint",
    "qrandint",
    "lograndint",
    "qlograndint",
    "choice",
    "grid",
)


def parse_space(cfg: DictConfig, node: str = "space") -> Dict[str, Tuple[str, List[Any]]]:
    """tune.space (or another node of tune written as it is, `node`: pbt.mutations) as {dotted key:
    (distribution, arguments)}, checked against the composed config.

    Keys may be dotted (`model.optimizer.lr: {...}`) or nested (`model: {dropout: {...}}`, which is
    what `+tune.space.model.dropout=...` makes); a key set to null is left out of the search. A key
    with several distributions takes the last.
    """
    space: Dict[str, Tuple[str, List[Any]]] = {}
    name_of = f"tune.{node}"

    def walk(node: Dict[str, Any], prefix: str) -> None:
        for key, spec in node.items():
            path = f"{prefix}{key}"
            if spec is None:
                continue
            target = OmegaConf.select(cfg, path, default=ABSENT, throw_on_resolution_failure=False)
            if target is ABSENT:
                raise RaydraError(
                    f"{name_of}: {path} is not a key of the composed config; check its spelling "
                    "(python train.py --cfg job prints every key)."
                )
            if isinstance(target, DictConfig):
                if not isinstance(spec, dict):
                    raise RaydraError(f"{name_of}: {path} is a group of keys, not one value; search a key inside it.")
                walk(spec, path + ".")
                continue
            if not isinstance(spec, dict) or not spec:
                raise RaydraError(
                    f"{name_of}.{path} must be a distribution and its arguments, e.g. {{loguniform: [1e-4, 1e-1]}} or {{choice: [32, 64]}}."
                )
            # Hydra merges a dict given on the command line into the YAML's instead of replacing
            # it, so `'tune.space={lr: {choice: [...]}}'` over a YAML `{loguniform: [...]}` leaves
            # both; the one given last (the command line's) is the one meant.
            name, args = list(spec.items())[-1]
            if name not in DISTRIBUTIONS:
                raise RaydraError(f"{name_of}.{path}: {name} is not a distribution raydra knows; use one of {', '.join(DISTRIBUTIONS)}.")
            args = list(args) if isinstance(args, (list, tuple)) else [args]
            space[path] = (name, args)

    walk(OmegaConf.to_container(OmegaConf.select(cfg.tune, node), resolve=True), "")
    if not space:
        raise RaydraError(f"{name_of} leaves no key to search; give at least one key a distribution.")
    return space


def parse_mutations(cfg: DictConfig) -> Dict[str, Tuple[str, List[Any]]]:
    """What tune.scheduler=pbt perturbs: tune.pbt.mutations, checked as tune.space is; empty, tune.space itself."""
    if not cfg.tune.pbt.mutations:
        return parse_space(cfg)
    return parse_space(cfg, "pbt.mutations")


def domain(key: str, name: str, args: List[Any]) -> Any:
    """The Ray Tune domain for one key of tune.space."""
    tune = ray.tune
    try:
        if name == "grid":
            return tune.grid_search(args)
        if name == "choice":
            return tune.choice(args)
        return getattr(tune, name)(*args)
    except (TypeError, ValueError, AssertionError) as error:
        raise RaydraError(
            f"tune.space.{key}: {name} {args} is not valid ({error}); e.g. uniform and loguniform take [low, high]."
        ) from None


def check_samples(cfg: DictConfig, space: Dict[str, Tuple[str, List[Any]]], node: str = "space") -> None:
    """Every choice, and both ends of every range, must make a valid run: a type the schema
    accepts and values validate() accepts, so a bad space fails before any trial starts."""
    for key, (name, args) in space.items():
        dom = domain(key, name, args)
        if name in ("choice", "grid"):
            values = args
        elif type(dom).__name__ == "Integer":
            values = [dom.lower, dom.upper - 1]  # randint's upper bound is exclusive
        elif type(dom).__name__ == "Float" and dom.lower is not None and dom.upper is not None:
            values = [float(dom.lower), (dom.lower + dom.upper) / 2, float(dom.upper)]
        else:
            values = dom.sample(size=2)
        for value in values:
            trial_cfg = writable(cfg)
            try:
                OmegaConf.update(trial_cfg, key, plain(value), merge=False)
                validate(trial_cfg)
            except (OmegaConfBaseException, RaydraError) as error:
                reason = str(error).strip().splitlines()[0]
                raise RaydraError(f"tune.{node}.{key}: the value {value} makes an invalid run ({reason}); narrow the space.") from None


def plain(value: Any) -> Any:
    """numpy scalars (what Tune samples) as Python numbers, which OmegaConf and YAML accept."""
    return value.item() if hasattr(value, "item") else value
