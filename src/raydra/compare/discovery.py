"""Which run directories the paths given to compare and show name: run directories, sweep
directories, globs, and storage URIs, whose listing is searched as a disk is."""

import glob
import os
import posixpath
import re
from typing import Dict, List, Optional

from raydra.compare.in_storage import join_location, list_remote
from raydra.records import layout
from raydra.storage import is_uri

# What marks a directory as a run's.
RUN_MARKERS = (layout.SUMMARY, layout.CONFIG)


def run_dirs_in(files: List[str]) -> List[str]:
    """The run directories among `files` (relative paths), as runs_below finds them on a disk:
    "" when the top is a run; a sweep's sweep.json makes it no run; hidden folders and a run's
    own subfolders are not searched; natural order."""
    files_set = set(files)
    dirs = set()
    for f in files:
        for marker in RUN_MARKERS:
            if f == marker:
                dirs.add("")
            elif f.endswith("/" + marker):
                dirs.add(f[: -len(marker) - 1])
    dirs = {d for d in dirs if posixpath.join(d, layout.SWEEP) not in files_set}
    if "" in dirs:
        return [""]
    dirs = {d for d in dirs if not any(part.startswith(".") for part in d.split("/"))}
    dirs = {d for d in dirs if not any(d.startswith(other + "/") for other in dirs)}
    return sorted(dirs, key=lambda d: [natural_key(part) for part in d.split("/")])


def remote_run_dirs(arg: str, notes: List[str]) -> Dict[str, List[str]]:
    """{run URI: its files} for the runs at or below storage URI `arg`, from one listing."""
    files, why = list_remote(arg)
    if files is None:
        notes.append(f"{arg} {why}.")
        return {}
    dirs = run_dirs_in(files)
    if not dirs:
        notes.append(
            f"{arg} is not a run or sweep directory (no summary.json or .hydra/config.yaml in it or below); "
            "pass the storage URI of a run or sweep directory."
        )
    found = {}
    for d in dirs:
        prefix = d + "/" if d else ""
        found[join_location(arg, d) if d else arg] = [f[len(prefix) :] for f in files if f.startswith(prefix)]
    return found


def is_run_dir(path: str) -> bool:
    # A tune= sweep directory holds Hydra's record of the invocation too; its sweep.json says it
    # is a sweep, whose runs are below it.
    if os.path.isfile(os.path.join(path, layout.SWEEP)):
        return False
    return any(os.path.isfile(os.path.join(path, marker)) for marker in RUN_MARKERS)


def natural_key(text: str) -> list:
    """Sweep job dirs are 0, 1, ..., 10: order them as numbers, not as strings."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def runs_below(path: str) -> List[str]:
    found: List[str] = []
    try:
        entries = [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    except OSError:
        return found
    for entry in sorted(entries, key=lambda e: natural_key(e.name)):
        # A run dir's own subfolders (checkpoints, wandb, logs) never hold runs: don't walk them.
        if is_run_dir(entry.path):
            found.append(entry.path)
        else:
            found.extend(runs_below(entry.path))
    return found


def find_run_dirs(paths: List[str], notes: List[str], listings: Optional[Dict[str, List[str]]] = None) -> List[str]:
    """Run dirs named by `paths` (run dirs, sweep dirs, globs, storage URIs), in order, each once.
    A run in storage comes back as its URI, with its files put in `listings`."""
    found: Dict[str, str] = {}
    for arg in paths:
        if is_uri(arg):
            for uri, files in remote_run_dirs(arg, notes).items():
                found.setdefault(uri, uri)
                if listings is not None:
                    listings[uri] = files
            continue
        path = os.path.expanduser(arg)
        if any(c in path for c in "*?[") and not os.path.exists(path):
            matches = [m for m in sorted(glob.glob(path, recursive=True), key=natural_key) if os.path.isdir(m)]
            dirs = [d for m in matches for d in ([m] if is_run_dir(m) else runs_below(m))]
            if not dirs:
                notes.append(f"{arg} matches no run or sweep directory; check the pattern.")
        elif not os.path.exists(path):
            notes.append(f"{arg} does not exist; pass a run directory, a sweep directory or a glob.")
            continue
        elif not os.path.isdir(path):
            notes.append(f"{arg} is a file, not a run or sweep directory; pass the directory that holds summary.json.")
            continue
        else:
            dirs = [path] if is_run_dir(path) else runs_below(path)
            if not dirs:
                notes.append(
                    f"{arg} is not a run or sweep directory (no summary.json or .hydra/config.yaml in it or "
                    "below); pass a run directory, a sweep directory or a glob."
                )
        for d in dirs:
            found.setdefault(os.path.realpath(d), d)
    return list(found.values())
