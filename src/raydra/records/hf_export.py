"""A run's Hugging Face export: `<run dir>/hf/`, a folder that `transformers` loads as it is.

    rank 0, as the fit ends      the module says what the export holds (ViTClassifier.hf_export:
                                 config.json, which of the checkpoint's weights and under what names,
                                 the modeling code a model Hugging Face does not know needs, the data
                                 module's preprocessor_config.json): an HFExport in its WorkerOutcome
    the driver, once it knows    write(): the best checkpoint's weights (the ones raydra.load
    the best checkpoint          gives) as model.safetensors beside them, in a hidden folder renamed
                                 into place when whole; then the copy in paths.storage

The driver writes it because only the driver knows which checkpoint is best (Ray ranks them), and
because it reads any checkpoint layout whole (a sharded FSDP or DeepSpeed run's rank 0 holds only
its shard as the fit ends). It reads the checkpoint's tensors and writes files: it imports neither
the module's class nor transformers, so a run's end costs no more than reading its best checkpoint.
"""

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from raydra import storage
from raydra.errors import RaydraError
from raydra.records.layout import HF_EXPORT

log = logging.getLogger("raydra")

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
PREPROCESSOR = "preprocessor_config.json"
# Where the modeling code an export carries comes from: files of raydra.models that import nothing
# but torch and transformers, copied as they are.
CODE_DIR = Path(__file__).resolve().parents[1] / "models"


@dataclass(frozen=True)
class HFExport:
    """What a run's Hugging Face export holds but its weights, as the module describes it."""

    # config.json's text: the Hugging Face config of the model as it was built, with the data's class names.
    config: str
    # Which of the module's weights the export holds, by the start of their names in its checkpoints
    # (read there, on the driver: a sharded module's rank 0 would gather them to learn the names),
    # and what is taken off those names in the export.
    weights: Tuple[str, ...]
    strip: str = ""
    # raydra.models files the export carries for trust_remote_code (config.json's auto_map names them).
    code: Tuple[str, ...] = ()
    # preprocessor_config.json's settings, or None when the data module does not say how it prepares images.
    preprocessor: Optional[Dict[str, Any]] = None


def write(export: HFExport, checkpoint: str, run_dir: Path, storage_location: Optional[str] = None) -> Path:
    """Write `export` with the weights of `checkpoint` (a path or storage URI of a checkpoint.ckpt,
    any layout) as `<run_dir>/hf/`, and copy it to `<storage_location>/hf/` when the run has one.
    Returns the folder."""
    from safetensors.torch import save_file

    from raydra.records.checkpoints import fetch, state_dict

    with tempfile.TemporaryDirectory(prefix="raydra-export-") as scratch:
        # The run's own checkpoint, written moments ago: trusted as resume= trusts it.
        state = state_dict(fetch(checkpoint, scratch), trusted=True)
    # safetensors stores each tensor whole and alone: a view of a larger one is copied out.
    tensors = {key.removeprefix(export.strip): tensor.contiguous() for key, tensor in state.items() if key.startswith(export.weights)}
    if not tensors:
        raise RaydraError(
            f"{checkpoint} holds no weights named {' or '.join(f'{prefix}*' for prefix in export.weights)}, which the run's "
            "Hugging Face export is made of; set model.export_hf=false to train without the export."
        )
    target = Path(run_dir) / HF_EXPORT
    with storage.replacing_tree(target) as partial:
        save_file(tensors, str(Path(partial, WEIGHTS)), metadata={"format": "pt"})
        Path(partial, CONFIG).write_text(export.config)
        if export.preprocessor is not None:
            # As Hugging Face writes its own: indented, keys sorted.
            Path(partial, PREPROCESSOR).write_text(json.dumps(export.preprocessor, indent=2, sort_keys=True) + "\n")
        for name in export.code:
            shutil.copyfile(CODE_DIR / name, Path(partial, name))
    if export.preprocessor is None:
        log.info(
            f"{target} has no {PREPROCESSOR}: the run's data module does not say how it prepares its images "
            "(raydra's own say it in image_inputs); the model takes what the data module gave it"
        )
    if storage_location:
        # Object stores rename nothing: config.json goes last, so a copy cut short has none, and
        # from_pretrained refuses it rather than loading half a model.
        location = storage.join(storage_location, HF_EXPORT)
        storage.copy_tree(str(target), location, skip=(CONFIG,))
        storage.write_bytes(storage.join(location, CONFIG), (target / CONFIG).read_bytes())
    return target
