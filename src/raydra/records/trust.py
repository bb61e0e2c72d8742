"""What raydra builds from a run directory that may not be yours: nothing it was not told to trust.

A run directory is data. `raydra compare` and `raydra show` read it and import nothing it names.
Three things build what a run names, and each decides here first:

- `raydra.load` rebuilds the trained module from its checkpoint (`buildable`). Unless told
  `trusted=True`, the checkpoint's class must be a LightningModule, and every `_target_` in its
  hyperparameters a network (torch.nn.Module), an optimizer or a learning-rate scheduler class, or
  a `_partial_` node (imported and wrapped, not called: `transformers.get_cosine_schedule_with_warmup`);
  each from a package outside Python's standard library (not a single-file module, nothing named
  like `__main__`), or named in `trusted=[...]`. Anything else (a function called, a method, a class
  of another kind, an interpolation `${...}` that a resolver would evaluate) is refused by name
  before anything is built. Checkpoint files are read with torch's weights-only unpickler; DeepSpeed's own types
  (`DEEPSPEED_TYPES`) are the only objects allowed besides tensors and plain data.
- `raydra rerun RUN_DIR` and `resume=RUN_DIR` build the run's `_target_`s again. A run this
  machine made carries its mark (`mark_run`): an HMAC of its recorded config under a key only this
  user can read (~/.raydra/machine_key, mode 0600; nodes sharing a home directory share it). A run
  without this machine's mark (downloaded, copied from a colleague, or made before raydra marked
  runs) is refused, naming the `_target_`s it would import (`refuse_foreign`), until the command says
  it is trusted (`raydra rerun --trusted`, `resume_trusted=true`). The mark covers the config, which
  is what rerun and resume build; a checkpoint is read weights-only whatever its mark.
"""

import contextlib
import hashlib
import hmac
import importlib
import importlib.util
import inspect
import os
import secrets
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator, List, Sequence, Tuple, Union

from raydra.errors import RaydraError
from raydra.records.layout import CONFIG, MACHINE_MARK

# What `trusted=` of raydra.load takes: True (everything), False (the rule above), or the dotted
# names (a module, a class, a function) trusted beside the rule.
Trust = Union[bool, Iterable[str]]

# The objects DeepSpeed pickles beside the tensors of its ZeRO checkpoint files (the optimizer's
# ZeRO stage, its loss scaler, the parameters' fragment addresses): the only ones its files need.
DEEPSPEED_TYPES = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
)


def machine_key_file() -> Path:
    return Path.home() / ".raydra" / "machine_key"


# ---------------------------------------------------------------------------------------------
# raydra.load: which classes a checkpoint may have built


def trusted_names(trusted: Trust) -> Tuple[str, ...]:
    return () if isinstance(trusted, bool) else tuple(str(name) for name in trusted)


def check_trust(trusted: Any) -> Trust:
    """`trusted` as raydra.load takes it: True, False, or a list (tuple, set) of dotted names. Anything
    else is refused in one sentence: None or 1 failed deep inside with a TypeError, and a string
    was read letter by letter as names ("yes" trusted the modules y, e and s)."""
    if isinstance(trusted, bool):
        return trusted
    if isinstance(trusted, (list, tuple, set, frozenset)) and all(isinstance(name, str) and name for name in trusted):
        return trusted
    raise RaydraError(
        f"trusted={trusted!r} is neither True, False nor a list of dotted names; pass trusted=False (the default rule), "
        "trusted=['my_project.models'] (those names too) or trusted=True (anything)."
    )


def _named(target: str, names: Sequence[str]) -> bool:
    return any(target == name or target.startswith(name + ".") for name in names)


def targets(node: Any, where: str = "") -> List[Tuple[str, str, bool]]:
    """(key, `_target_`, whether `_partial_`) of every node in `node` (dicts and lists, nested)
    that names one; the key of `node` itself is "" (nested keys are never empty: `''` for an empty one)."""
    found: List[Tuple[str, str, bool]] = []
    if isinstance(node, dict):
        if "_target_" in node:
            found.append((where, str(node["_target_"]), node.get("_partial_") is True))
        for key, value in node.items():
            found += targets(value, f"{where}.{key}" if where else str(key) or "''")
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            found += targets(value, f"{where}[{i}]")
    return found


def interpolations(node: Any) -> List[str]:
    """The strings in `node` that OmegaConf would resolve (`${...}`): a resolver runs code."""
    if isinstance(node, dict):
        return [s for value in node.values() for s in interpolations(value)]
    if isinstance(node, (list, tuple)):
        return [s for value in node for s in interpolations(value)]
    return [node] if isinstance(node, str) and "${" in node else []


def importable(target: str, bases: Tuple[type, ...] = ()) -> bool:
    """Whether `target` is a class subclassing one of `bases` (any callable, when none), in a
    package outside the standard library. Names are checked before anything is imported: no
    standard-library module (os, subprocess, pathlib, ...), no single-file top-level module (a
    project's setup.py or train.py runs when imported), no `__main__`-like part (a package's
    `__main__` runs its command)."""
    module_name, _, attr = target.rpartition(".")
    parts = target.split(".")
    if not module_name or any(not part.isidentifier() or (part.startswith("__") and part.endswith("__")) for part in parts):
        return False
    if parts[0] in sys.stdlib_module_names or parts[0] in sys.builtin_module_names:
        return False
    try:
        top = importlib.util.find_spec(parts[0])
        if top is None or top.submodule_search_locations is None:
            return False
        cls = getattr(importlib.import_module(module_name), attr, None)
    except Exception:  # not importable here: nothing to build it from
        return False
    if not bases:
        return callable(cls)
    return inspect.isclass(cls) and issubclass(cls, bases)


