"""The jobs of a multirun while they run: the queue (in order, as many at once as the cluster holds
or hydra.launcher.max_concurrent allows), starting each (a raydra run's process, another app's Ray
task), watching for its end, and stopping the running ones when the multirun is stopped.

An asynchronous sweeper's multirun has no fixed queue: its feed (raydra.multirun.feed) is asked for
the next job the moment a slot frees, told each running job's epochs as metrics.csv shows them, and
told each job's end; a job it asks to stop is stopped at once and ends `pruned`.
"""

import logging
import multiprocessing.connection
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from hydra_plugins.raydra_launcher.raydra_launcher import RaydraLauncherConf
from raydra.multirun import job_process, outcome
from raydra.multirun.feed import JobFeed
from raydra.multirun.job import Job
from raydra.multirun.state import Multirun
from raydra.records.envelope import Status
from raydra.records.layout import CONSOLE, METRICS, SUMMARY
from raydra.run.lifecycle import Lifecycle

log = logging.getLogger("raydra")

# How often running jobs are checked for their outcome (a raydra run's summary.json is read only
# when it has changed); a raydra job's process ending wakes the launcher at once. Each check before
# a freed slot is noticed is slot time left idle.
POLL_S = 0.05
# How long stopped jobs get to record themselves interrupted (stop their workers, write summary.json)
# before they are killed.
STOP_WAIT_S = 120


@dataclass
class Feeding:
    """An asynchronous sweeper's feed as the queue draws from it (raydra.multirun.feed), with how a job
    it asks for becomes a Job ready to start: `draw` composes and admits it, and returns None when
    the feed has nothing to run now."""

    feed: JobFeed
    draw: Callable[[], Optional[Job]]


def schedule(multirun: Multirun, jobs: List[Job], life: Lifecycle, feeding: Optional[Feeding] = None) -> None:
    """Run `jobs` (and, given `feeding`, every job its feed asks for as slots free) until each has
    ended, or the multirun is stopped."""
    queued = [job for job in jobs if job.status != Status.KEPT]
    running: List[Job] = []
    max_concurrent = multirun.settings.max_concurrent

    notice = life.notice

    def pass_notice_on() -> bool:
        """SLURM's time-limit notice: each running job's driver gets it (its workers checkpoint and
        it ends interrupted); no queued job starts."""
        for job in running:
            if job.process is not None and job.process.exitcode is None:
                os.kill(job.process.pid, notice.signal)
        return bool(running)

    try:
        with life.stops_on_notice(pass_notice_on):
            _run_queue(multirun, jobs, queued, running, max_concurrent, notice.noticed, feeding)
    except BaseException:
        # Ctrl-C, SIGTERM, or a fault here: no job may go on running unwatched.
        _stop(multirun, running)
        for job in queued:
            job.status, job.error = Status.NOT_STARTED, "the multirun stopped before it started"
        raise
    for job in queued:
        job.status, job.error = Status.NOT_STARTED, notice.reason().split(";")[0] + "; the requeued job runs it"


def _run_queue(
    multirun: Multirun,
    jobs: List[Job],
    queued: List[Job],
    running: List[Job],
    max_concurrent: Optional[int],
    noticed: Callable[[], bool],
    feeding: Optional[Feeding] = None,
) -> None:
    """Start the queued jobs in order as room frees, and with a feed the jobs it asks for, until
    every one has ended (or SLURM's time-limit notice came, `noticed`: then until the running ones
    have)."""
    while True:
        # In order: a job that does not fit yet waits for room rather than being overtaken.
        while not noticed():
            if not queued and feeding is not None and _room_for_more(jobs, running, max_concurrent):
                # Asked for only now that a slot is free: the feed chooses it knowing every result so far.
                drawn = feeding.draw()
                if drawn is None:
                    break
                queued.append(drawn)
            if not (queued and _room_for(queued[0].share, running, max_concurrent)):
                break
            job = queued.pop(0)
            _start(multirun, job, running_after=sum(not j.trained for j in running) + 1, waiting=len(queued))
            running.append(job)
            if feeding is not None:
                outcome.record(multirun, jobs)  # a feed's job was recorded queued as it was asked for
        if not running:
            return
        for job in running[:]:
            if _has_ended(job):
                running.remove(job)
                outcome.settle(multirun, job, stopped=False)
                outcome.record(multirun, jobs)
                if feeding is not None:
                    feeding.feed.job_ended(outcome.end_of(job))
            elif multirun.raydra_runs and not job.trained:
                job.trained = _outcome_recorded(job)
                if job.trained:
                    job.released = time.time()
                elif feeding is not None and feeding.feed.watched and job.pruned_by is None:
                    _tell_epochs(job, feeding.feed)
        if running:
            _wait_for_an_end(running)


def _room_for_more(jobs: List[Job], running: List[Job], max_concurrent: Optional[int]) -> bool:
    """Whether a job like the last one admitted would fit now (a feed's next job is asked for only
    then; it is sized once composed, and waits if it turns out larger)."""
    sized = [job for job in jobs if job.status != Status.KEPT]
    return _room_for(sized[-1].share if sized else 0.0, running, max_concurrent)


