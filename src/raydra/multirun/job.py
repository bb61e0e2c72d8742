"""One Hydra multirun job, run the way Hydra's own launchers run one, in a process of its own.

raydra's launcher (raydra.multirun.launcher) composes each job's config as Hydra's basic launcher does (the
multirun's config with the job's overrides, `hydra.mode=MULTIRUN`, `hydra.job.num` and
`hydra.job.id`) and ships it to the job's process with the task function, Hydra's context (its
config loader and the user's `hydra.callbacks`) and Hydra's global state (the ConfigStore and every
OmegaConf resolver registered so far, those of the user's script included), as Hydra's joblib and
Ray launchers ship theirs. There `execute` calls Hydra's own `run_job`: it resolves the job's
directory (`hydra.sweep.dir`/`hydra.sweep.subdir`, interpolations and all, inside the job), changes
into it under `hydra.job.chdir`, applies `hydra.job.env_set`, writes `.hydra/`, configures the job's
logging, runs the callbacks' `on_job_start`/`on_job_end` around the task function and returns the
job's JobReturn, which travels back to the launcher.

A job of raydra's own command (train.py, `raydra train`) also gets raydra's settings for it
(raydra.run.prepare.JobSettings: the Ray cluster the multirun joined, its W&B group, the run to
continue) through its environment, so that its config and overrides stay exactly as the user typed
them.

The launcher holds each job as a Job, from its composed config to its outcome (its status one of
the records' Status, as jobs.json keeps it).
"""

import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

import cloudpickle
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from omegaconf import DictConfig

from raydra.errors import RaydraError
from raydra.records.envelope import Status
from raydra.run.prepare import JobSettings


@dataclass
class Job:
    """One job of a multirun as the launcher holds it: what it runs, where, and how it is going or went."""

    num: int
    overrides: List[str]  # the job's own overrides, as the sweeper made them
    cfg: DictConfig  # its composed config
    dir: Path
    payload: bytes = b""  # what its process runs (JobPayload)
    share: float = 1.0  # the fraction of the cluster it takes
    settings: JobSettings = field(default_factory=JobSettings)
    process: Any = None  # a raydra run's: its multiprocessing Process, and the pipe its result comes through
    result: Any = None
    task: Any = None  # another app's: its Ray task
    started: float = 0.0
    ended: float = 0.0
    status: Status = Status.QUEUED
    error: Optional[str] = None
    returned: Any = None  # the JobReturn its run_job returned
    value: Any = None  # a kept job's recorded return value
    metric: Optional[float] = None
    monitor: Optional[str] = None
    shown: List[str] = field(default_factory=list)  # its overrides that tell it from the other jobs, masked
    trained: bool = False  # a raydra run whose summary.json holds its outcome: its workers are gone
    released: float = 0.0  # when it let its slot go: its outcome recorded (trained), or its end
    # An asynchronous sweeper's (raydra.multirun.feed): why it asked to stop the job early, and the
    # epochs of its metric it has been told of.
    pruned_by: Optional[str] = None
    epochs_told: Set[int] = field(default_factory=set)
    metrics_seen: Any = None  # its metrics.csv's (mtime, size) when last read for them
    summary_seen: Any = None  # its summary.json's (mtime, size) when last read for its outcome

    @property
    def label(self) -> str:
        return f"#{self.num} ({' '.join(self.shown) or 'no overrides'})"


class JobFailed(RaydraError, CompactHydraException):
    """A multirun job of raydra's that failed, already recorded and explained in one sentence: Hydra
    prints a CompactHydraException as its message alone, where any other would get a traceback."""


@dataclass
class JobPayload:
    """Everything Hydra's run_job needs, as Hydra's launchers ship it to a job's process."""

    hydra_context: Any
    config: Any  # the job's sweep config
    task_function: Any
    singleton_state: Any  # hydra.core.singleton.Singleton.get_state()
    # The launcher's working directory: a relative hydra.sweep.dir is relative to it.
    cwd: str

    def dumps(self) -> bytes:
        # cloudpickle: a task function defined in the user's script (its __main__) goes by value.
        return cloudpickle.dumps(self)


def is_raydra_command(task_function: Any) -> bool:
    """Whether the multirun's task function is raydra's entry (train.py, `raydra train`): its jobs
    are raydra runs, checked, placed and recorded as such."""
    return getattr(task_function, "__module__", None) == "raydra.entry" and getattr(task_function, "__name__", None) == "main"


def execute(payload: bytes, main: Optional[Dict[str, str]] = None) -> bytes:
    """Run one job in this process (its own) and return its JobReturn, pickled.

    `main`: how to import the launcher's `__main__` here first (private_apis.main_module_import),
    where the job's process has not imported it already: the user's script runs its top level once
    in every job's process (a resolver it registers, say), as multiprocessing and Hydra's joblib
    launcher have it. Exceptions outside the task function (Hydra could not set the job up, or
    Ctrl-C) propagate, as under Hydra's basic launcher."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job

    if main:
        from raydra.private_apis.ray import import_main_module

        import_main_module(main)
    job: JobPayload = cloudpickle.loads(payload)
    if os.path.isdir(job.cwd):  # a Ray node of a cluster may not have it
        os.chdir(job.cwd)
    Singleton.set_state(job.singleton_state)
    result = run_job(
        hydra_context=job.hydra_context,
        task_function=_as_defined(job.task_function),
        config=job.config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    return dumps_job_return(result)


def _as_defined(task_function: Any) -> Any:
    """A task function defined in the user's script came by value (cloudpickle's copy, its
    globals a copy too, its traceback lines '<dynamic-code>'); with the script imported in this
    process, the function it defines is the one to run: what `@hydra.main` wraps."""
    if getattr(task_function, "__module__", None) != "__main__":
        return task_function
    defined = getattr(sys.modules["__main__"], getattr(task_function, "__name__", ""), None)
    defined = getattr(defined, "__wrapped__", defined)
    if callable(defined) and getattr(defined, "__qualname__", None) == getattr(task_function, "__qualname__", None):
        return defined
    return task_function


def dumps_job_return(result: JobReturn) -> bytes:
    """The JobReturn as bytes for the launcher. A failed job's exception loses its traceback in
    pickling: the traceback is added to it as a note, which Hydra prints with it. A value that
    cannot be pickled at all is replaced: by an exception naming it for a failed job, by None (said
    in the job's log) for a completed one."""
    if result.status == JobStatus.FAILED and isinstance(result._return_value, BaseException):
        error = result._return_value
        if error.__traceback__ is not None and hasattr(error, "add_note"):
            error.add_note("the job's traceback:\n" + "".join(traceback.format_exception(error)).rstrip())
    try:
        return cloudpickle.dumps(result)
    except Exception as problem:
        value = result._return_value
        if result.status == JobStatus.FAILED:
            result._return_value = RuntimeError(f"{type(value).__name__}: {value} (the job's exception could not be pickled: {problem})")
        else:
            import logging

            logging.getLogger(__name__).warning(
                f"the job's return value {type(value).__name__} could not be pickled ({problem}); None is returned"
            )
            result._return_value = None
        return cloudpickle.dumps(result)