def buildable(node: dict, source: str, trusted: Trust) -> None:
    """Raise RaydraError, naming each `_target_` of `node` (a checkpoint's class with its
    hyperparameters, as raydra.load would instantiate it) that the rule above does not trust."""
    if trusted is True:
        return
    import torch

    from raydra.lightning import pl

    names = trusted_names(trusted)
    parts = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
    refused = [
        target
        for key, target, partial in targets(node)
        if not _named(target, names) and not importable(target, (pl.LightningModule,) if key == "" else () if partial else parts)
    ]
    resolved = interpolations(node)
    if refused or resolved:
        what = "; ".join(
            ([f"build {', '.join(dict.fromkeys(refused))}"] if refused else [])
            + ([f"resolve {', '.join(resolved[:3])}"] if resolved else [])
        )
        # Names let a class or function through; only trusted=True lets an interpolation be resolved.
        listed = ", ".join(repr(t) for t in dict.fromkeys(refused))
        remedy = f"trusted=[{listed}] (or trusted=True)" if refused and not resolved else "trusted=True"
        raise RaydraError(
            f"{source} asks raydra.load to {what}, but it builds only a LightningModule with networks, optimizers, "
            f"schedulers and partials from installed packages; if you trust this run, pass {remedy}."
        )


def deepspeed_types() -> List[type]:
    """DEEPSPEED_TYPES, those that import (none without DeepSpeed, whose files then hold none)."""
    found = []
    for name in DEEPSPEED_TYPES:
        module, _, attr = name.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):
            continue
    return found


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """Every torch.load inside reads weights only, with DeepSpeed's own types allowed besides: also
    the loads that DeepSpeed and Lightning make with weights_only=False while converting a ZeRO
    checkpoint (torch's documented switch TORCH_FORCE_WEIGHTS_ONLY_LOAD overrides what they pass)."""
    import torch

    before = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        # A list of its own: safe_globals takes a list of callables, which a List[type] is not (lists are invariant).
        with torch.serialization.safe_globals(list(deepspeed_types())):
            yield
    finally:
        if before is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = before


def unpickling_refused(source: str, error: BaseException, deepspeed: bool = False) -> RaydraError:
    """torch's weights-only refusal (20 lines that name no file), as one sentence naming the file
    and the object it met. `deepspeed`: a file of a DeepSpeed folder, which raydra.load reads whole
    when trusted=True; any other checkpoint file is read weights-only whatever the trust (resume=
    and ckpt_path= included, and Lightning's own restore)."""
    import re

    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    what = f"a pickled {found.group(1)}" if found else "a pickled object"
    if deepspeed:
        return RaydraError(
            f"{source} holds {what}, which is neither a tensor nor DeepSpeed's own, and unpickling it could run code; "
            "load it only if you trust the run: raydra.load(..., trusted=True)."
        )
    return RaydraError(
        f"{source} holds {what}, which is neither a tensor nor plain data, and unpickling it could run code, so raydra reads "
        "no checkpoint that holds one; if it is your own module's, keep plain data in its checkpoint (save_hyperparameters, "
        "on_save_checkpoint), else use a checkpoint of a run you trust."
    )


# ---------------------------------------------------------------------------------------------
# rerun and resume=: was the run made here


def _machine_key(create: bool) -> Union[bytes, None]:
    path = machine_key_file()
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        if not create:
            return None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # O_EXCL: two runs starting at once make one key; the loser reads the winner's.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
    except FileExistsError:
        pass
    except OSError:  # a read-only home: runs are not marked, and rerun/resume ask for the flag
        return None
    return _machine_key(create=False)


def _mark_of(run_dir: Path, key: bytes) -> Union[str, None]:
    try:
        config = Path(run_dir, CONFIG).read_bytes()
    except OSError:
        return None
    return hmac.new(key, config, hashlib.sha256).hexdigest()


def mark_run(run_dir: Path) -> None:
    """Mark `run_dir` as made on this machine, over its recorded config (.hydra/config.yaml as
    written, secrets masked): the mark says the config is this user's own."""
    key = _machine_key(create=True)
    mark = _mark_of(run_dir, key) if key else None
    if mark:
        Path(run_dir, MACHINE_MARK).write_text(mark + "\n")


def made_here(run_dir: Path) -> bool:
    """Whether `run_dir` carries this machine's mark over the config it holds now."""
    key = _machine_key(create=False)
    try:
        mark = Path(run_dir, MACHINE_MARK).read_text().strip()
    except OSError:
        return False
    expected = _mark_of(run_dir, key) if key else None
    return bool(expected) and hmac.compare_digest(mark, expected)


def foreign_targets(config: Any) -> List[str]:
    """`key=_target_` for every `_target_` of a recorded config, as a refusal lists them."""
    return [f"{key}._target_={target}" if key else f"_target_={target}" for key, target, _ in targets(config)]


def refuse_foreign(run_dir: Path, config: Any, what: str, flag: str) -> RaydraError:
    """The refusal of `what` (rerun, resume=) for a run this machine did not make: what it would
    import, and the flag that says the run is trusted."""
    listed = ", ".join(foreign_targets(config)) or "no _target_"
    return RaydraError(
        f"{what}: {run_dir} was not made on this machine (it has no mark of this machine's raydra, or its config changed "
        f"since), and running it imports and runs what its config names ({listed}); if you trust it, add {flag}."
    )
