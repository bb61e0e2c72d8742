"""What may run, decided before any job of a multirun starts: every job prepared and checked as a
single run is (a mistake in any job refuses the whole multirun), the record of a multirun being
resumed taken over (its completed jobs kept, the others continued), the cluster joined, and each
job's share of it (how many such jobs it holds side by side).
"""

import dataclasses
import logging
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, List

from omegaconf import DictConfig, OmegaConf

from hydra_plugins.raydra_launcher.raydra_launcher import RaydraLauncherConf
from raydra.cluster import batch_system
from raydra.config.schema import data_loader
from raydra.errors import RaydraError
from raydra.multirun import job_process, outcome
from raydra.multirun.job import Job
from raydra.multirun.state import Multirun
from raydra.records import layout
from raydra.records.envelope import Status
from raydra.records.jobs import JobsRecord
from raydra.records.layout import JOBS_RECORD, MULTIRUN_LOG
from raydra.redact import redact, stands_for_a_secret
from raydra.run.lifecycle import Lifecycle
from raydra.run.prepare import JobSettings

log = logging.getLogger("raydra")

# Whether this process joined a cluster (rather than started a local Ray) for an app's jobs.
_app_cluster_joined = False


def shared(jobs: List[Job]) -> set:
    """The overrides every one of several jobs has."""
    return set.intersection(*(set(j.overrides) for j in jobs)) if len(jobs) > 1 else set()


def prepare(multirun: Multirun, jobs: List[Job], life: Lifecycle) -> None:
    """Check every job can run, keep what a resumed multirun completed, join the cluster."""
    begin(multirun, jobs)
    to_run = [job for job in jobs if job.status != Status.KEPT]
    if multirun.raydra_runs:
        _prepare_runs(multirun, to_run, life)
    else:
        _prepare_app_jobs(multirun, to_run)
    outcome.record(multirun, jobs)
    if not to_run:
        log.info(f"multirun: all {len(jobs)} jobs of this batch completed before; none runs again\n  dir  {multirun.sweep_dir}")
        return
    common = [redact(o) for o in jobs[0].overrides if o in shared(jobs)]
    fit = math.floor(1 / max(j.share for j in to_run) + 1e-9)
    max_concurrent = multirun.settings.max_concurrent
    kept = len(jobs) - len(to_run)
    log.info(
        f"multirun: {len(to_run)} jobs, up to {min(fit, max_concurrent or fit, len(to_run))} at a time "
        f"(the Ray cluster holds {fit} side by side; {_cap(multirun)})"
        + (f"; {kept} completed before, kept" if kept else "")
        + f"\n  dir  {multirun.sweep_dir}"
        + (f"\n  every job  {' '.join(common)}" if common else "")
    )


def begin(multirun: Multirun, jobs: List[Job]) -> None:
    """The launcher's settings checked, and the record of a multirun being resumed taken over (for
    `jobs`, and for each job admitted later)."""
    max_concurrent = multirun.settings.max_concurrent
    if max_concurrent is not None and (isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1):
        raise RaydraError(
            f"hydra.launcher.max_concurrent={max_concurrent} must be a whole number of at least 1, "
            "or null to run as many jobs at once as the Ray cluster holds."
        )
    _take_over_record(multirun, jobs)


def admit(multirun: Multirun, job: Job, life: Lifecycle) -> None:
    """One more job of a multirun under way, as an asynchronous sweeper asks for it
    (raydra.multirun.feed): kept or continued as a resumed multirun's jobs are, checked as a single
    run is, sized; the first that runs joins the cluster. Raises RaydraError in one sentence if it
    cannot run."""
    _take_over_job(multirun, job)
    if job.status == Status.KEPT:
        return
    if not multirun.raydra_runs:
        _prepare_app_jobs(multirun, [job])
        return
    if multirun.job_settings is not None:
        with _as_current_job(job):
            _refuse_for(job, _check_run, job)
        _size_run(multirun, job)
        return
    _prepare_runs(multirun, [job], life)
    fit = math.floor(1 / job.share + 1e-9)
    max_concurrent = multirun.settings.max_concurrent
    log.info(
        f"multirun: up to {min(fit, max_concurrent or fit)} jobs at a time, each asked of the sweeper as a slot frees "
        f"(the Ray cluster holds {fit} side by side; {_cap(multirun)})\n  dir  {multirun.sweep_dir}"
    )


def _cap(multirun: Multirun) -> str:
    max_concurrent = multirun.settings.max_concurrent
    return f"hydra.launcher.max_concurrent={max_concurrent}" if max_concurrent else "cap it with hydra.launcher.max_concurrent=N"


def _take_over_record(multirun: Multirun, jobs: List[Job]) -> None:
    """A sweep directory that holds a multirun is continued only when asked to
    (hydra.launcher.resume=true), and only with the same jobs; what it completed is kept. Not asked
    to, the multirun starts afresh there, as under Hydra's basic launcher, except over a raydra
    run's record, which is never overwritten."""
    recorded = outcome.read_record(multirun.sweep_dir)
    # SLURM runs a requeued job's batch script again: the multirun it started continues.
    multirun.resuming = multirun.settings.resume or bool(recorded and batch_system.requeued())
    multirun.recorded = recorded
    if not multirun.first_batch:
        multirun.record = (recorded or JobsRecord.started()).next_batch()
    elif multirun.resuming and recorded:
        multirun.record = recorded.resumed_from_here(log=str(multirun.sweep_dir / MULTIRUN_LOG))
    else:
        multirun.record = JobsRecord.started()
    if multirun.first_batch and multirun.resuming and not recorded:
        raise RaydraError(
            f"hydra.launcher.resume=true: {multirun.sweep_dir} holds no multirun to continue (no {JOBS_RECORD}); "
            "pass hydra.sweep.dir=<the directory of the multirun to continue>."
        )
    for job in jobs:
        _take_over_job(multirun, job)


