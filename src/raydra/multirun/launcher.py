"""Hydra multirun jobs side by side on the Ray cluster: what `python train.py -m ...` runs, and what
`hydra/launcher=raydra` runs for any Hydra app.

Every job runs through Hydra's own run_job in a process of its own (raydra.multirun.job), so it is
exactly the job Hydra's basic launcher would run: MULTIRUN mode, its number, its directory, its
.hydra/ files, the user's Hydra callbacks and resolvers, its JobReturn. Where it runs depends on
what the job is:

- a raydra run (the multirun's task function is raydra's entry): the job is the run's driver, a
  process on this machine forked from a server with the imports done (raydra.multirun.job_process); its
  workers take the resources its own `scale` asks of the cluster. Before any job starts, every job
  is checked as a single run would be (schema, cluster resources); the multirun ends with the
  table `raydra compare <sweep dir>` prints, and its jobs share one W&B group.
- any other app's job: a Ray task on the cluster holding hydra.launcher.cpus_per_job CPUs (1 by
  default; gpus_per_job, resources_per_job), spread over the cluster's nodes, in a Ray worker process
  of its own.

As many jobs run side by side as the cluster holds (or hydra.launcher.max_concurrent), the rest
queue in order. <sweep dir>/jobs.json records every job's overrides, directory and outcome as the
multirun goes; `hydra.launcher.resume=true` with the same command and hydra.sweep.dir continues a
multirun that was stopped: completed jobs are kept, the others run again in their own directories
(a raydra run continues from its last checkpoint).

The launcher's parts, in the order a multirun meets them: raydra.multirun.admission (what may run,
before any job starts), raydra.multirun.scheduling (the queue; starting, watching and stopping the
jobs) and raydra.multirun.outcome (each job's outcome, jobs.json, the closing report); the job
itself is raydra.multirun.job.Job, and the state the parts share raydra.multirun.state.Multirun. This
module holds the lifecycle around the jobs and what the Hydra plugin calls.
"""

import logging
import time
from typing import Any, Callable, List, Optional

from omegaconf import OmegaConf

from raydra.errors import RaydraError
from raydra.multirun import admission, outcome, scheduling
from raydra.multirun.feed import JobFeed
from raydra.multirun.job import Job, JobFailed
from raydra.multirun.state import Multirun
from raydra.records.envelope import Status
from raydra.records.jobs import JobsRecord
from raydra.records.layout import MULTIRUN_CONFIG
from raydra.redact import redact, redact_yaml
from raydra.run.lifecycle import COMPLETED, FAILED, Ending, Lifecycle

log = logging.getLogger("raydra")

# The plugin's composition of one job a feed asks for: (its number, its overrides) -> the Job, with its payload.
Compose = Callable[[int, List[str]], Job]


def run_jobs(multirun: Multirun, jobs: List[Job], feed: Optional[JobFeed] = None, compose: Optional[Compose] = None) -> List[Job]:
    """Run a multirun's `jobs` (composed by the plugin, each with its payload) side by side, each in its
    own process; returns them with their outcome. Given an asynchronous sweeper's `feed` (and the
    plugin's `compose`, which makes a Job of what it asks for), `jobs` starts empty and gets each
    job the feed asks for, the moment a slot frees, until it asks for none.
    Raises RaydraError, before any job starts, if one of them cannot run."""
    # Hydra's sweeper wrote the multirun's config before this batch came: a secret the command
    # carries is there three times (its config, hydra.overrides, override_dirname).
    redact_yaml(multirun.sweep_dir / MULTIRUN_CONFIG)
    if not jobs and feed is None:
        return jobs
    # Lines name a job by what sets it apart: the overrides all jobs share are said once. Masked
    # here, where the words are chosen: a line goes on after them (`#1 (...) cannot run, ...`),
    # and the filter on the console cannot tell where an override's value ends.
    common = admission.shared(jobs)
    for job in jobs:
        job.shown = [redact(o) for o in job.overrides if o not in common]
    started = time.time()
    life: Lifecycle

    def settle(ending: Ending) -> None:
        """jobs.json as the multirun ended: every job's outcome, and the multirun's. A multirun
        stopped or refused before it wrote its record leaves the directory's record as it was."""
        if ending.status == FAILED:
            log.error(f"error: {ending.reason}")
        if not multirun.written:
            return
        for job in jobs:
            if job.status == Status.QUEUED:
                job.status, job.error = Status.NOT_STARTED, "the multirun stopped before it started"
        base = multirun.record or JobsRecord.started()
        if ending.status == COMPLETED and life.notice.noticed():
            # The notice stops the multirun without an exception: its jobs end interrupted, the
            # queued ones never start.
            multirun.record = base.interrupted(life.reason(), started)
        elif ending.status == COMPLETED:
            multirun.record = base.completed(started)
        else:
            multirun.record = base.settled(ending, started)
        multirun.record = multirun.record.with_ledger(outcome.ledger(multirun, jobs, started))
        outcome.record(multirun, jobs)

    with outcome.console(multirun.sweep_dir):
        try:
            with Lifecycle(settle, continue_with=lambda: outcome.how_to_continue(multirun)) as life:
                feeding = None
                if feed is None:
                    admission.prepare(multirun, jobs, life)
                else:
                    assert compose is not None
                    admission.begin(multirun, jobs)
                    feeding = scheduling.Feeding(feed, draw=lambda: _draw(multirun, jobs, feed, compose, life))
                    # The first job joins the cluster (ray.init's SIGTERM handler comes before ours).
                    feeding.draw()
                # A raydra multirun's connect took them already; another app's jobs' Ray was joined
                # without it (or none is, when every job was kept).
                life.take_stop_signals()
                scheduling.schedule(multirun, jobs, life, feeding)
                scheduling.join_processes(jobs)
        finally:
            if not multirun.raydra_runs:
                admission.leave_joined_cluster()
    return jobs


