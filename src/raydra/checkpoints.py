"""The checkpoints a run leaves, read back outside Ray: Lightning's bookkeeping, and the trained module.

A checkpoint is `<run dir>/checkpoints/<run id>/checkpoint_*/checkpoint.ckpt`, in one of three layouts:
a file (ddp; fsdp with checkpoint_layout=full), a folder of per-worker shards with Lightning's
meta.pt (fsdp, sharded), or a DeepSpeed folder. `load` turns any of them into the plain module.
"""

import importlib
import json
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict, Union

import torch

from raydra.errors import RaydraError

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
    raise RaydraError(f"{path} is not a Lightning checkpoint (no file, no meta.pt, no DeepSpeed states); pass a checkpoint.ckpt a raydra run wrote.")


def load(run_or_checkpoint: PathLike, which: str = "best") -> Any:
    """The trained LightningModule of a run, on CPU in eval mode, for evaluation or inference in a
    plain process: `raydra.load("outputs/runs/<date>/<time>_<name>")`.

    `which`: "best" (by checkpoint.monitor) or "last"; or pass a checkpoint.ckpt path instead of a run.
    """
    path = _checkpoint_path(Path(run_or_checkpoint), which)
    meta = checkpoint_meta(path)
    if "module_class" not in meta:
        raise RaydraError(f"{path} does not name its module class; it was written before raydra recorded it.")
    module_path, _, class_name = meta["module_class"].rpartition(".")
    module = getattr(importlib.import_module(module_path), class_name)(**meta.get("hyper_parameters", {}))
    module.load_state_dict(_state_dict(path, module))
    return module.eval()


def _checkpoint_path(path: Path, which: str) -> Path:
    summary_file = path / "summary.json"
    if not summary_file.is_file():
        if path.name == "checkpoint.ckpt" and path.exists():
            return path
        raise RaydraError(f"{path} is neither a raydra run directory (no summary.json) nor a checkpoint.ckpt.")
    checkpoints = json.loads(summary_file.read_text()).get("checkpoints") or {}
    if which not in ("best", "last"):
        raise RaydraError(f"which={which} must be best or last.")
    found = checkpoints.get(which)
    if not found or not Path(found).exists():
        raise RaydraError(f"{path} has no {which} checkpoint (summary.json lists {found}); was the run stopped before its first epoch ended?")
    return Path(found)


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