def _take_over_job(multirun: Multirun, job: Job) -> None:
    """The job's part of _take_over_record: kept if the multirun it continues completed it, continued
    from its run's last checkpoint if that run stopped; refused if it would overwrite a run."""
    if multirun.first_batch and not multirun.resuming:
        if multirun.raydra_runs and (job.dir / layout.SUMMARY).is_file():
            raise RaydraError(
                f"hydra.sweep.dir={multirun.sweep_dir} already holds this multirun's runs (job #{job.num}'s directory "
                f"{job.dir} holds one); continue it with hydra.launcher.resume=true, or give this one another hydra.sweep.dir."
            )
        return
    before = multirun.recorded.job(job.num) if multirun.recorded else None
    if before is None:
        return
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
    run = outcome.summary_of(job) if multirun.raydra_runs else None
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
    if not jobs:
        return
    # A config mistake in any job refuses the whole multirun, before any job runs: the grid is
    # fixed first and then run, as Hydra already does for values of the wrong type.
    for job in jobs:
        with _as_current_job(job):
            _refuse_for(job, _check_run, job)
    # No dashboard for a local Ray of the multirun's: its State API serves Ray Train's placement-group
    # cleaner, which runs whose process ends with them do not start (a tune= job's trials do).
    _join_for_runs(multirun, jobs[0], life, dashboard=any(job.cfg.get("tune") is not None for job in jobs))
    for job in jobs:
        _size_run(multirun, job)


def _join_for_runs(multirun: Multirun, first: Job, life: Lifecycle, dashboard: bool) -> None:
    """Join (or start) the cluster the runs share, and start the jobs' server, as `first` asks."""
    from raydra.cluster.ray_cluster import is_local_ray

    allocation = batch_system.named(first.cfg.ray.address)
    on_allocation = allocation is not None
    if on_allocation:
        # SLURM's time-limit notice from here on: noted, then passed on to the jobs (scheduling.schedule).
        batch_system.watch(allocation)
    # The jobs' server imports for ~2 s, alongside Ray's start or join. Ray reads its auth mode from
    # the environment at import, and ray.init sets it there (RAY_AUTH_MODE=token) as it starts a
    # local Ray whose mode nobody set: the server starts with that mode already, so that it imports
    # as a job started after ray.init would (this process's own Ray, imported already, learns it
    # from ray.init). `auto` finds a cluster whose mode only ray.init learns: the server waits.
    alongside = first.cfg.ray.address != "auto"
    if on_allocation:
        # The token the allocation's cluster will check, in the environment before the jobs' server
        # takes it (and imports Ray with it): each job joins the cluster with it.
        allocation.prepare_cluster()
    if alongside:
        local_mode = {"RAY_AUTH_MODE": "token"} if first.cfg.ray.address is None and "RAY_AUTH_MODE" not in os.environ else {}
        job_process.start_server(env=local_mode)
    # Then the stop signals: ray.init's own SIGTERM handler would end this process at once,
    # leaving the jobs running.
    life.connect(first.cfg, multirun.sweep_dir, dashboard=dashboard)
    if not alongside:
        job_process.start_server()
    import ray

    # The multirun's cluster for a job whose ray.address is null (its own address otherwise), and
    # one W&B group named as a tune= sweep's (<date>_<time>_<name>).
    group = f"{multirun.sweep_dir.parent.name}_{multirun.sweep_dir.name}"
    multirun.job_settings = JobSettings(
        ray_address=ray.get_runtime_context().gcs_address, wandb_group=group, time_limit_notice=on_allocation
    )
    multirun.local_ray = is_local_ray()
    # How many runs like these the cluster holds, measured while this process is still connected.
    _size_run(multirun, first)
    if not multirun.local_ray:
        # The jobs join the cluster themselves: this process, which only watches them, leaves it now
        # rather than after the last job (Ray's disconnect took ~0.6 s of the multirun's end).
        ray.shutdown()


def _size_run(multirun: Multirun, job: Job) -> None:
    """The job's share of the cluster, and its settings. The cluster is measured once, for the
    first job (this process has left a cluster it does not run); the others ask the same of it
    unless their scale differs, and then are measured again."""
    from raydra.cluster.ray_cluster import check_fits

    assert multirun.job_settings is not None
    scale = OmegaConf.to_object(job.cfg.scale)
    # What decides a run's share (_runs_that_fit): its scale, whether it is a sweep, its data loader.
    kind = repr((scale, job.cfg.get("tune") is not None, data_loader(job.cfg.data)))
    if kind not in multirun.sized:
        with _connected(multirun):
            _refuse_for(job, check_fits, scale)
            multirun.sized[kind] = 1.0 / _runs_that_fit(job.cfg)
    job.share = multirun.sized[kind]
    job.settings = dataclasses.replace(
        multirun.job_settings, resume=job.settings.resume, local_ray=multirun.local_ray and job.cfg.ray.address is None
    )


@contextmanager
def _connected(multirun: Multirun) -> Iterator[None]:
    """Connected to the multirun's cluster while it is measured: this process stays connected to a
    local Ray it started, and joins a cluster it left again only for as long as this takes."""
    import ray

    if ray.is_initialized():
        yield
        return
    assert multirun.job_settings is not None
    ray.init(address=multirun.job_settings.ray_address, logging_level=logging.WARNING, configure_logging=False)
    try:
        yield
    finally:
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


def leave_joined_cluster() -> None:
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
