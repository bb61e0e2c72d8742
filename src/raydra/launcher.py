"""Hydra multirun jobs side by side on the Ray cluster: what `python train.py -m ...` runs.

Every job is its own `python train.py <its overrides> hydra.run.dir=<its dir> ray.address=<the
cluster>` process, so a job is exactly a single run (its own TorchTrainer, run directory, W&B run and
Hydra state) and nothing one job leaves in a process (Ray, W&B, Hydra's globals) reaches another.
This process joins the cluster once (or starts a local Ray the jobs join), refuses before any job
starts when one of them could never be placed, starts as many as the cluster holds side by side,
queues the rest, and ends with the table `raydra compare <sweep dir>` prints.

The Hydra plugin in hydra_plugins/raydra_launcher composes each job's config and turns the jobs'
outcomes into Hydra's JobReturns; everything else is here.
"""

import logging
import math
import multiprocessing.connection
import os
import re
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, List, Optional

from omegaconf import DictConfig

from raydra import job_process
from raydra import summary as run_summary
from raydra.errors import RaydraError
from raydra.schema import worker_range

log = logging.getLogger("raydra")

# Hydra overrides that shape the multirun itself, not a job: a job is a single run in its own
# directory (and hydra.mode=MULTIRUN passed on would make every job a multirun of its own).
NOT_FOR_JOBS = re.compile(r"^[~+]*hydra([./](mode|run|sweep|sweeper|launcher)|\.job\.(id|num))(\W|$)")
RAY_ADDRESS = re.compile(r"^[~+]*ray\.address=")
# How often a running job's summary.json is read for its outcome; a job's process ending wakes the
# launcher at once.
POLL_S = 0.2
# How long stopped jobs get to record themselves interrupted (stop their workers, write summary.json)
# before they are killed.
STOP_WAIT_S = 120
CONSOLE = "console.log"


@dataclass
class Job:
    num: int
    overrides: List[str]  # the job's own overrides, as the sweeper made them
    cfg: DictConfig  # its composed config
    dir: Path
    share: float = 1.0  # the fraction of the cluster its workers take
    command: List[str] = field(default_factory=list)
    proc: Any = None  # its multiprocessing Process (raydra.job_process)
    started: float = 0.0
    ended: float = 0.0
    status: str = "queued"
    error: Optional[str] = None
    metric: Optional[float] = None
    monitor: Optional[str] = None
    shown: List[str] = field(default_factory=list)  # its overrides that tell it from the other jobs
    run_overrides: List[str] = field(default_factory=list)  # what its train.py got, less ray.address
    trained: bool = False  # its summary.json holds its outcome: its workers are gone, its process is closing

    @property
    def label(self) -> str:
        return f"#{self.num} ({' '.join(self.shown) or 'no overrides'})"


def run(jobs: List[Job], entry: List[str], hydra_overrides: List[str], sweep_dir: Path, max_concurrent: Any) -> List[Job]:
    """Run `jobs` (composed by the plugin) as `entry` processes; returns them with their outcome.

    `entry`: the command that runs one job (python, the script, its config path and name).
    `hydra_overrides`: the multirun's own hydra.* overrides, of which the jobs get those for a run.
    Raises RaydraError, before any job starts, if one of them cannot run on the cluster."""
    if not jobs:
        return jobs
    # Lines name a job by what sets it apart: the overrides all jobs share are said once.
    common = set.intersection(*(set(j.overrides) for j in jobs)) if len(jobs) > 1 else set()
    for job in jobs:
        job.shown = [o for o in job.overrides if o not in common]
    with _console(sweep_dir):
        try:
            _prepare(jobs, entry, hydra_overrides, sweep_dir, max_concurrent)
        except RaydraError as error:
            log.error(f"error: {error}")
            raise
        with _sigterm_interrupts():
            _schedule(jobs, max_concurrent)
    return jobs


