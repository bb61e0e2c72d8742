"""How each job of a multirun ended and what the multirun says of it: each job's outcome settled
(its JobReturn, a raydra run's summary.json, or why it has neither), jobs.json (what a resumed
multirun reads), the closing report on the console and in multirun.log, and the command that
continues the multirun.
"""

import logging
import math
import os
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from raydra.multirun.feed import JobEnd
from raydra.multirun.job import Job
from raydra.multirun.state import Multirun
from raydra.records import envelope, summary
from raydra.records import jobs as jobs_record
from raydra.records.envelope import Status
from raydra.records.jobs import JobsRecord
from raydra.records.layout import CONSOLE, METRICS, MULTIRUN_LOG
from raydra.records.ledger import GroupLedger, duration, group_ledger, run_cost
from raydra.records.summary import RunRecord
from raydra.redact import SecretsFilter, redact

log = logging.getLogger("raydra")


def summary_of(job: Job) -> Optional[RunRecord]:
    # None: not written yet (summary.json is replaced whole, never seen half-written).
    return summary.try_read(job.dir)


def take_result(job: Job) -> None:
    """Read the job's JobReturn as soon as it comes: a large one fills the pipe, and the job's
    process cannot end before it is read."""
    import cloudpickle

    try:
        job.returned = cloudpickle.loads(job.result.recv_bytes())
    except (EOFError, OSError):
        job.returned = None  # it ended without one: settle says why


def settle(multirun: Multirun, job: Job, stopped: bool) -> None:
    """The job's outcome: its JobReturn and, for a raydra run, its summary.json; a job that ended
    without either (killed, or stopped before it started) gets an outcome that says so."""
    from hydra.core.utils import JobStatus

    job.ended = time.time()
    job.released = job.released or job.ended
    if job.task is not None:
        _take_task_result(job)
    elif job.returned is None and not job.result.closed:
        if job.result.poll():
            take_result(job)
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
    if job.status == Status.PRUNED:
        log.info(f"[{job.num}] pruned after {took}  {' '.join(job.shown)}: {job.pruned_by}\n  dir  {job.dir}")
    elif job.status == Status.COMPLETED:
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
    run = summary_of(job)
    if run and run.ended:
        job.status, job.error = run.status, run.error
    else:
        job.error = _last_words(job, job.process.exitcode)
        if run:
            run = run.interrupted(job.error) if stopped else run.failed(job.error)
            summary.write(job.dir, run)
        job.status = Status.INTERRUPTED if stopped else Status.FAILED
    if job.pruned_by and job.status == Status.INTERRUPTED and not stopped:
        # Its sweeper stopped it (scheduling's SIGTERM, which the run records as any stop): a
        # decision, not a stop to continue from. A run that completed first stays completed.
        job.status, job.error = Status.PRUNED, None
        if run:
            run = run.pruned(job.pruned_by)
            summary.write(job.dir, run)
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


def read_record(sweep_dir: Path) -> Optional[JobsRecord]:
    """The multirun's jobs.json, or None where there is none to read (missing, cut short, not an object)."""
    try:
        return jobs_record.read(sweep_dir)
    except (envelope.RecordError, OSError):
        return None


def record(multirun: Multirun, jobs: List[Job]) -> None:
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
            overrides=list(job.overrides),
            dir=str(job.dir),
            status=status,
            return_value=value,
            error=job.error,
            started_at=_when(job.started) if job.status != Status.KEPT else None,
            released_at=_when(job.released) if job.status != Status.KEPT else None,
        )
    multirun.record = (multirun.record or JobsRecord.started()).with_jobs(entries)
    jobs_record.write(multirun.sweep_dir, multirun.record)
    multirun.written = True


def ledger(multirun: Multirun, jobs: List[Job], started: float) -> Optional[GroupLedger]:
    """The multirun's compute ledger (raydra.records.ledger): its raydra runs' ledgers added up, and
    the worker slots it held from its start to now that no job used. Its slots: as many jobs at a
    time as the cluster holds (or hydra.launcher.max_concurrent allows), times a job's workers. Of
    this invocation: jobs a resumed multirun kept are not counted again."""
    ran = [job for job in jobs if job.status not in (Status.KEPT, Status.NOT_STARTED, Status.QUEUED)]
    if not multirun.raydra_runs or not ran:
        return None
    records = [(job, summary_of(job)) for job in ran]
    found = [(job, run) for job, run in records if run is not None]
    fit = math.floor(1 / max(job.share for job in ran) + 1e-9)
    at_once = max(1, min(fit, multirun.settings.max_concurrent or fit, len(ran)))
    workers = max((run.world_size or 1 for _, run in found), default=1)
    scored = [(job, run.best_value(), run.monitor.mode) for job, run in found if run.status == Status.COMPLETED]
    scored = [(job, value, mode) for job, value, mode in scored if isinstance(value, (int, float))]
    best = None
    if scored:
        pick = min if scored[0][2] == "min" else max
        best = str(pick(scored, key=lambda item: item[1])[0].num)
    gpu = any(run.ledger is not None and run.ledger.gpu for _, run in found)
    costs = [run_cost(str(job.num), run) for job, run in found]
    return group_ledger(costs, slots=at_once * workers, wall_s=time.time() - started, best=best, gpu=gpu)