def _draw(multirun: Multirun, jobs: List[Job], feed: JobFeed, compose: Compose, life: Lifecycle) -> Optional[Job]:
    """The next job the feed asks for, composed and admitted (added to `jobs`), or None when it asks
    for none now. A job kept from before (a resumed sweep's) is told to the feed at once; one that
    cannot run fails alone, except the first, which refuses the multirun before any job starts."""
    while True:
        asked = feed.next_job()
        if asked is None:
            return None
        job = compose(asked.num, asked.overrides)
        job.shown = [redact(o) for o in (asked.shown if asked.shown is not None else asked.overrides)]
        jobs.append(job)
        try:
            admission.admit(multirun, job, life)
        except RaydraError as error:
            if not any(j.started for j in jobs):
                raise
            job.status, job.error = Status.FAILED, str(error)
            job.started = job.ended = job.released = time.time()
            log.info(f"[{job.num}] failed before it started  {' '.join(job.shown)}: {error}")
        outcome.record(multirun, jobs)
        if job.status == Status.QUEUED:
            return job
        if job.status == Status.KEPT:
            log.info(f"[{job.num}] completed before, kept  {' '.join(job.shown)}\n  dir  {job.dir}")
        feed.job_ended(outcome.end_of(job))


def job_return(job: Job) -> Any:
    """The job's JobReturn for Hydra (its sweeper reads the return values): the one its run_job
    returned; for a raydra run that failed, its one sentence as a compact error; for a job that
    returned none (killed, not started, kept from before), one built from its config."""
    from hydra.core.utils import JobReturn, JobStatus

    if job.returned is not None and not (job.status != Status.COMPLETED and job.returned.status == JobStatus.COMPLETED):
        ret = job.returned
        if ret.status == JobStatus.FAILED and job.error and job.monitor is not None:
            # A raydra run's failure is in its summary.json as one sentence (its worker's log holds
            # the trace): Hydra prints that, not a traceback.
            failure = JobFailed(f"multirun job {job.label} {job.status}: {job.error}; its directory: {job.dir}")
            failure.__cause__ = ret._return_value if isinstance(ret._return_value, BaseException) else None
            ret.return_value = failure
        return ret
    ret = JobReturn(
        overrides=job.overrides,
        cfg=OmegaConf.masked_copy(job.cfg, [k for k in job.cfg if k != "hydra"]),
        hydra_cfg=OmegaConf.masked_copy(job.cfg, ["hydra"]),
        working_dir=str(job.dir),
        task_name=str(job.cfg.hydra.job.name),
    )
    if job.status in (Status.COMPLETED, Status.KEPT):
        ret.status, ret.return_value = JobStatus.COMPLETED, job.value if job.status == Status.KEPT else job.metric
    else:
        ret.status = JobStatus.FAILED
        ret.return_value = JobFailed(f"multirun job {job.label} {job.status}: {job.error}; its directory: {job.dir}")
    return ret