def _prepare(jobs: List[Job], entry: List[str], hydra_overrides: List[str], sweep_dir: Path, max_concurrent: Any) -> None:
    """Check every job can run, join the cluster, and build each job's command."""
    from raydra import project
    from raydra.cluster import check_fits, connect, is_local_ray
    from raydra.schema import validate

    if max_concurrent is not None and (isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1):
        raise RaydraError(
            f"hydra.launcher.max_concurrent={max_concurrent} must be a whole number of at least 1, "
            "or null to run as many jobs at once as the Ray cluster holds."
        )

    # A config mistake in any job refuses the whole multirun, before any job runs: the grid
    # is fixed first and then run, as Hydra already does for values of the wrong type.
    for job in jobs:
        _refuse_for(job, validate, job.cfg)
    first = jobs[0].cfg
    # The jobs' server imports for ~2 s, alongside what follows when it can. Ray reads its auth
    # mode from the environment at import, and ray.init sets it there when it starts a cluster or
    # finds one (`auto`): then the server starts after connect, to import as a job started now
    # would. Joining a named address changes nothing Ray reads at import.
    joins_named_address = first.ray.address not in (None, "auto")
    if joins_named_address:
        job_process.start_server()
    connect(first.ray.address, first.ray.num_cpus, first.verbose, project.runtime_env(first))
    if not joins_named_address:
        job_process.start_server()
    import ray

    local = ray.get_runtime_context().gcs_address
    forwarded = [o for o in hydra_overrides if not NOT_FOR_JOBS.match(o)]
    for job in jobs:
        _refuse_for(job, check_fits, job.cfg.scale)
        job.share = 1.0 / _jobs_that_fit(job.cfg)
        overrides = _job_overrides(job, local, sweep_dir)
        job.run_overrides = [o for o in overrides if not RAY_ADDRESS.match(o)]
        job.command = [*entry, *overrides, *forwarded, f"hydra.run.dir={_quote(str(job.dir))}"]
    if not is_local_ray():
        # The jobs join the cluster themselves: this process, which only watches them, leaves it now
        # rather than after the last job (Ray's disconnect took ~0.6 s of the multirun's end).
        ray.shutdown()
    common = [o for o in jobs[0].overrides if o not in jobs[0].shown]
    fit = math.floor(1 / jobs[0].share + 1e-9)
    cap = f"hydra.launcher.max_concurrent={max_concurrent}" if max_concurrent else "cap it with hydra.launcher.max_concurrent=N"
    log.info(
        f"multirun: {len(jobs)} jobs, up to {min(fit, max_concurrent or fit, len(jobs))} at a time "
        f"(the Ray cluster holds {fit} side by side; {cap})"
        + f"\n  dir  {sweep_dir}"
        + (f"\n  every job  {' '.join(common)}" if common else "")
    )


def _refuse_for(job: Job, check: Any, arg: Any) -> None:
    try:
        check(arg)
    except RaydraError as error:
        raise RaydraError(f"multirun job {job.label} cannot run, so no job was started: {error}") from None