def end_of(job: Job) -> JobEnd:
    """How the job ended, as an asynchronous sweeper is told it (raydra.multirun.feed)."""
    if job.status == Status.KEPT:
        value = job.value
    elif job.status in (Status.COMPLETED, Status.PRUNED) and job.monitor is not None:
        value = job.metric if job.status == Status.COMPLETED else _last_value(job)
    elif job.status == Status.COMPLETED and job.returned is not None:
        value = job.returned.return_value
    else:
        value = None
    return JobEnd(num=job.num, status=job.status, value=value, error=job.error, returned=job.returned)


def _last_value(job: Job) -> Any:
    """A pruned run's metric at the last epoch it logged."""
    epochs = epochs_of(job, job.monitor or "")
    return epochs[max(epochs)] if epochs else None


def epochs_of(job: Job, metric: str) -> Dict[int, float]:
    """The run's `metric` by epoch as its metrics.csv holds it now (rank 0 rewrites the file as it
    logs, so a row being written is left for the next read: only whole lines count). {} before its
    first such epoch, or where the file cannot be read."""
    import csv
    import io

    try:
        text = (job.dir / METRICS).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    whole = text[: text.rfind("\n") + 1]
    found: Dict[int, float] = {}
    for row in csv.DictReader(io.StringIO(whole)):
        value, epoch = row.get(metric), row.get("epoch")
        try:
            number, at = float(value or ""), int(float(epoch or ""))
        except ValueError:
            continue
        if math.isfinite(number):
            found[at] = number
    return found


def _when(seconds: float) -> Optional[str]:
    from datetime import datetime

    return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="milliseconds") if seconds else None


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
    with console(sweep_dir):
        if multirun.raydra_runs:
            from raydra import compare as cmp

            notes: List[str] = []
            runs = cmp.collect([str(sweep_dir)], [], notes)
            if runs:
                metrics = cmp.choose_metrics(runs, None, notes)
                keys = cmp.differing_keys(runs)
                rows = cmp.build_table(runs, metrics, keys, notes)
                log.info("\n" + cmp.render_table(cmp.table_columns(keys, metrics), rows, keys))
        spent = multirun.record.ledger if multirun.record else None
        if spent is not None and spent.allocated_s:
            log.info(
                f"compute: {spent.runs} jobs used {duration(spent.runs_s)} of {spent.slots} worker slots' {duration(spent.allocated_s)}"
                f" (idle {spent.idle_s / spent.allocated_s:.0%}, goodput {spent.goodput or 0:.0%})"
            )
        # A pruned job ended as its sweeper decided: nothing to continue.
        bad = [j for j in jobs if j.status not in (Status.COMPLETED, Status.KEPT, Status.PRUNED)]
        pruned = sum(j.status == Status.PRUNED for j in jobs)
        if pruned:
            log.info(f"{pruned} of {len(jobs)} jobs were pruned by the sweeper")
        if not bad:
            then = f"; compare them again with: raydra compare {sweep_dir}" if multirun.raydra_runs else f"\n  dir  {sweep_dir}"
            log.info(f"all {len(jobs) - pruned} jobs {'left ' if pruned else ''}completed{then}")
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


def how_to_continue(multirun: Multirun) -> str:
    """An interrupted record's command, and the sentence on its secrets, if it has any."""
    return "; ".join(filter(None, (continue_command(multirun), secrets_left_out(multirun))))


def _typed_to_continue(multirun: Multirun) -> List[str]:
    # hydra.mode=MULTIRUN is Hydra's own record of -m.
    return [o for o in multirun.typed if not o.lstrip("+~").startswith(("hydra.sweep.dir=", "hydra.launcher.resume=", "hydra.mode="))]


@contextmanager
def console(sweep_dir: Path) -> Iterator[None]:
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
