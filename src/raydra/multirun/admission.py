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
"""

import logging
import math
import multiprocessing.connection
import os
import shlex
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

from omegaconf import DictConfig, OmegaConf

from hydra_plugins.raydra_launcher.raydra_launcher import RaydraLauncherConf
from raydra.cluster import batch_system
from raydra.config.schema import data_loader
from raydra.errors import RaydraError
from raydra.multirun import job_process
from raydra.multirun.job import JobFailed
from raydra.records import envelope, layout, summary
from raydra.records import jobs as jobs_record
from raydra.records.envelope import Status
from raydra.records.jobs import JobsRecord
from raydra.records.layout import CONSOLE, JOBS_RECORD, MULTIRUN_CONFIG, MULTIRUN_LOG
from raydra.records.summary import RunRecord
from raydra.redact import SecretsFilter, redact, redact_yaml, stands_for_a_secret
from raydra.run.lifecycle import COMPLETED, FAILED, Ending, Lifecycle
from raydra.run.prepare import JobSettings

log = logging.getLogger("raydra")

# How often running jobs are checked for their outcome; a raydra job's process ending wakes the
# launcher at once.
POLL_S = 0.2
# How long stopped jobs get to record themselves interrupted (stop their workers, write summary.json)
# before they are killed.
STOP_WAIT_S = 120

# Whether this process joined a cluster (rather than started a local Ray) for an app's jobs.
_app_cluster_joined = False


@dataclass
class Multirun:
    sweep_dir: Path
    settings: RaydraLauncherConf  # hydra.launcher.*, each explained there
    # The jobs are runs of raydra's own command (train.py, `raydra train`), not another app's.
    raydra_runs: bool
    # The first batch of this multirun (a sweeper launches several); a record already in the sweep
    # directory then belongs to an earlier multirun.
    first_batch: bool = True
    # The multirun's overrides as typed (its hydra.overrides.task and .hydra): the command to continue it.
    typed: List[str] = field(default_factory=list)
    # jobs.json as this batch writes it: this multirun's earlier batches' record, the record of the
    # multirun it resumes, or a new one (_take_over_record).
    record: Optional[JobsRecord] = None
    # Whether this batch wrote jobs.json yet: until then a refusal leaves the file as it was.
    written: bool = False


@dataclass
class Job:
    num: int
    overrides: List[str]  # the job's own overrides, as the sweeper made them
    cfg: DictConfig  # its composed config
    dir: Path
    payload: bytes = b""  # what its process runs (raydra.multirun.job.JobPayload)
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

    @property
    def label(self) -> str:
        return f"#{self.num} ({' '.join(self.shown) or 'no overrides'})"


def run_jobs(multirun: Multirun, jobs: List[Job]) -> List[Job]:
    """Run a multirun's `jobs` (composed by the plugin, each with its payload) side by side, each in its
    own process; returns them with their outcome.
    Raises RaydraError, before any job starts, if one of them cannot run."""
    # Hydra's sweeper wrote the multirun's config before this batch came: a secret the command
    # carries is there three times (its config, hydra.overrides, override_dirname).
    redact_yaml(multirun.sweep_dir / MULTIRUN_CONFIG)
    if not jobs:
        return jobs
    # Lines name a job by what sets it apart: the overrides all jobs share are said once. Masked
    # here, where the words are chosen: a line goes on after them (`#1 (...) cannot run, ...`),
    # and the filter on the console cannot tell where an override's value ends.
    common = _shared(jobs)
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
        _record(multirun, jobs)

    with _console(multirun.sweep_dir):
        try:
            with Lifecycle(settle, continue_with=lambda: _how_to_continue(multirun)) as life:
                _prepare(multirun, jobs, life)
                # A raydra multirun's connect took them already; another app's jobs' Ray was joined
                # without it (or none is, when every job was kept).
                life.take_stop_signals()
                _schedule(multirun, jobs, life)
                _join_processes(jobs)
        finally:
            if not multirun.raydra_runs:
                _leave_joined_cluster()
    return jobs


def _shared(jobs: List[Job]) -> set:
    """The overrides every one of several jobs has."""
    return set.intersection(*(set(j.overrides) for j in jobs)) if len(jobs) > 1 else set()


def _prepare(multirun: Multirun, jobs: List[Job], life: Lifecycle) -> None:
    """Check every job can run, keep what a resumed multirun completed, join the cluster."""
    settings = multirun.settings
    max_concurrent = settings.max_concurrent
    if max_concurrent is not None and (isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1):
        raise RaydraError(
            f"hydra.launcher.max_concurrent={max_concurrent} must be a whole number of at least 1, "
            "or null to run as many jobs at once as the Ray cluster holds."
        )
    _take_over_record(multirun, jobs)
    to_run = [job for job in jobs if job.status != Status.KEPT]
    if multirun.raydra_runs:
        _prepare_runs(multirun, to_run, life)
    else:
        _prepare_app_jobs(multirun, to_run)
    _record(multirun, jobs)
    if not to_run:
        log.info(f"multirun: all {len(jobs)} jobs of this batch completed before; none runs again\n  dir  {multirun.sweep_dir}")
        return
    common = [redact(o) for o in jobs[0].overrides if o in _shared(jobs)]
    fit = math.floor(1 / max(j.share for j in to_run) + 1e-9)
    cap = f"hydra.launcher.max_concurrent={max_concurrent}" if max_concurrent else "cap it with hydra.launcher.max_concurrent=N"
    kept = len(jobs) - len(to_run)
    log.info(
        f"multirun: {len(to_run)} jobs, up to {min(fit, max_concurrent or fit, len(to_run))} at a time "
        f"(the Ray cluster holds {fit} side by side; {cap})"
        + (f"; {kept} completed before, kept" if kept else "")
        + f"\n  dir  {multirun.sweep_dir}"
        + (f"\n  every job  {' '.join(common)}" if common else "")
    )


def _take_over_record(multirun: Multirun, jobs: List[Job]) -> None:
    """A sweep directory that holds a multirun is continued only when asked to
    (hydra.launcher.resume=true), and only with the same jobs; what it completed is kept. Not asked
    to, the multirun starts afresh there, as under Hydra's basic launcher, except over a raydra
    run's record, which is never overwritten."""
    recorded = _read_record(multirun.sweep_dir)
    # SLURM runs a requeued job's batch script again: the multirun it started continues.
    resume = multirun.settings.resume or bool(recorded and batch_system.requeued())
    if not multirun.first_batch:
        multirun.record = (recorded or JobsRecord.started()).next_batch()
    elif resume and recorded:
        multirun.record = recorded.resumed_from_here(log=str(multirun.sweep_dir / MULTIRUN_LOG))
    else:
        multirun.record = JobsRecord.started()
    if multirun.first_batch and not resume:
        held = [job for job in jobs if (job.dir / layout.SUMMARY).is_file()] if multirun.raydra_runs else []
        if held:
            raise RaydraError(
                f"hydra.sweep.dir={multirun.sweep_dir} already holds this multirun's runs (job #{held[0].num}'s directory "
                f"{held[0].dir} holds one); continue it with hydra.launcher.resume=true, or give this one another hydra.sweep.dir."
            )
        return
    if multirun.first_batch and not recorded:
        raise RaydraError(
            f"hydra.launcher.resume=true: {multirun.sweep_dir} holds no multirun to continue (no {JOBS_RECORD}); "
            "pass hydra.sweep.dir=<the directory of the multirun to continue>."
        )
    for job in jobs:
        before = recorded.job(job.num) if recorded else None
        if before is None:
            continue
        masks = [o for o in job.overrides if stands_for_a_secret(o)]
        if masks:
            # The record compares secrets masked, so *** would pass as the secret it stands for.
            raise RaydraError(
                f"hydra.launcher.resume=true: {masks[0]} holds ***, which raydra records in place of a secret; "
                "pass the secret itself in its place: the jobs continue with what this command gives them."
            )
        if before.overrides != redact(job.overrides) or before.dir is None or Path(before.dir) != job.dir:
            raise RaydraError(
                f"hydra.launcher.resume=true: job #{job.num} of {multirun.sweep_dir} ran with {' '.join(before.overrides) or 'no overrides'} "
                f"in {before.dir}, not {' '.join(redact(job.overrides)) or 'no overrides'} in {job.dir}; resume with the command that started it."
            )
        run = _summary(job) if multirun.raydra_runs else None
        status = run.status if run else before.status
        if status == Status.COMPLETED:
            job.status, job.value = Status.KEPT, before.return_value
            job.started, job.ended = time.time(), time.time()
            if run:
                job.monitor = run.monitor.metric
                job.metric = job.value = run.best_value()
        elif run:
            # Stopped, failed or lost with its launcher: its run continues from its last checkpoint.
            job.settings = JobSettings(resume=str(job.dir))


