"""A run directory's layout: the record's file names, named here once (every module that writes or
reads one uses these names; the tests keep the literals: they check the contract on disk), the
names derived from a run's name, and where a run's copy lives in storage.
"""

import os
import re
import unicodedata
from pathlib import Path
from typing import Any, Optional

from raydra import storage
from raydra.errors import RaydraError

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


# A ViT run's Hugging Face export (raydra.records.hf_export), written by the driver from the best checkpoint.
HF_EXPORT = "hf"


WANDB = "wandb"


# The W&B settings and logged config a run's W&B run was started with (raydra.records.wandb_run.RunSettings).
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
# hydra/sweeper=optuna_async's: its study (Optuna's journal, which a resumed sweep continues) and
# the best trial, as Hydra's Optuna sweeper writes it.
OPTUNA_STUDY = "optuna_study.journal"
OPTUNA_RESULTS = "optimization_results.yaml"
# hydra/sweeper=race's: its configurations, the jobs it ran, its looks and its verdict, beside jobs.json.
RACE_RECORD = "race.json"


CONSOLE = "console.log"


# A run or multirun that `raydra submit` sent to SLURM: its batch script, and the job's output, one
# file per SLURM job id (sbatch's %j), every attempt of a requeued job appended to it. Beside them in
# logs/: each allocation node's Ray node output (slurm-ray-<node>.log).
SLURM_SCRIPT = "slurm.sh"


SLURM_OUTPUT = "slurm-%j.out"


# Locked (flock) by the driver training in the run directory, for as long as it does: who holds it.
DRIVER_LOCK = ".driver.lock"


# This machine's mark over the run's recorded config (raydra.records.trust): rerun and resume= build what
# a run without it names only when told the run is trusted.
MACHINE_MARK = ".machine_mark"


# The hang watchdog's findings (raydra.run.hang_watch): every worker's stacks and flight record, per hang.
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


# What the process driving a run (the driver, or a Tune trial's process) writes itself.
DRIVER_FILES = (SUMMARY, HYDRA_DIR, DRIVER_LOG, RAY_LOG, MACHINE_MARK, DIAGNOSTICS)


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


# `place` below: the run's raydra.config.spec.Place (read for its dir, id and storage; not imported, since
# the schema that spec.py imports imports this module).
def checkpoints_location(place: Any) -> str:
    """Where Ray Train keeps this run's checkpoints (RunConfig storage): in storage, or the run dir."""
    return checkpoints_of(place.dir, place.storage)


def checkpoints_of(run_dir: Any, storage_location: Optional[str] = None) -> str:
    """Where Ray Train keeps the checkpoints of the run in `run_dir` (and `storage_location`, if it has one)."""
    return storage.join(storage_location or str(run_dir), CHECKPOINTS)
