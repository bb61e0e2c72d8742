"""The run record's two homes, kept whole on a cluster whose nodes share no disk.

A run directory lives on the driver's disk (what `raydra show`, `compare`, `resume=` read). With
`paths.storage` set, the run also has a storage location (`<paths.storage>/<run dir relative to
paths.outputs>`: s3://, gs://, NFS, any path) holding Ray's checkpoints and a copy of the record:

    driver                                   storage                         worker node
    run dir/ summary.json, .hydra/,  --push-->  <location>/  <--push--  scratch dir/ metrics.csv,
             driver.log, logs/ray.log, <-pull--   ...               logs/worker_<rank>.log,
             hf/, + what workers wrote                              samples/, pipeline/, wandb/

Each process pushes only the files it writes, and the driver pulls the workers' files while the
run goes on (`Follower`) and once more at its end, so the driver's run directory follows the run
and ends complete whatever node rank 0 landed on. Without `paths.storage` there is one home: the
run directory itself, which every worker must then be able to reach (one machine, or a shared
disk; `check_shared` refuses a cluster where it is not).
"""

import errno
import fcntl
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import unicodedata
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from raydra import storage
from raydra.errors import OUT_OF_SPACE, RaydraError, storage_error, unwritable

# The record's files, named here once: every module that writes or reads one uses these names
# (the tests keep the literals: they check the contract on disk). A run directory (the layout above):
SUMMARY = "summary.json"
METRICS = "metrics.csv"
HYDRA_DIR = ".hydra"  # Hydra's record of the invocation (hydra.output_subdir)
CONFIG = f"{HYDRA_DIR}/config.yaml"
OVERRIDES = f"{HYDRA_DIR}/overrides.yaml"
HYDRA_RECORD = f"{HYDRA_DIR}/hydra.yaml"
DRIVER_LOG = "driver.log"
LOGS = "logs"
RAY_LOG = f"{LOGS}/ray.log"
CHECKPOINTS = "checkpoints"
# The Lightning checkpoint inside each of the run's Ray checkpoint directories (checkpoints/<run id>/checkpoint_*/);
# the name Ray's own RayTrainReportCallback uses, so either's checkpoints load alike.
CHECKPOINT_FILE = "checkpoint.ckpt"
SAMPLES = "samples"
PIPELINE = "pipeline"
# A ViT run's Hugging Face export (raydra.hf_export), written by the driver from the best checkpoint.
HF_EXPORT = "hf"
WANDB = "wandb"
# The W&B settings and logged config a run's W&B run was started with (raydra.wandb_run.RunSettings).
WANDB_RUN_FILE = f"{WANDB}/raydra.json"
# A tune= sweep's directory: its record, its trials' run directories, Tune's state, the best trial.
SWEEP = "sweep.json"
TRIALS = "trials"
TRIALS_CSV = "trials.csv"
TRIALS_MD = "trials.md"
TUNE = "tune"
SCHEDULER_STATE = f"{TUNE}/scheduler_state.pkl"
BEST_CONFIG = "best_config.yaml"
BEST_CHECKPOINT = "best_checkpoint.ckpt"
# A multirun's directory (raydra's launcher): its lines; every job's overrides, directory and
# outcome, rewritten as each job ends; in each job's directory, the job process's console output.
MULTIRUN_LOG = "multirun.log"
JOBS_RECORD = "jobs.json"
MULTIRUN_CONFIG = "multirun.yaml"  # Hydra's: the multirun's config, written by its sweeper before any job
CONSOLE = "console.log"
# A run or multirun that `raydra submit` sent to SLURM: its batch script, and the job's output, one
# file per SLURM job id (sbatch's %j), every attempt of a requeued job appended to it. Beside them in
# logs/: each allocation node's Ray node output (slurm-ray-<node>.log).
SLURM_SCRIPT = "slurm.sh"
SLURM_OUTPUT = "slurm-%j.out"
# Locked (flock) by the driver training in the run directory, for as long as it does: who holds it.
DRIVER_LOCK = ".driver.lock"
# This machine's mark over the run's recorded config (raydra.trust): rerun and resume= build what
# a run without it names only when told the run is trusted.
MACHINE_MARK = ".machine_mark"
# The hang watchdog's findings (raydra.watch): every worker's stacks and flight record, per hang.
DIAGNOSTICS = "diagnostics"


def ray_safe(name: str) -> str:
    """`name` in the characters Ray takes in a run's name: Ray Train tags its metrics with the run
    name, and Ray's metrics encode tags as ASCII (a name with an accent failed the run's controller
    at start, measured on Ray 2.60). Accents are dropped (modèle -> modele), any other character
    that is not a letter, digit, `.` or `-` becomes `_`; the user's name is kept as it is in the
    run's directory and its record."""
    plain = "".join(c for c in unicodedata.normalize("NFKD", name) if not unicodedata.combining(c))
    return re.sub(r"[^A-Za-z0-9._-]", "_", plain)


def name_in_directory(name: str) -> str:
    """`name` as it ends a run's or a sweep's directory (<time>_<name>: conf/hydra/default.yaml),
    refused in one sentence if it holds a `/`, before any directory is made. A `/` would nest the
    directory one level deeper than <date>/<time>_<name>, where resume=latest (and a requeued SLURM
    job) look for a run of that name, or with `..` after it outside paths.outputs; turned into
    another character, it would name the directory otherwise than the run, whose record and W&B
    keep the name as typed."""
    if "/" in str(name):
        raise RaydraError(
            f"name={name} holds a '/', which would nest the run's directory where resume=latest does not look for it; "
            f"name it without one, e.g. name={str(name).replace('/', '_')}."
        )
    return name