def _prepare_runs(multirun: Multirun, jobs: List[Job], life: Lifecycle) -> None:
    """raydra runs: each checked as a single run is, the cluster joined once, shares sized."""
    from raydra.cluster.ray_cluster import check_fits, is_local_ray

    if not jobs:
        return
    allocation = batch_system.named(jobs[0].cfg.ray.address)
    on_allocation = allocation is not None
    if on_allocation:
        # SLURM's time-limit notice from here on: noted, then passed on to the jobs (_schedule).
        batch_system.watch(allocation)
    # A config mistake in any job refuses the whole multirun, before any job runs: the grid is
    # fixed first and then run, as Hydra already does for values of the wrong type.
    for job in jobs:
        with _as_current_job(job):
            _refuse_for(job, _check_run, job)
    first = jobs[0].cfg
    # The jobs' server imports for ~2 s, alongside Ray's start or join. Ray reads its auth mode from
    # the environment at import, and ray.init sets it there (RAY_AUTH_MODE=token) as it starts a
    # local Ray whose mode nobody set: the server starts with that mode already, so that it imports
    # as a job started after ray.init would (this process's own Ray, imported already, learns it
    # from ray.init). `auto` finds a cluster whose mode only ray.init learns: the server waits.
    alongside = first.ray.address != "auto"
    if on_allocation:
        # The token the allocation's cluster will check, in the environment before the jobs' server
        # takes it (and imports Ray with it): each job joins the cluster with it.
        allocation.prepare_cluster()
    if alongside:
        local_mode = {"RAY_AUTH_MODE": "token"} if first.ray.address is None and "RAY_AUTH_MODE" not in os.environ else {}
        job_process.start_server(env=local_mode)
    # No dashboard for a local Ray of the multirun's: its State API serves Ray Train's placement-group
    # cleaner, which runs whose process ends with them do not start (a tune= job's trials do).
    dashboard = any(job.cfg.get("tune") is not None for job in jobs)
    # Then the stop signals: ray.init's own SIGTERM handler would end this process at once,
    # leaving the jobs running.
    life.connect(first, multirun.sweep_dir, dashboard=dashboard)
    if not alongside:
        job_process.start_server()
    import ray

    address = ray.get_runtime_context().gcs_address
    group = f"{multirun.sweep_dir.parent.name}_{multirun.sweep_dir.name}"
    for job in jobs:
        _refuse_for(job, check_fits, OmegaConf.to_object(job.cfg.scale))
        job.share = 1.0 / _runs_that_fit(job.cfg)
        # The multirun's cluster for a job whose ray.address is null (its own address otherwise),
        # and one W&B group named as a tune= sweep's (<date>_<time>_<name>).
        local_ray = is_local_ray() and job.cfg.ray.address is None
        job.settings = JobSettings(
            ray_address=address, wandb_group=group, resume=job.settings.resume, local_ray=local_ray, time_limit_notice=on_allocation
        )
    if not is_local_ray():
        # The jobs join the cluster themselves: this process, which only watches them, leaves it now
        # rather than after the last job (Ray's disconnect took ~0.6 s of the multirun's end).
        ray.shutdown()