def _jobs_that_fit(cfg: DictConfig) -> int:
    """How many runs like this one the cluster holds side by side."""
    import ray

    from raydra.cluster import trials_that_fit

    if cfg.get("tune") is not None:
        return 1  # a tune= job is a sweep that sizes its trials to the whole cluster by itself
    fits = trials_that_fit(cfg.scale)
    if cfg.data.get("loader") == "ray_data":
        # Ray Data's preprocessing tasks run beside the workers on CPUs no worker holds: leave one
        # per run, or side-by-side runs take every CPU and their data never arrives.
        per_run = worker_range(cfg.scale.num_workers)[1] * cfg.scale.cpus_per_worker + 1
        fits = min(fits, int(ray.cluster_resources().get("CPU", 0) // per_run))
    return max(1, fits)


def _job_overrides(job: Job, local_address: str, sweep_dir: Path) -> List[str]:
    """The job's overrides, joined to this multirun's cluster and W&B group."""
    address = job.cfg.ray.address or local_address
    overrides = [o for o in job.overrides if not RAY_ADDRESS.match(o)]
    overrides.append(f"ray.address={_quote(address)}")
    if "wandb" in job.cfg.logger and job.cfg.logger.wandb.group is None:
        # One W&B group for the multirun, named as a tune= sweep's group is: <date>_<time>_<name>.
        overrides.append(f"logger.wandb.group={_quote(sweep_dir.parent.name + '_' + sweep_dir.name)}")
    return overrides


def _quote(value: str) -> str:
    """A value as a quoted Hydra override value: paths and addresses may hold `,` or `=`, which
    Hydra would read as a sweep or a key."""
    return "'" + value.replace("'", "\\'") + "'"


def _schedule(jobs: List[Job], max_concurrent: Optional[int]) -> None:
    queued, running = list(jobs), []
    try:
        while queued or running:
            # In order: a job that does not fit yet waits for room rather than being overtaken.
            while queued and _room_for(queued[0], running, max_concurrent):
                job = queued.pop(0)
                _start(job, running_after=sum(not j.trained for j in running) + 1, waiting=len(queued))
                running.append(job)
            for job in running[:]:
                if job.proc.exitcode is not None:
                    running.remove(job)
                    _settle(job, stopped=False)
                elif not job.trained:
                    job.trained = _outcome_recorded(job)
            _wait_for_an_exit(running)
    except BaseException:
        # Ctrl-C, SIGTERM, or a fault here: no job may go on running unwatched.
        _stop(running)
        for job in queued:
            job.status, job.error = "not started", "the multirun stopped before it started"
        raise


def _wait_for_an_exit(running: List[Job]) -> None:
    """Until one of `running` that has not ended yet ends, or POLL_S (an ended one's sentinel
    stays ready: waiting on it would return at once, every time)."""
    multiprocessing.connection.wait([job.proc.sentinel for job in running if job.proc.exitcode is None], timeout=POLL_S)


def _room_for(job: Job, running: List[Job], max_concurrent: Optional[int]) -> bool:
    # A job whose outcome is recorded has released its workers; the seconds its process takes to
    # close (its report, Ray's shutdown) need not hold the next job back.
    training = [j for j in running if not j.trained]
    if not training:
        return True  # it fits the cluster alone: checked before anything started
    if max_concurrent and len(training) >= max_concurrent:
        return False
    return sum(j.share for j in training) + job.share <= 1 + 1e-9


def _outcome_recorded(job: Job) -> bool:
    """summary.json says how the run ended: the driver writes that once its TorchTrainer has
    returned, its workers and their placement group gone."""
    try:
        return run_summary.read(job.dir).get("status") != "running"
    except (OSError, ValueError):
        return False  # not written yet (summary.json is replaced whole, never seen half-written)


def _start(job: Job, running_after: int, waiting: int) -> None:
    job.dir.mkdir(parents=True, exist_ok=True)
    # Its own session: Ctrl-C reaches only this process, which stops each job once, with SIGTERM
    # (a job hit by both would be interrupted again while it records its interruption).
    job.proc = job_process.start(job.command, str(job.dir / CONSOLE), {**os.environ, "PYTHONUNBUFFERED": "1"})
    job.started, job.status = time.time(), "running"
    log.info(f"[{job.num}] started  {' '.join(job.shown)}  ({running_after} running, {waiting} queued)")


def _stop(running: List[Job]) -> None:
    if not running:
        return
    log.info(f"stopping {len(running)} running job(s): each records itself interrupted ...")
    for job in running:
        job.proc.terminate()  # SIGTERM
    deadline = time.time() + STOP_WAIT_S
    try:
        while any(j.proc.exitcode is None for j in running) and time.time() < deadline:
            _wait_for_an_exit(running)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: stop waiting
    for job in running:
        if job.proc.exitcode is None:
            job.proc.kill()
            job.proc.join()
        _settle(job, stopped=True)


def _settle(job: Job, stopped: bool) -> None:
    """The job's outcome from its summary.json; a job that ended without writing one (killed, or
    stopped before its driver started) gets one that says so."""
    job.ended = time.time()
    code = job.proc.exitcode
    path = job.dir / run_summary.SUMMARY
    summary = run_summary.read(job.dir) if path.is_file() else None
    if summary and summary.get("status") != "running":
        job.status, job.error = summary["status"], summary.get("error")
    else:
        job.status = "interrupted" if stopped else "failed"
        job.error = _last_words(job, code)
        if summary:
            summary.update(status=job.status, error=job.error, finished_at=run_summary.now())
            run_summary.write(job.dir, summary)
    if summary:
        job.monitor = summary["monitor"]["metric"]
        job.metric = summary.get("metrics", {}).get("best", {}).get(job.monitor)
    took = f"{job.ended - job.started:.1f} s"
    if job.status == "completed":
        shown = f"best {job.monitor} {job.metric:.4f}" if job.metric is not None else f"no {job.monitor} logged"
        log.info(f"[{job.num}] completed in {took}  {shown}  {' '.join(job.shown)}\n  dir  {job.dir}")
    else:
        log.info(f"[{job.num}] {job.status} after {took}  {' '.join(job.shown)}: {job.error}\n  dir  {job.dir}")


def _last_words(job: Job, code: int) -> str:
    lines = [line.strip() for line in (job.dir / CONSOLE).read_text(errors="replace").splitlines() if line.strip()]
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    said = f" ({lines[-1][:200]})" if lines else ""
    return f"its process ended ({how}) before recording an outcome{said}; see {job.dir / CONSOLE}"


def report(jobs: List[Job], sweep_dir: Path) -> None:
    """The closing table, as `raydra compare <sweep dir>` prints it, and what failed or stopped."""
    from raydra import compare as cmp

    with _console(sweep_dir):
        notes: List[str] = []
        runs = cmp.collect([str(sweep_dir)], [], notes)
        if runs:
            metrics = cmp.choose_metrics(runs, None, notes)
            keys = cmp.differing_keys(runs)
            rows = cmp.build_table(runs, metrics, keys, notes)
            log.info("\n" + cmp.render_table(cmp.table_columns(keys, metrics), rows, keys))
        bad = [j for j in jobs if j.status != "completed"]
        if not bad:
            log.info(f"all {len(jobs)} jobs completed; compare them again with: raydra compare {sweep_dir}")
            return
        log.info(f"{len(bad)} of {len(jobs)} jobs did not complete: " + ", ".join(f"{j.label} {j.status}" for j in bad))
        stopped = [j for j in bad if j.status == "interrupted" and (j.dir / run_summary.SUMMARY).is_file()]
        if stopped:
            # Its overrides as its train.py got them (the W&B group included): resume= refuses a
            # config that differs from the one the run started with.
            job = stopped[0]
            script = os.path.relpath(job.command[1])
            log.info(
                "continue an interrupted job with its overrides and resume=<its dir>, e.g.\n"
                f"  python {script} {' '.join(job.run_overrides)} resume={job.dir}"
            )


@contextmanager
def _console(sweep_dir: Path) -> Iterator[None]:
    """raydra's lines on this process's console and in <sweep dir>/multirun.log. Hydra configures
    logging for a job only inside the job, so the multirun's own process has none for them."""
    logger = logging.getLogger("raydra")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter("%(message)s"))
    file = logging.FileHandler(sweep_dir / "multirun.log")
    file.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers, logger.propagate = [console, file], False
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        file.close()
        logger.handlers, logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a scheduler's or `kill`'s stop) stops the multirun as Ctrl-C does. Installed after
    connecting: ray.init puts in a SIGTERM handler of its own that would end this process at once,
    leaving the jobs running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
