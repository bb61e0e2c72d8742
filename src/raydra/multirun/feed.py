"""What an asynchronous sweeper hands raydra's launcher instead of a batch: a feed of jobs that the
launcher draws from the moment a slot frees, telling it each job's epochs as they end and each job's
outcome as it ends (raydra.multirun.scheduling). Hydra's sweepers call `Launcher.launch` once per
batch and wait for the batch's slowest job; a feed never waits: with as many jobs running as the
cluster holds, the next one is asked for as soon as one ends, so it is chosen knowing every result
so far.

    JobFeed     what the sweeper implements (raydra's asynchronous Optuna sweeper, the seed race)
    FedJob      one job it asks for: its number (its directory, hydra.job.num) and its overrides
    JobEnd      how a job ended, as the feed is told it

A job the feed asks the launcher to stop early (a pruned trial) ends `pruned`: its run records
itself stopped by its sweeper, not failed or interrupted.
"""

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Protocol

from raydra.records.envelope import Status

log = logging.getLogger("raydra")


@dataclass(frozen=True)
class FedJob:
    """A job the feed wants run: `num` names its directory and its hydra.job.num (a feed that
    continues a stopped sweep asks again for the jobs it had not heard the end of, under their
    numbers: the launcher continues each from its last checkpoint)."""

    num: int
    overrides: List[str]
    # Those of its overrides that tell it from the other jobs (its sampled values), for its lines on
    # the console; None: all of them.
    shown: Optional[List[str]] = None


@dataclass(frozen=True)
class JobEnd:
    """How a fed job ended: completed (`value`: its return value, a raydra run's best
    checkpoint.monitor), kept (completed before a resume: its recorded value), pruned (stopped at the
    feed's request: `value` its last epoch's metric), failed or interrupted (`error`)."""

    num: int
    status: Status
    value: Any = None
    error: Optional[str] = None
    # Its JobReturn from Hydra's run_job, where the job returned one (what a Hydra sweeper reads).
    returned: Any = None


class JobFeed(Protocol):
    """An asynchronous sweeper, as raydra's launcher draws jobs from it (one thread: the launcher's)."""

    # The metric whose value the feed is told at each epoch's end (epoch_ended); None: not told.
    watched: Optional[str]

    def next_job(self) -> Optional[FedJob]:
        """The next job to run now that a slot is free, or None: nothing to run until a running
        job ends (and, when none is running, nothing more at all: the multirun ends)."""
        ...

    def epoch_ended(self, num: int, epoch: int, value: float) -> Optional[str]:
        """Job `num` logged `watched` = `value` at the end of `epoch`. Returns why to stop it now (the
        reason its record keeps, e.g. which pruner decided), or None to let it go on."""
        ...

    def job_ended(self, end: JobEnd) -> None:
        """A job ended, however it ended (a job stopped with the multirun is not reported: it is
        continued when the multirun is)."""
        ...


def number_of(value: Any) -> Optional[float]:
    """A job's value as the number a sweeper compares, or None: not a finite number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def run_feed(feed: JobFeed, launcher: Any, n_jobs: int, sweeper: str) -> None:
    """Until the feed asks for no more jobs: on raydra's launcher, a job asked for as each slot
    frees; on a launcher that has only Hydra's batch API (the basic launcher, submitit), `n_jobs`
    jobs asked for at a time, each batch launched and waited for, each job's end told from its
    JobReturn, nothing stopped early, which the `sweeper` says."""
    if hasattr(launcher, "launch_as_slots_free"):
        launcher.launch_as_slots_free(feed)
        return
    log.info(
        f"{sweeper}: {type(launcher).__name__} runs jobs in batches, so they are asked for {n_jobs} at a time and none is stopped "
        "early (raydra's launcher, hydra/launcher=raydra, asks for each as a slot frees)"
    )
    while True:
        batch = [job for job in (feed.next_job() for _ in range(n_jobs)) if job is not None]
        if not batch:
            return
        returns = launcher.launch([job.overrides for job in batch], initial_job_idx=batch[0].num)
        for job, returned in zip(batch, returns):
            completed = returned.status.name == "COMPLETED"
            feed.job_ended(
                JobEnd(
                    num=job.num,
                    status=Status.COMPLETED if completed else Status.FAILED,
                    value=returned.return_value if completed else None,
                    error=None if completed else repr(returned._return_value)[:300],
                    returned=returned,
                )
            )


def resuming(config: Any, path: Path, what: str) -> bool:
    """Whether the sweeper continues the state it keeps at `path` in its sweep directory
    (hydra.launcher.resume=true). Refuses, before any job, a new sweep into a directory that holds
    one (`what`: "an Optuna study", "a race") and a resume with none there."""
    from omegaconf import OmegaConf

    from raydra.errors import RaydraError

    resume = bool(OmegaConf.select(config, "hydra.launcher.resume", default=False))
    kind = what.split(" ", 1)[1]
    if path.exists() and not resume:
        raise RaydraError(
            f"hydra.sweep.dir={path.parent} already holds {what} ({path.name}); continue it with "
            "hydra.launcher.resume=true, or give this sweep another hydra.sweep.dir."
        )
    if resume and not path.exists():
        raise RaydraError(
            f"hydra.launcher.resume=true: {path.parent} holds no {kind} to continue (no {path.name}); "
            "pass hydra.sweep.dir=<the directory of the sweep to continue>."
        )
    return resume