def _prepare_app_jobs(multirun: Multirun, jobs: List[Job]) -> None:
    """Another app's jobs: Ray tasks holding the resources hydra.launcher.* gives each."""
    import ray

    settings = multirun.settings
    for key in ("cpus_per_job", "gpus_per_job"):
        if getattr(settings, key) < 0:
            raise RaydraError(f"hydra.launcher.{key}={getattr(settings, key)} is negative; ask for 0 or more.")
    global _app_cluster_joined
    if not ray.is_initialized():
        # Ray's own rule for an address left null: RAY_ADDRESS if set, else a local Ray started here.
        _app_cluster_joined = bool(settings.address or os.environ.get("RAY_ADDRESS"))
        ray.init(address=settings.address, runtime_env=settings.runtime_env or None, logging_level=logging.WARNING, configure_logging=False)
        where = "joined the Ray cluster at" if _app_cluster_joined else "started a local Ray at"
        log.info(f"{where} {ray.get_runtime_context().gcs_address} with {ray.cluster_resources().get('CPU', 0):g} CPUs")
    fits = _app_jobs_that_fit(settings)
    for job in jobs:
        job.share = 1.0 / fits


def _app_jobs_that_fit(settings: RaydraLauncherConf) -> int:
    """How many jobs of hydra.launcher's size the cluster's live nodes hold side by side."""
    import ray

    asked = {"CPU": settings.cpus_per_job, "GPU": settings.gpus_per_job, **settings.resources_per_job}
    asked = {k: float(v) for k, v in asked.items() if v}
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    fits = sum(min((int(node.get(k, 0) // v) for k, v in asked.items()), default=1) for node in nodes) if asked else len(nodes)
    if fits < 1:
        has = ", ".join("{" + ", ".join(f"{k}: {node.get(k, 0):g}" for k in asked) + "}" for node in nodes)
        raise RaydraError(
            "a job asks for {" + ", ".join(f"{k}: {v:g}" for k, v in asked.items()) + "} (hydra.launcher.cpus_per_job, gpus_per_job, "
            f"resources_per_job) but no node of the Ray cluster has that much (its nodes: {has}); ask for less."
        )
    return fits


def _leave_joined_cluster() -> None:
    """Leave a cluster this process joined for an app's jobs (the next batch joins again); a Ray it
    started stays for the next batch and ends with the process."""
    import ray

    if ray.is_initialized() and _app_cluster_joined:
        ray.shutdown()


@contextmanager
def _as_current_job(job: Job) -> Iterator[None]:
    """Hydra's global config is the job's while its config is read, so `${hydra:job.num}` and the
    like resolve as they will in the job."""
    from hydra.core.hydra_config import HydraConfig

    outer = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(job.cfg)
    try:
        yield
    finally:
        HydraConfig.instance().cfg = outer


def _check_run(job: Job) -> None:
    """The checks the job's driver makes before it starts Ray: the same prepare, as a dry run (it
    works on a copy, and its config is dropped)."""
    from raydra.run.prepare import Invocation, prepare

    prepare(job.cfg, Invocation(overrides=tuple(job.overrides)))


def _refuse_for(job: Job, check: Any, arg: Any) -> None:
    try:
        check(arg)
    except RaydraError as error:
        raise RaydraError(f"multirun job {job.label} cannot run, so no job was started: {error}") from None


def _runs_that_fit(cfg: DictConfig) -> int:
    """How many raydra runs like this one the cluster holds side by side."""
    import ray

    from raydra.cluster.ray_cluster import trials_that_fit

    if cfg.get("tune") is not None:
        return 1  # a tune= job is a sweep that sizes its trials to the whole cluster by itself
    scale = OmegaConf.to_object(cfg.scale)
    fits = trials_that_fit(scale)
    if data_loader(cfg.data) == "ray_data":
        # Ray Data's preprocessing tasks run beside the workers on CPUs no worker holds: leave one
        # per run, or side-by-side runs take every CPU and their data never arrives.
        per_run = scale.max_workers * scale.cpus_per_worker + 1
        fits = min(fits, int(ray.cluster_resources().get("CPU", 0) // per_run))
    return max(1, fits)


def _schedule(multirun: Multirun, jobs: List[Job], life: Lifecycle) -> None:
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
            _run_queue(multirun, jobs, queued, running, max_concurrent, notice.noticed)
    except BaseException:
        # Ctrl-C, SIGTERM, or a fault here: no job may go on running unwatched.
        _stop(multirun, running)
        for job in queued:
            job.status, job.error = Status.NOT_STARTED, "the multirun stopped before it started"
        raise
    for job in queued:
        job.status, job.error = Status.NOT_STARTED, notice.reason().split(";")[0] + "; the requeued job runs it"


def _run_queue(
    multirun: Multirun, jobs: List[Job], queued: List[Job], running: List[Job], max_concurrent: Optional[int], noticed: Callable[[], bool]
) -> None:
    """Start the queued jobs in order as room frees, until every one has ended (or SLURM's
    time-limit notice came, `noticed`: then until the running ones have)."""
    while (queued and not noticed()) or running:
        # In order: a job that does not fit yet waits for room rather than being overtaken.
        while queued and not noticed() and _room_for(queued[0], running, max_concurrent):
            job = queued.pop(0)
            _start(multirun, job, running_after=sum(not j.trained for j in running) + 1, waiting=len(queued))
            running.append(job)
        for job in running[:]:
            if _has_ended(job):
                running.remove(job)
                _settle(multirun, job, stopped=False)
                _record(multirun, jobs)
            elif multirun.raydra_runs and not job.trained:
                job.trained = _outcome_recorded(job)
        _wait_for_an_end(running)


def _join_processes(jobs: List[Job]) -> None:
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
        _take_result(job)
    # Its JobReturn is its outcome; its process is still leaving Ray and running its exit handlers,
    # which the multirun waits for only at its end (_join_processes).
    return job.returned is not None or job.process.exitcode is not None


def _take_result(job: Job) -> None:
    """Read the job's JobReturn as soon as it comes: a large one fills the pipe, and the job's
    process cannot end before it is read."""
    import cloudpickle

    try:
        job.returned = cloudpickle.loads(job.result.recv_bytes())
    except (EOFError, OSError):
        job.returned = None  # it ended without one: _settle says why


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


def _room_for(job: Job, running: List[Job], max_concurrent: Optional[int]) -> bool:
    # A raydra run whose outcome is recorded has released its workers; the seconds its process
    # takes to close (its report, Ray's shutdown) need not hold the next job back.
    holding = [j for j in running if not j.trained]
    if not holding:
        return True  # it fits the cluster alone: checked before anything started
    if max_concurrent and len(holding) >= max_concurrent:
        return False
    return sum(j.share for j in holding) + job.share <= 1 + 1e-9


def _summary(job: Job) -> Optional[RunRecord]:
    # None: not written yet (summary.json is replaced whole, never seen half-written).
    return summary.try_read(job.dir)


def _outcome_recorded(job: Job) -> bool:
    """summary.json says how the run ended: the driver writes that once its TorchTrainer has
    returned, its workers and their placement group gone."""
    run = _summary(job)
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
        _settle(multirun, job, stopped=True)


def _stop_processes(running: List[Job]) -> None:
    for job in running:
        job.process.terminate()  # SIGTERM
    deadline = time.time() + STOP_WAIT_S
    try:
        while any(j.process.exitcode is None for j in running) and time.time() < deadline:
            _wait_for_an_end(running)
            for job in running:
                if job.returned is None and job.result.poll():
                    _take_result(job)
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


def _settle(multirun: Multirun, job: Job, stopped: bool) -> None:
    """The job's outcome: its JobReturn and, for a raydra run, its summary.json; a job that ended
    without either (killed, or stopped before it started) gets an outcome that says so."""
    from hydra.core.utils import JobStatus

    job.ended = time.time()
    if job.task is not None:
        _take_task_result(job)
    elif job.returned is None and not job.result.closed:
        if job.result.poll():
            _take_result(job)
        job.result.close()
    if multirun.raydra_runs:
        _settle_run(job, stopped)
    elif job.returned is not None:
        job.status = Status.COMPLETED if job.returned.status == JobStatus.COMPLETED else Status.FAILED
        if job.status == Status.FAILED:
            error = job.returned._return_value
            job.error = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    else:
        job.status = Status.INTERRUPTED if stopped else Status.FAILED
        job.error = job.error or "its Ray task ended without a result"
    took = f"{job.ended - job.started:.1f} s"
    if job.status == Status.COMPLETED:
        if multirun.raydra_runs:
            shown = f"best {job.monitor} {job.metric:.4f}" if job.metric is not None else f"no {job.monitor} logged"
        else:
            shown = f"returned {_shown_value(job.returned.return_value)}"
        log.info(f"[{job.num}] completed in {took}  {shown}  {' '.join(job.shown)}\n  dir  {job.dir}")
    else:
        log.info(f"[{job.num}] {job.status} after {took}  {' '.join(job.shown)}: {job.error}\n  dir  {job.dir}")


def _take_task_result(job: Job) -> None:
    import cloudpickle
    import ray

    try:
        job.returned = cloudpickle.loads(ray.get(job.task, timeout=10))
    except ray.exceptions.TaskCancelledError:
        job.error = "stopped with the multirun"
    except ray.exceptions.RayTaskError as error:
        # Hydra could not set the job up (run_job raised outside the task function).
        cause = error.cause if isinstance(getattr(error, "cause", None), BaseException) else error
        job.error = f"{type(cause).__name__}: {cause}".splitlines()[0][:300]
    except Exception as error:  # the task's worker or node died
        job.error = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:300]


def _settle_run(job: Job, stopped: bool) -> None:
    run = _summary(job)
    if run and run.ended:
        job.status, job.error = run.status, run.error
    else:
        job.error = _last_words(job, job.process.exitcode)
        if run:
            run = run.interrupted(job.error) if stopped else run.failed(job.error)
            summary.write(job.dir, run)
        job.status = Status.INTERRUPTED if stopped else Status.FAILED
    if run:
        job.monitor = run.monitor.metric
        job.metric = run.best_value()


def _shown_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _last_words(job: Job, code: int) -> str:
    console = job.dir / CONSOLE
    lines = [line.strip() for line in console.read_text(errors="replace").splitlines() if line.strip()] if console.is_file() else []
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    said = f" ({lines[-1][:200]})" if lines else ""
    return f"its process ended ({how}) before recording an outcome{said}; see {console}"


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


def _read_record(sweep_dir: Path) -> Optional[JobsRecord]:
    """The multirun's jobs.json, or None where there is none to read (missing, cut short, not an object)."""
    try:
        return jobs_record.read(sweep_dir)
    except (envelope.RecordError, OSError):
        return None


def _record(multirun: Multirun, jobs: List[Job]) -> None:
    """jobs.json: what a resumed multirun reads. Jobs of earlier batches stay in it."""
    entries = {}
    for job in jobs:
        if job.status == Status.KEPT:
            value = job.value
        elif job.status == Status.COMPLETED:
            value = _json_value(job.metric if multirun.raydra_runs else job.returned.return_value)
        else:
            value = None
        status = Status.COMPLETED if job.status == Status.KEPT else job.status
        entries[job.num] = jobs_record.JobEntry(
            overrides=list(job.overrides), dir=str(job.dir), status=status, return_value=value, error=job.error
        )
    multirun.record = (multirun.record or JobsRecord.started()).with_jobs(entries)
    jobs_record.write(multirun.sweep_dir, multirun.record)
    multirun.written = True


def _json_value(value: Any) -> Any:
    """A return value as jobs.json can keep it for a resumed multirun's sweeper: JSON, or null."""
    import json

    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return None


def report(multirun: Multirun, jobs: List[Job]) -> None:
    """The closing lines: for raydra runs the table `raydra compare <sweep dir>` prints; what did
    not complete; how to continue the multirun."""
    sweep_dir = multirun.sweep_dir
    with _console(sweep_dir):
        if multirun.raydra_runs:
            from raydra import compare as cmp

            notes: List[str] = []
            runs = cmp.collect([str(sweep_dir)], [], notes)
            if runs:
                metrics = cmp.choose_metrics(runs, None, notes)
                keys = cmp.differing_keys(runs)
                rows = cmp.build_table(runs, metrics, keys, notes)
                log.info("\n" + cmp.render_table(cmp.table_columns(keys, metrics), rows, keys))
        bad = [j for j in jobs if j.status not in (Status.COMPLETED, Status.KEPT)]
        if not bad:
            then = f"; compare them again with: raydra compare {sweep_dir}" if multirun.raydra_runs else f"\n  dir  {sweep_dir}"
            log.info(f"all {len(jobs)} jobs completed{then}")
            return
        log.info(f"{len(bad)} of {len(jobs)} jobs did not complete: " + ", ".join(f"{j.label} {j.status}" for j in bad))
        left_out = secrets_left_out(multirun)
        log.info(
            "continue the multirun (completed jobs are kept, the others run again"
            + (", a run from its last checkpoint" if multirun.raydra_runs else "")
            + f") with:\n  {continue_command(multirun)}"
            + (f"\n  {left_out}" if left_out else "")
        )


def continue_command(multirun: Multirun) -> str:
    """This multirun's command line as typed, pointed at its sweep directory, with resume on; each
    secret in it shown as *** (secrets_left_out says so)."""
    script = sys.argv[0]
    shown = script if " " in script else f"python {os.path.relpath(script)}"
    kept = [redact(o) for o in _typed_to_continue(multirun)]
    return " ".join(
        [shown, "-m", *(shlex.quote(o) for o in kept), shlex.quote(f"hydra.sweep.dir={multirun.sweep_dir}"), "hydra.launcher.resume=true"]
    )


def secrets_left_out(multirun: Multirun) -> Optional[str]:
    """The sentence that goes with continue_command when it shows *** for a secret: nothing records
    a secret, so the user gives it again (resume refuses *** in its place, raydra.redact.stands_for_a_secret)."""
    held = [o for o in _typed_to_continue(multirun) if redact(o) != o]
    if not held:
        return None
    keys = ", ".join(o.split("=", 1)[0] for o in held)
    return f"*** stands for a secret, which nothing records: put each back in its place ({keys}) before running it"


def _how_to_continue(multirun: Multirun) -> str:
    """An interrupted record's command, and the sentence on its secrets, if it has any."""
    return "; ".join(filter(None, (continue_command(multirun), secrets_left_out(multirun))))


def _typed_to_continue(multirun: Multirun) -> List[str]:
    # hydra.mode=MULTIRUN is Hydra's own record of -m.
    return [o for o in multirun.typed if not o.lstrip("+~").startswith(("hydra.sweep.dir=", "hydra.launcher.resume=", "hydra.mode="))]


@contextmanager
def _console(sweep_dir: Path) -> Iterator[None]:
    """raydra's lines on this process's console and in <sweep dir>/multirun.log. Hydra configures
    logging for a job only inside the job, so the multirun's own process has none for them."""
    logger = logging.getLogger("raydra")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter("%(message)s"))
    file = logging.FileHandler(sweep_dir / MULTIRUN_LOG)
    file.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    for handler in (console, file):
        handler.addFilter(SecretsFilter())
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers, logger.propagate = [console, file], False
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        file.close()
        logger.handlers, logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])
