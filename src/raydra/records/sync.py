"""The run record's two homes, kept whole on a cluster whose nodes share no disk.

A run directory lives on the driver's disk (what `raydra show`, `compare`, `resume=` read). With
`paths.storage` set, the run also has a storage location (`<paths.storage>/<run dir relative to
paths.outputs>`: s3://, gs://, NFS, any path) holding Ray's checkpoints and a copy of the record:

    driver                                   storage                         worker node
    run dir/ summary.json, .hydra/,  --push-->  <location>/  <--push--  scratch dir/ metrics.csv,
             driver.log, logs/ray.log  <-pull--   ...               logs/worker_<rank>.log,
             + what workers wrote                                   samples/, pipeline/, wandb/

Each process pushes only the files it writes, and the driver pulls the workers' files while the
run goes on (`Follower`) and once more at its end, so the driver's run directory follows the run
and ends complete whatever node rank 0 landed on. Without `paths.storage` there is one home: the
run directory itself, which every worker must then be able to reach (one machine, or a shared
disk; `check_shared` refuses a cluster where it is not).
"""

import logging
import os
import shutil
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

from raydra import storage
from raydra.errors import RaydraError, storage_error
from raydra.records.layout import CHECKPOINTS, DRIVER_FILES

log = logging.getLogger("raydra")


def push_driver_files(place: Any) -> None:
    """Copy what this process wrote of the record (summary.json, .hydra/, logs) to storage."""
    if place.storage:
        for name in DRIVER_FILES:
            source = os.path.join(place.dir, name)
            if os.path.isdir(source):
                storage.copy_tree(source, storage.join(place.storage, name))
            elif os.path.isfile(source):
                storage.write_bytes(storage.join(place.storage, name), Path(source).read_bytes())


def pull(place: Any, seen: Optional[Dict[str, Any]] = None, skip: tuple = DRIVER_FILES + (CHECKPOINTS,)) -> List[str]:
    """Copy what other processes wrote to storage into this process's run directory."""
    if not place.storage:
        return []
    return storage.copy_tree(place.storage, place.dir, skip=skip, seen=seen)


class Follower:
    """Pulls the workers' files into the driver's run directory every `every_s` seconds while the
    run goes on (metrics.csv follows at least every epoch: workers push at each report), and once
    more when stopped."""

    def __init__(self, place: Any, every_s: float = 5.0, skip: tuple = DRIVER_FILES + (CHECKPOINTS,)) -> None:
        self.place, self.every_s, self.skip = place, every_s, skip
        self._seen: Dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="raydra-record-follower", daemon=True)

    def __enter__(self) -> "Follower":
        if self.place.storage:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.place.storage:
            return
        self._stop.set()
        self._thread.join()
        self._pull()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._pull()

    def _pull(self) -> None:
        try:
            pull(self.place, self._seen, self.skip)
        except OSError as error:  # storage briefly unreachable: the next pull catches up
            log.debug(f"pulling the run record from {self.place.storage} failed: {error}")


class WorkerMirror:
    """A worker's side: with storage, the worker writes its part of the record into a scratch
    directory on its own node and pushes it to storage at every report and at the end."""

    def __init__(self, place: Any, rank: int) -> None:
        self.storage = place.storage
        self._seen: Dict[str, Any] = {}
        if self.storage:
            self.dir = Path(tempfile.gettempdir(), "raydra-runs", place.id, f"rank{rank}")
            self.dir.mkdir(parents=True, exist_ok=True)
        else:
            self.dir = Path(place.dir)

    def restore(self, names: List[str]) -> None:
        """Bring back files an earlier attempt of this worker pushed (rank 0's metrics.csv after a
        restart on another node), so they continue where the storage copy stands."""
        for name in names if self.storage else []:
            source = storage.join(self.storage, name)
            if storage.exists(source):
                # Written beside and renamed over: a full disk leaves no half metrics.csv.
                storage.write_bytes(str(self.dir / name), storage.read_bytes(source))

    def push(self) -> None:
        if self.storage:
            storage.copy_tree(str(self.dir), self.storage, seen=self._seen)

    def close(self) -> None:
        """The last push; then the scratch directory goes, so nodes do not fill up run after run
        (kept if the push failed: it is then the only copy)."""
        self.push()
        if self.storage:
            shutil.rmtree(self.dir, ignore_errors=True)


def check_writable(location_: str) -> None:
    """Write, read back and delete a small file at `location_` (paths.storage as the user gave it),
    before any worker starts, so a bad URI, endpoint, bucket or credentials fail in one sentence
    instead of at the first checkpoint."""
    probe = storage.join(location_, f".raydra-write-check-{uuid.uuid4().hex[:8]}")
    try:
        storage.write_text(probe, "ok")
        storage.read_text(probe)
        fs, path = storage.filesystem(probe)
        fs.delete_file(path)
    except Exception as error:  # pyarrow raises OSError, ValueError or ArrowInvalid by cause
        raise RaydraError(storage_error(location_, error)) from None


def check_shared(run_dir: Path) -> None:
    """Refuse a multi-node cluster on which the run directory is not the same disk everywhere.

    Without paths.storage every worker writes into the driver's run directory; a node that sees a
    different disk there would keep its files (and Ray its checkpoints) where the driver never looks.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) < 2:
        return  # one machine: the driver's own disk
    # Every node a worker could land on (one with CPUs), the head among them only if it has any.
    nodes = [n for n in alive if n["Resources"].get("CPU", 0) > 0]
    marker = Path(run_dir, ".raydra-shared-check")
    marker.write_text("ok")

    @ray.remote(num_cpus=0)
    def sees(path: str) -> bool:
        return os.path.exists(path)

    try:
        answers = ray.get(
            [sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(str(marker)) for n in nodes],
            timeout=60,
        )
    finally:
        marker.unlink(missing_ok=True)
    blind = [n["NodeManagerAddress"] for n, seen in zip(nodes, answers, strict=True) if not seen]
    if blind:
        raise RaydraError(
            f"the Ray cluster's node(s) {', '.join(sorted(set(blind)))} cannot see {run_dir} (no shared disk), where this "
            "run would write its checkpoints and logs; set paths.storage to storage every node reaches "
            "(e.g. paths.storage=s3://bucket/prefix, or an NFS path mounted on every node)."
        )
