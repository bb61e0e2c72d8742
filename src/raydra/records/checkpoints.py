"""The checkpoints a run leaves, read back outside Ray: Lightning's bookkeeping, and the trained module.

A checkpoint is `<run dir>/checkpoints/<run id>/checkpoint_*/checkpoint.ckpt`, in one of three layouts:
a file (ddp; fsdp with checkpoint_layout=full), a folder of per-worker shards with Lightning's
meta.pt (fsdp, sharded), or a DeepSpeed folder. `load` turns any of them into the plain module.

A run or checkpoint in storage (s3://..., any URI raydra.storage reaches) loads the same way: its
summary.json and the one checkpoint asked for are downloaded into a scratch directory first.

`last_checkpoint` finds, for a run still in Ray's hands, the newest checkpoint Ray registered: what
resume= continues from. torch is imported where a checkpoint is read, not with this module: the
driver finds checkpoints without it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import pickle
import posixpath
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Union
from urllib.parse import urlsplit

from raydra import storage
from raydra.errors import RaydraError
from raydra.private_apis.ray_train import registered_checkpoint_names
from raydra.records import layout, summary
from raydra.records.layout import CHECKPOINT_FILE, SUMMARY
from raydra.records.trust import Trust, buildable, check_trust, unpickling_refused, weights_only_loads
from raydra.storage import is_uri

if TYPE_CHECKING:
    import torch

PathLike = Union[str, Path]


def checkpoint_meta(path: PathLike, trusted: bool = False) -> Dict[str, Any]:
    """Lightning's non-tensor state of a checkpoint: epoch, global_step, hyper_parameters, module_class.
    Read weights-only (tensors and plain data: unpickling runs no code); `trusted`: a DeepSpeed
    checkpoint may hold any pickled object (see raydra.records.trust)."""
    path = Path(path)
    if path.is_file():
        return _torch_load(path, weights_only=True)
    if (path / "meta.pt").is_file():
        return _torch_load(path / "meta.pt", weights_only=True)
    deepspeed_states = path / "checkpoint" / "mp_rank_00_model_states.pt"
    if deepspeed_states.is_file():
        # DeepSpeed pickles a few objects of its own beside the tensors: those are allowed, nothing else.
        return _load_deepspeed_file(deepspeed_states, trusted)
    raise RaydraError(
        f"{path} is not a Lightning checkpoint (no file, no meta.pt, no DeepSpeed states); pass a checkpoint.ckpt a raydra run wrote."
    )


# The first bytes of a zip archive, which torch.save writes (its format since torch 1.6).
ZIP_MAGIC = b"PK\x03\x04"


def _torch_load(path: Path, weights_only: bool) -> Any:
    """torch.load of a checkpoint file; a file cut short or corrupted is said in one sentence
    naming it (torch's own words name no path: "PytorchStreamReader failed reading zip archive",
    or OSError "Invalid argument")."""
    import pickle
    import zipfile

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except Exception as error:
        text = str(error)
        if "Weights only load failed" in text:
            # What weights_only will not unpickle is no damage, and no reason for torch's 20 lines.
            raise unpickling_refused(str(path), error) from None
        if _cut_short(path):
            raise _damaged(path, CUT_SHORT) from None
        if (
            isinstance(error, (EOFError, zipfile.BadZipFile, pickle.UnpicklingError))
            or "PytorchStreamReader" in text
            or "corrupted" in text
        ):
            raise _damaged(path, text.split(". ")[0] or type(error).__name__) from None
        raise


CUT_SHORT = "it starts as torch.save's zip archive, whose directory at the end is missing"


def _cut_short(file: Path) -> bool:
    """Whether `file` is a zip archive (torch.save's format) without its end."""
    import zipfile

    try:
        with open(file, "rb") as handle:
            if handle.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
                return False
        zipfile.ZipFile(file).close()
    except (zipfile.BadZipFile, OSError):
        return True
    return False


def check_whole(path: PathLike) -> None:
    """Refuse, in one sentence, a checkpoint file that is a zip archive cut short (a copy or an
    upload that stopped): only its end, which holds the archive's directory, is read, so a large
    checkpoint costs nothing to check. A directory layout or torch's older format is let be."""
    path = Path(path)
    file = path if path.is_file() else path / "meta.pt"
    if file.is_file() and _cut_short(file):
        raise _damaged(file, CUT_SHORT)


def _damaged(path: Path, why: str) -> RaydraError:
    return RaydraError(
        f"{path} is not a whole checkpoint ({why[:200].rstrip('.')}): it was cut short or corrupted, as by a copy that stopped; "
        "copy it again, or use another of the run's checkpoints (a run directory's best or last)."
    )


def load(run_or_checkpoint: PathLike, which: str = "best", trusted: Trust = False) -> Any:
    """The trained LightningModule of a run, on CPU in eval mode, for evaluation or inference in a
    plain process: `raydra.load("outputs/runs/<date>/<time>_<name>")`.

    `which`: "best" (by checkpoint.monitor) or "last"; or pass a checkpoint.ckpt path instead of a run.
    Either may be a storage URI (`s3://bucket/prefix/runs/<date>/<time>_<name>?endpoint_override=...`).

    The module is built again from the checkpoint's hyperparameters, as the run built it: through
    hydra.utils.instantiate with the flags the run recorded, so a nested `net: {_target_: ...}`
    becomes the network again and a `_partial_` optimizer a partial (a checkpoint written before
    raydra recorded them holds plain-data hyperparameters: `cls(**hyperparameters)`, as then). Then
    its weights are loaded. Nothing but tensors and plain data is unpickled (and DeepSpeed's own
    types, in its files).

    `trusted`: what the checkpoint may have built. False: a LightningModule with networks,
    optimizers, schedulers and partials from installed packages; anything else is refused by name
    (raydra.records.trust). A list of dotted names (modules, classes, functions): those too. True: anything,
    and any pickled object in a DeepSpeed checkpoint; only for a run you trust as your own code.
    Anything else is refused. A pickled object in any other checkpoint file is refused whatever the trust.
    """
    trusted = check_trust(trusted)
    # The module is built in memory before the scratch copy of a checkpoint in storage is removed.
    with tempfile.TemporaryDirectory(prefix="raydra-load-") as scratch:
        path = fetch(locate(str(run_or_checkpoint), which), scratch)
        module = _rebuild(path, checkpoint_meta(path, trusted is True), trusted)
        load_weights(module, path, str(run_or_checkpoint), "the checkpoint was written by another version of the class", trusted is True)
    return module.eval()


def _rebuild(path: Path, meta: Dict[str, Any], trusted: Trust = False) -> Any:
    if "module_class" not in meta:
        raise RaydraError(f"{path} does not name its module class; it was written before raydra recorded it.")
    hyperparameters = meta.get("hyper_parameters", {})
    recorded = (meta.get("raydra") or {}).get("instantiate")
    # What would be built, checked before anything is: the class and every _target_ inside.
    buildable({"_target_": meta["module_class"], **hyperparameters}, str(path), trusted)
    if recorded is None:
        module_path, _, class_name = meta["module_class"].rpartition(".")
        return getattr(importlib.import_module(module_path), class_name)(**hyperparameters)
    from hydra.utils import instantiate

    return instantiate({"_target_": meta["module_class"], **hyperparameters}, **recorded)


def load_weights(module: torch.nn.Module, path: PathLike, source: str, remedy: str, trusted: bool = False) -> None:
    """Load the weights of the checkpoint at `path` (any of the three layouts) into `module`;
    weights that do not fit it are refused in one sentence naming the first key that differs,
    `source` (what the user named) and `remedy`. `trusted`: as checkpoint_meta's."""
    path = Path(path)
    expected = {key: tuple(tensor.shape) for key, tensor in module.state_dict().items()}
    sharded = (path / "meta.pt").is_file()
    # A sharded checkpoint is read into the module's own tensors: its shapes are compared first.
    state = None if sharded else _state_dict(path, module, trusted)
    found = _sharded_shapes(path) if state is None else {key: tuple(tensor.shape) for key, tensor in state.items()}
    misfit = _first_misfit(expected, found)
    if misfit:
        raise RaydraError(f"{source}: its weights do not fit {type(module).__name__} ({misfit}); {remedy}.")
    module.load_state_dict(_state_dict(path, module, trusted) if state is None else state)


def _first_misfit(expected: Dict[str, tuple], found: Dict[str, tuple]) -> Optional[str]:
    for key, shape in expected.items():
        if key not in found:
            return f"the checkpoint has no {key}"
        if found[key] != shape:
            return f"{key} is {list(found[key])} in the checkpoint and {list(shape)} here"
    extra = [key for key in found if key not in expected]
    return f"the checkpoint has {extra[0]}, which the module has not" if extra else None


def _sharded_shapes(path: Path) -> Dict[str, tuple]:
    """The full shape of every weight in a sharded (torch.distributed.checkpoint) checkpoint, from its metadata."""
    return {key: tuple(item.size) for key, item in _sharded_weights(path).items()}


def _sharded_weights(path: Path) -> Dict[str, Any]:
    """The metadata (full size, dtype) of every weight in a sharded checkpoint, by the module's name for it."""
    # torch.distributed.checkpoint's names, from the modules that define them: its __init__ lists no
    # __all__, so a type checker takes what it re-exports for private.
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    prefix = "state_dict."
    metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    return {key[len(prefix) :]: item for key, item in metadata.items() if key.startswith(prefix) and hasattr(item, "size")}


def locate(location: str, which: str = "best") -> str:
    """The checkpoint.ckpt `location` names (a path or a storage URI, checked to be there): itself,
    or a run directory's best or last checkpoint as its summary.json lists it."""
    if is_uri(location):
        return _locate_in_storage(location, which)
    path = Path(location)
    summary_file = path / SUMMARY
    if not summary_file.is_file():
        if path.name == CHECKPOINT_FILE and path.exists():
            return str(path)
        raise RaydraError(f"{path} is neither a raydra run directory (no summary.json) nor a checkpoint.ckpt.")
    if which not in ("best", "last"):
        raise RaydraError(f"which={which} must be best or last.")
    found = summary.read(path).checkpoint(which, path)
    if isinstance(found, str) and is_uri(found):
        # A run with paths.storage: its record is on this disk, its checkpoints in storage.
        missing = f"{path} has no {which} checkpoint (summary.json lists {found}, which is not there); were its checkpoints deleted?"
        return _locate_in_storage(found, which, missing)
    if not found or not Path(found).exists():
        raise RaydraError(
            f"{path} has no {which} checkpoint (summary.json lists {found}); was the run stopped before its first epoch ended?"
        )
    return str(found)


def _locate_in_storage(location: str, which: str, missing: str = "") -> str:
    """The checkpoint that `location` (a run's URI, or a checkpoint.ckpt's) names.
    `missing`: the error when a checkpoint.ckpt URI is not there (it came from a run's summary.json)."""
    from raydra import storage

    try:
        summary_location = storage.join(location, SUMMARY)
        if storage.exists(summary_location):
            if which not in ("best", "last"):
                raise RaydraError(f"which={which} must be best or last.")
            run = summary.parse(storage.read_text(summary_location), summary_location)
            # Below the URI the run was found at, wherever it was first written.
            found = run.checkpoint(which, location)
            if not found or not (is_uri(found) and storage.exists(found) or not is_uri(found) and Path(found).exists()):
                raise RaydraError(
                    f"{location} has no {which} checkpoint (summary.json lists {found}, which is not there); "
                    "was the run stopped before its first epoch ended, or its checkpoints deleted?"
                )
            return found
        if posixpath.basename(urlsplit(location).path.rstrip("/")) == CHECKPOINT_FILE:
            if storage.exists(location):
                return location
            raise RaydraError(missing or f"{location} does not exist; pass the URI of a checkpoint.ckpt that is there, or of its run.")
        raise RaydraError(
            f"{location} is neither a raydra run directory (no summary.json) nor a checkpoint.ckpt; "
            "pass the storage URI of one (check the bucket, prefix and endpoint_override)."
        )
    except (OSError, ValueError) as error:  # pyarrow: OSError from the store, ArrowInvalid (a ValueError) for the URI
        raise _unreadable(location, error) from None


def fetch(checkpoint: str, scratch: str) -> Path:
    """A located checkpoint on this disk: itself, or downloaded from storage into `scratch`."""
    if not is_uri(checkpoint):
        return Path(checkpoint)
    import pyarrow.fs as pafs

    from raydra import storage

    # Keep the name: a sharded or DeepSpeed checkpoint is a folder whose files are read by name.
    target = Path(scratch, CHECKPOINT_FILE)
    try:
        if storage.is_dir(checkpoint):
            storage.copy_tree(checkpoint, str(target))
        else:
            fs, path = storage.filesystem(checkpoint)
            pafs.copy_files(path, str(target), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    except (OSError, ValueError) as error:
        raise _unreadable(checkpoint, error) from None
    return target


def _unreadable(location: str, error: BaseException) -> RaydraError:
    text = " ".join(str(error).split())[:300]
    return RaydraError(
        f"{location} cannot be read from storage ({text}); check the URI, its endpoint and the credentials "
        "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3://)."
    )


def state_dict(path: PathLike, trusted: bool = False) -> Dict[str, Any]:
    """The weights of the checkpoint at `path` (a local path, any of the three layouts), named as
    the module names them, without building the module (the driver writes an export from them
    without importing the module's libraries). `trusted`: as checkpoint_meta's."""
    return _state_dict(Path(path), None, trusted)


def _state_dict(path: Path, module: Optional[torch.nn.Module], trusted: bool = False) -> Dict[str, Any]:
    """The checkpoint's weights; a sharded one is read into `module`'s own tensors, or, without a
    module, into tensors shaped as its metadata says."""
    if path.is_file():
        return _torch_load(path, weights_only=True)["state_dict"]
    if (path / "meta.pt").is_file():
        import torch
        from torch.distributed.checkpoint.state_dict_loader import load  # from its defining module, as in _sharded_weights

        # The shards hold the full-size tensors between them; reading into full-size tensors here
        # (the module's own state dict, or empty ones of the recorded shapes) reassembles them in this one process.
        if module is not None:
            state = module.state_dict()
        else:
            state = {key: torch.empty(tuple(item.size), dtype=item.properties.dtype) for key, item in _sharded_weights(path).items()}
        with warnings.catch_warnings():
            # Loading without a process group is the point here, not a mistake to warn about.
            warnings.filterwarnings("ignore", message=".*single process.*")
            # no_dist: every process reads the whole model for itself (a worker starting from ckpt_path
            # has a process group, whose collectives a load by every rank would otherwise wait on).
            load({"state_dict": state}, checkpoint_id=path, no_dist=True)
        return state

    with tempfile.TemporaryDirectory() as tmp:
        single = Path(tmp) / "model.pt"
        # DeepSpeed and Lightning read the ZeRO files with weights_only=False: made weights-only here.
        try:
            with contextlib.nullcontext() if trusted else weights_only_loads():
                _zero_to_fp32(path, single)
        except pickle.UnpicklingError as error:
            raise unpickling_refused(str(path), error, deepspeed=True) from None
        return _load_deepspeed_file(single, trusted)["state_dict"]


def _load_deepspeed_file(path: Path, trusted: bool) -> Dict[str, Any]:
    """A file of a DeepSpeed checkpoint: weights-only, DeepSpeed's own types allowed; anything
    else is refused in one sentence unless `trusted`."""
    import torch

    if trusted:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        with weights_only_loads():
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise unpickling_refused(str(path), error, deepspeed=True) from None


def _zero_to_fp32(checkpoint: Path, target: Path) -> None:
    """The weights of a DeepSpeed (ZeRO) checkpoint folder gathered into one fp32 file, by Lightning."""
    # From the submodule itself: lightning.pytorch.utilities never imports it, so where nothing else
    # has, it is no attribute of the package (raydra.load of a DeepSpeed run failed so on a GPU).
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    try:
        # It prints where it saves: a scratch file of this function's, nothing for the user.
        with contextlib.redirect_stdout(io.StringIO()):
            convert_zero_checkpoint_to_fp32_state_dict(str(checkpoint), str(target))
    except ModuleNotFoundError:
        if importlib.util.find_spec("deepspeed") is not None:
            raise
        raise RaydraError(
            f"{checkpoint} is a DeepSpeed checkpoint (strategy=deepspeed), and reading it needs the deepspeed package; "
            "install it with `pip install raydra[deepspeed]`."
        ) from None


def last_checkpoint(
    run_dir: Path, run_id: str, storage_location: Optional[str] = None, settle_s: float = 0.0, hurried: Optional[threading.Event] = None
) -> Optional[str]:
    """The newest checkpoint Ray wrote for this run (a path or a storage URI): what resume= will
    continue from. Ray numbers its checkpoint directories in order.

    Under Ray only a checkpoint it registered counts: a copy cut short by a full disk or a kill is a
    directory too. `settle_s`: the run may still be going (the driver was interrupted, its workers
    not yet stopped); while a newer directory than the latest registered one exists, wait up to this
    long for Ray to register it (and drop the one before, under checkpoint.num_to_keep); `hurried`,
    once set, ends the wait (a second stop signal: the registered one is named)."""
    where = storage.join(layout.checkpoints_of(run_dir, storage_location), run_id)
    deadline = time.time() + settle_s
    while True:
        # checkpoint_<time>/checkpoint.ckpt, a file or (sharded) a folder; not Ray's checkpoint_manager_snapshot.json,
        # nor local mode's .checkpoint_<time>.partial being written.
        parts = [f.split("/") for f in storage.list_files(where)]
        found = sorted({p[0] for p in parts if len(p) > 1 and p[1] == CHECKPOINT_FILE and p[0].startswith("checkpoint_")})
        registered = registered_checkpoint_names(where)
        if registered is None:
            break
        kept = [name for name in registered if name in found]
        if not (found and (not kept or found[-1] > kept[-1])) or time.time() >= deadline or (hurried and hurried.is_set()):
            found = kept
            break
        if hurried:
            hurried.wait(0.2)
        else:
            time.sleep(0.2)
    return storage.join(where, found[-1], CHECKPOINT_FILE) if found else None
