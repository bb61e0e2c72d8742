"""summary.json: what a run asked for, how it ended and what it achieved, in one file.

Written when the run starts (status "running"), and rewritten atomically when it ends, so a
crashed driver never leaves a file that looks complete.
"""

import hashlib
import json
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Dict

from raydra.errors import out_of_space

# The names of the record's files are run_record's; these two are read through this module too.
from raydra.run_record import CHECKPOINT_FILE, SUMMARY  # noqa: F401
from raydra.storage import replacing

PACKAGES = ("raydra", "ray", "torch", "lightning", "pytorch-lightning", "transformers", "hydra-core", "wandb", "diffusers")


def write(run_dir: Path, summary: Dict[str, Any], name: str = SUMMARY) -> None:
    from raydra.redact import redact

    # Overrides and errors can carry a key typed on the command line.
    summary = redact(summary)
    path = Path(run_dir) / name
    try:
        # The previous summary.json stays whole until the new one is; a half-written one goes.
        with replacing(path) as tmp:
            Path(tmp).write_text(json.dumps(summary, indent=2, sort_keys=False, default=str) + "\n")
    except OSError as error:
        full = out_of_space(error, path, name)
        if full:
            raise full from None
        raise


def read(run_dir: Path, name: str = SUMMARY) -> Dict[str, Any]:
    return json.loads((Path(run_dir) / name).read_text())


def now() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def config_hash(resolved: Dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()


def versions() -> Dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def git_commit(cwd: Path) -> Any:
    """The commit the code ran from, with "-dirty" when the tree had uncommitted changes."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")
