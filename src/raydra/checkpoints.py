"""The checkpoints a run leaves, read back outside Ray: Lightning's bookkeeping, and the trained module.

A checkpoint is `<run dir>/checkpoints/<run id>/checkpoint_*/checkpoint.ckpt`, in one of three layouts:
a file (ddp; fsdp with checkpoint_layout=full), a folder of per-worker shards with Lightning's
meta.pt (fsdp, sharded), or a DeepSpeed folder. `load` turns any of them into the plain module.

A run or checkpoint in storage (s3://..., any URI raydra.storage reaches) loads the same way: its
summary.json and the one checkpoint asked for are downloaded into a scratch directory first.
"""

import importlib
import json
import posixpath
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict, Union
from urllib.parse import urlsplit

import torch

from raydra.compare import is_uri, relocated
from raydra.errors import RaydraError
from raydra.summary import CHECKPOINT_FILE

PathLike = Union[str, Path]


def checkpoint_meta(path: PathLike) -> Dict[str, Any]:
    """Lightning's non-tensor state of a checkpoint: epoch, global_step, hyper_parameters, module_class."""
    path = Path(path)
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True)
    if (path / "meta.pt").is_file():
        return torch.load(path / "meta.pt", map_location="cpu", weights_only=True)
    deepspeed_states = path / "checkpoint" / "mp_rank_00_model_states.pt"
    if deepspeed_states.is_file():
        # DeepSpeed pickles its own config objects beside the tensors, so this file cannot load with
        # weights_only; it is the run's own output.
        return torch.load(deepspeed_states, map_location="cpu", weights_only=False)
    raise RaydraError(
        f"{path} is not a Lightning checkpoint (no file, no meta.pt, no DeepSpeed states); pass a checkpoint.ckpt a raydra run wrote."
    )


def load(run_or_checkpoint: PathLike, which: str = "best") -> Any:
    """The trained LightningModule of a run, on CPU in eval mode, for evaluation or inference in a
    plain process: `raydra.load("outputs/runs/<date>/<time>_<name>")`.

    `which`: "best" (by checkpoint.monitor) or "last"; or pass a checkpoint.ckpt path instead of a run.
    Either may be a storage URI (`s3://bucket/prefix/runs/<date>/<time>_<name>?endpoint_override=...`).
    """
    # The module is built in memory before the scratch copy of a checkpoint in storage is removed.
    with tempfile.TemporaryDirectory(prefix="raydra-load-") as scratch:
        path = _checkpoint_path(str(run_or_checkpoint), which, scratch)
        meta = checkpoint_meta(path)
        if "module_class" not in meta:
            raise RaydraError(f"{path} does not name its module class; it was written before raydra recorded it.")
        module_path, _, class_name = meta["module_class"].rpartition(".")
        module = getattr(importlib.import_module(module_path), class_name)(**meta.get("hyper_parameters", {}))
        module.load_state_dict(_state_dict(path, module))
    return module.eval()


def _checkpoint_path(location: str, which: str, scratch: str) -> Path:
    """The checkpoint to load, on this disk: as named, or downloaded into `scratch` from storage."""
    if is_uri(location):
        return _checkpoint_in_storage(location, which, scratch)
    path = Path(location)
    summary_file = path / "summary.json"
    if not summary_file.is_file():
        if path.name == CHECKPOINT_FILE and path.exists():
            return path
        raise RaydraError(f"{path} is neither a raydra run directory (no summary.json) nor a checkpoint.ckpt.")
    checkpoints = json.loads(summary_file.read_text()).get("checkpoints") or {}
    if which not in ("best", "last"):
        raise RaydraError(f"which={which} must be best or last.")
    found = checkpoints.get(which)
    if isinstance(found, str) and is_uri(found):
        # A run with paths.storage: its record is on this disk, its checkpoints in storage.
        missing = f"{path} has no {which} checkpoint (summary.json lists {found}, which is not there); were its checkpoints deleted?"
        return _checkpoint_in_storage(found, which, scratch, missing)
    if not found or not Path(found).exists():
        raise RaydraError(
            f"{path} has no {which} checkpoint (summary.json lists {found}); was the run stopped before its first epoch ended?"
        )
    return Path(found)


def _checkpoint_in_storage(location: str, which: str, scratch: str, missing: str = "") -> Path:
    """Download the checkpoint that `location` (a run's URI, or a checkpoint.ckpt's) names.
    `missing`: the error when a checkpoint.ckpt URI is not there (it came from a run's summary.json)."""
    import pyarrow.fs as pafs

    from raydra import storage

    try:
        summary_location = storage.join(location, "summary.json")
        if storage.exists(summary_location):
            summary = json.loads(storage.read_text(summary_location))
            if which not in ("best", "last"):
                raise RaydraError(f"which={which} must be best or last.")
            recorded = (summary.get("checkpoints") or {}).get(which)
            # A copied run's summary.json may name the checkpoint on the disk it was written on.
            found = relocated(recorded, summary.get("run_dir"), location) if isinstance(recorded, str) and recorded else None
            if not found or not (is_uri(found) and storage.exists(found) or not is_uri(found) and Path(found).exists()):
                raise RaydraError(
                    f"{location} has no {which} checkpoint (summary.json lists {recorded}, which is not there); "
                    "was the run stopped before its first epoch ended, or its checkpoints deleted?"
                )
            if not is_uri(found):
                return Path(found)
        elif posixpath.basename(urlsplit(location).path.rstrip("/")) == CHECKPOINT_FILE and storage.exists(location):
            found = location
        elif posixpath.basename(urlsplit(location).path.rstrip("/")) == CHECKPOINT_FILE:
            raise RaydraError(missing or f"{location} does not exist; pass the URI of a checkpoint.ckpt that is there, or of its run.")
        else:
            raise RaydraError(
                f"{location} is neither a raydra run directory (no summary.json) nor a checkpoint.ckpt; "
                "pass the storage URI of one (check the bucket, prefix and endpoint_override)."
            )
        # Keep the name: a sharded or DeepSpeed checkpoint is a folder whose files are read by name.
        target = Path(scratch, CHECKPOINT_FILE)
        if storage.is_dir(found):
            storage.copy_tree(found, str(target))
        else:
            fs, path = storage.filesystem(found)
            pafs.copy_files(path, str(target), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
        return target
    except (OSError, ValueError) as error:  # pyarrow: OSError from the store, ArrowInvalid (a ValueError) for the URI
        text = " ".join(str(error).split())[:300]
        raise RaydraError(
            f"{location} cannot be read from storage ({text}); check the URI, its endpoint and the credentials "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3://)."
        ) from None


def _state_dict(path: Path, module: torch.nn.Module) -> Dict[str, Any]:
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    if (path / "meta.pt").is_file():
        import torch.distributed.checkpoint as dcp

        # The shards hold the full-size tensors between them; reading into the module's own state
        # dict reassembles them in this one process.
        state = module.state_dict()
        with warnings.catch_warnings():
            # Loading without a process group is the point here, not a mistake to warn about.
            warnings.filterwarnings("ignore", message=".*single process.*")
            dcp.load({"state_dict": state}, checkpoint_id=path)
        return state
    from raydra.lightning import pl

    with tempfile.TemporaryDirectory() as tmp:
        single = Path(tmp) / "model.pt"
        pl.utilities.deepspeed.convert_zero_checkpoint_to_fp32_state_dict(str(path), str(single))
        return torch.load(single, map_location="cpu", weights_only=False)["state_dict"]