def _tell_epochs(job: Job, feed: JobFeed) -> None:
    """Tell the feed each epoch of its watched metric the job has logged since it was last told; stop
    the job if the feed asks (a pruner's decision)."""
    assert feed.watched is not None
    try:
        seen = (job.dir / METRICS).stat()
    except OSError:
        return
    if (seen.st_mtime_ns, seen.st_size) == job.metrics_seen:
        return  # read only when rank 0 has written to it since
    job.metrics_seen = (seen.st_mtime_ns, seen.st_size)
    for epoch, value in sorted(outcome.epochs_of(job, feed.watched).items()):
        if epoch in job.epochs_told:
            continue
        job.epochs_told.add(epoch)
        reason = feed.epoch_ended(job.num, epoch, value)
        if reason is not None:
            job.pruned_by = reason
            log.info(f"[{job.num}] pruned at epoch {epoch} ({feed.watched} {value:.4g}): {reason}; stopping it")
            if job.process is not None and job.process.exitcode is None:
                job.process.terminate()  # SIGTERM: the run stops as on Ctrl-C, and records itself
            elif job.task is not None:
                import ray

                ray.cancel(job.task)
            return


def join_processes(jobs: List[Job]) -> None:
    """Wait for the jobs' processes to end: their server ends with this process, and a job still in
    its exit handlers (Ray's disconnect, logging's flush) would be stopped by it."""
    for job in jobs:
        if job.process is not None:
            job.process.join()


def _start(multirun: Multirun, job: Job, running_after: int, waiting: int) -> None:
    job.dir.mkdir(parents=True, exist_ok=True)
    if multirun.raydra_runs:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **job.settings.env()}
        job.process, job.result = job_process.start(job.payload, str(job.dir / CONSOLE), env)
    else:
        job.task = _app_job_task(multirun.settings).remote(job.payload, _main_module())
    job.started, job.status = time.time(), Status.RUNNING
    resumed = "  (continued)" if job.settings.resume else ""
    log.info(f"[{job.num}] started  {' '.join(job.shown)}{resumed}  ({running_after} running, {waiting} queued)")


def _app_job_task(settings: RaydraLauncherConf) -> Any:
    import ray

    from raydra.multirun.job import execute

    # A worker process of its own for every job, as a raydra run's job has: nothing one job leaves
    # in a process (logging set-up, module state, the current directory) reaches another.
    return ray.remote(max_calls=1)(execute).options(
        num_cpus=settings.cpus_per_job,
        num_gpus=settings.gpus_per_job,
        resources=dict(settings.resources_per_job) or None,
        # Over the cluster's nodes rather than the driver's first (Ray's default fills the local
        # node to half before it spreads).
        scheduling_strategy="SPREAD",
        # A job is not retried: Hydra's launchers run each once, and a retry would rerun a job
        # whose first attempt may have written its outputs.
        max_retries=0,
    )


def _main_module() -> Dict[str, str]:
    from raydra.private_apis.ray import main_module_import

    return main_module_import()


def _has_ended(job: Job) -> bool:
    if job.task is not None:
        import ray

        return bool(ray.wait([job.task], timeout=0)[0])
    if job.returned is None and job.result.poll():
        outcome.take_result(job)
    # Its JobReturn is its outcome; its process is still leaving Ray and running its exit handlers,
    # which the multirun waits for only at its end (join_processes).
    return job.returned is not None or job.process.exitcode is not None


def _wait_for_an_end(running: List[Job]) -> None:
    """Until one of `running` ends or sends its result, or POLL_S."""
    tasks = [job.task for job in running if job.task is not None]
    if tasks:
        import ray

        ray.wait(tasks, timeout=POLL_S)
        return
    waiting = [job.process.sentinel for job in running if job.process.exitcode is None]
    waiting += [job.result for job in running if job.returned is None and not job.result.closed]
    multiprocessing.connection.wait(waiting, timeout=POLL_S)


def _room_for(share: float, running: List[Job], max_concurrent: Optional[int]) -> bool:
    """Whether a job taking `share` of the cluster fits beside the running ones."""
    # A raydra run whose outcome is recorded has released its workers; the seconds its process
    # takes to close (its report, Ray's shutdown) need not hold the next job back.
    holding = [j for j in running if not j.trained]
    if not holding:
        return True  # it fits the cluster alone: checked before anything started
    if max_concurrent and len(holding) >= max_concurrent:
        return False
    return sum(j.share for j in holding) + share <= 1 + 1e-9


def _outcome_recorded(job: Job) -> bool:
    """summary.json says how the run ended: the driver writes that once its TorchTrainer has
    returned, its workers and their placement group gone."""
    try:
        seen = (job.dir / SUMMARY).stat()
    except OSError:
        return False
    if (seen.st_mtime_ns, seen.st_size) == job.summary_seen:
        return False
    job.summary_seen = (seen.st_mtime_ns, seen.st_size)
    run = outcome.summary_of(job)
    return run is not None and run.ended


def _stop(multirun: Multirun, running: List[Job]) -> None:
    if not running:
        return
    log.info(f"stopping {len(running)} running job(s): each records itself interrupted ...")
    if multirun.raydra_runs:
        _stop_processes(running)
    else:
        _stop_tasks(running)
    for job in running:
        outcome.settle(multirun, job, stopped=True)


def _stop_processes(running: List[Job]) -> None:
    for job in running:
        job.process.terminate()  # SIGTERM
    deadline = time.time() + STOP_WAIT_S
    try:
        while any(j.process.exitcode is None for j in running) and time.time() < deadline:
            _wait_for_an_end(running)
            for job in running:
                if job.returned is None and job.result.poll():
                    outcome.take_result(job)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: stop waiting
    for job in running:
        if job.process.exitcode is None:
            job.process.kill()
            job.process.join()


def _stop_tasks(running: List[Job]) -> None:
    import ray

    for job in running:
        ray.cancel(job.task)  # a KeyboardInterrupt in the task, as Ctrl-C gives a basic launcher's job
    deadline = time.time() + STOP_WAIT_S
    try:
        pending = [job.task for job in running]
        while pending and time.time() < deadline:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
    except KeyboardInterrupt:
        pending = [job.task for job in running]
    for task in pending:
        ray.cancel(task, force=True)