def slurm_node_log(node: str) -> str:
    """The output of an allocation node's `ray start`, relative to the run (or multirun) directory."""
    return f"{LOGS}/slurm-ray-{node}.log"


def hang_diagnostics(number: int) -> str:
    """Where the watchdog keeps hang `number`'s stacks, relative to the run directory."""
    return f"{DIAGNOSTICS}/hang-{number}"


def worker_log(rank: int) -> str:
    """A worker's log, relative to the run directory."""
    return f"{LOGS}/worker_{rank}.log"


log = logging.getLogger("raydra")

# What the process driving a run (the driver, or a Tune trial's process) writes itself.
DRIVER_FILES = (SUMMARY, HYDRA_DIR, DRIVER_LOG, RAY_LOG, MACHINE_MARK, DIAGNOSTICS)
# Ray's checkpoints (CHECKPOINTS) are in storage already, and read from there (raydra.load, resume).


def location(storage_root: Optional[str], outputs: str, run_dir: Path) -> Optional[str]:
    """The run's storage location, or None when paths.storage is unset."""
    if not storage_root:
        return None
    if not storage.is_uri(storage_root):
        # Workers resolve a relative path against their own working directory, not the driver's.
        storage_root = os.path.abspath(os.path.expanduser(storage_root))
    try:
        relative = Path(run_dir).resolve().relative_to(Path(outputs).resolve())
    except ValueError:  # hydra.run.dir outside paths.outputs
        relative = Path("runs", Path(run_dir).name)
    return storage.join(storage_root, *relative.parts)


# What the first writes into a claimed directory need (Hydra's .hydra/ record is ~10 KB): written
# once, then removed, so that a full disk is named with its path before the run starts.
ROOM_FOR_THE_RECORD = 64 * 1024


def claim_directory(path: str) -> str:
    """`path`, or `path_2`, `path_3`, ... when an earlier invocation already has it: two launches
    in the same second (a script, a job array, a refused command and its retry) must not share a
    run directory, where the second would overwrite the first's Hydra record. Creating the
    directory claims it, so concurrent launches cannot both take the same one.

    A directory that cannot be made or written (a read-only paths.outputs, a full disk, a run name
    longer than a file name may be) is refused in one sentence naming it, and nothing is left."""
    candidate, n = Path(path), 1
    while True:
        try:
            candidate.mkdir(parents=True)
            break
        except FileExistsError:
            n += 1
            candidate = Path(f"{path}_{n}")
        except OSError as error:
            raise _unclaimable(error, candidate) from None
    probe = candidate / ".raydra-room"
    try:
        with open(probe, "wb") as file:
            file.write(b"\0" * ROOM_FOR_THE_RECORD)
    except OSError as error:
        shutil.rmtree(candidate, ignore_errors=True)
        raise _unclaimable(error, candidate) from None
    finally:
        probe.unlink(missing_ok=True)
    return str(candidate)


def _unclaimable(error: OSError, directory: Path) -> Exception:
    if error.errno == errno.ENAMETOOLONG:
        instead = "give the run a shorter name= (it names the directory)"
    elif error.errno in OUT_OF_SPACE:
        instead = "point paths.outputs at another disk (or the run at one with hydra.run.dir=)"
    else:
        instead = "point paths.outputs at a directory you can write (or the run at one with hydra.run.dir=)"
    return unwritable(error, directory, "the run's directory", instead) or error


def hold(run_dir: Path, asked: str, wait_s: float = 0.0) -> Callable[[], None]:
    """Lock `run_dir` for this process, which trains in it from now on; returns what lets it go.

    A second driver for the same run (`resume=` given twice, a run resumed while its first driver
    still trains, a requeued job while the old one lives on) is refused here, before it writes
    anything, told which process holds the run (`asked`: what it was asked, e.g. resume=<dir>),
    once `wait_s` has passed without the holder letting go (a driver that has recorded its run
    interrupted is still leaving Ray for a few seconds). The lock is the kernel's (flock): it ends
    with the process however it ends, SIGKILL included, so a crashed driver never leaves a run
    locked. The file stays, emptied, once it is let go."""
    path = Path(run_dir) / DRIVER_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "a process on another machine"
            if time.monotonic() >= deadline:
                os.close(fd)
                raise RaydraError(
                    f"{asked}: {run_dir} is being trained by another driver ({holder}); wait for it to end, or stop it, and resume then."
                ) from None
            if not said:
                log.info(f"{run_dir} is held by another driver ({holder}); waiting up to {wait_s:.0f} s for it to let go")
                said = True
            time.sleep(0.5)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)

    def release() -> None:
        os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor lets the lock go

    return release


# `place` below: the run's raydra.spec.Place (read for its dir, id and storage; not imported, since
# the schema that spec.py imports imports this module).
def checkpoints_location(place: Any) -> str:
    """Where Ray Train keeps this run's checkpoints (RunConfig storage): in storage, or the run dir."""
    return storage.join(place.storage or place.dir, CHECKPOINTS)


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
