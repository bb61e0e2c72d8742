"""The single-run driver: one run's lifecycle around the run sequence (raydra.run.sequence), whose
stages a Tune trial walks too; what only a run does is here, between them.

    prepare (the config final and checked) -> resume? -> connect to Ray (the `_target_`s' arguments
    checked and the training code imported alongside) -> start (resolved, summary.json "running")
    -> check the cluster can hold it -> fit (summary.json's outcome) -> the closing lines

Local mode (scale.num_workers=0) starts no Ray: the fit runs the worker function in this process.

raydra.run.lifecycle connects, takes the stop signals and the stop notice, and says how the run ended:
Ctrl-C and SIGTERM end the run as "interrupted" with the command that continues it (SIGTERM's
record written at once as well); any other failure is recorded as "failed" with one line saying
why, then raised. The entry (raydra.entry)
turns a RaydraError into exit code 1; nothing here exits the process or reads Hydra's state, so a
Hydra multirun job, a script or a test can call `train_run` directly.
"""

import contextlib
import copy
import importlib
import logging
import shutil
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, List, Optional

import ray
from omegaconf import DictConfig

from raydra.cluster import batch_system
from raydra.cluster.ray_cluster import check_fits, check_room_for_data
from raydra.cluster.worker_output import worker_output
from raydra.config.spec import Place, RunSpec
from raydra.errors import RaydraError
from raydra.records import layout, lock, summary, sync, trust, wandb_run
from raydra.records.checkpoints import last_checkpoint
from raydra.records.summary import RunRecord
from raydra.redact import redact, redact_yaml_files
from raydra.run import resolve, resume, startup
from raydra.run.lifecycle import FAILED, INTERRUPTED, Ending, Lifecycle
from raydra.run.prepare import Invocation, JobSettings
from raydra.run.sequence import RunSequence, record_ended

log = logging.getLogger("raydra")

# How long a resume= waits for the run's previous driver to let go of it (run_record.hold) before it
# is refused: a driver that has recorded its run interrupted still leaves Ray for a few seconds (a
# resumed multirun's jobs, a requeued SLURM job come right after).
RUN_LOCK_WAIT_S = 30.0


def train_run(
    cfg: DictConfig,
    run_dir: Path,
    overrides: List[str],
    process_ends_with_run: bool = False,
    job: Optional[JobSettings] = None,
    multirun_label: Optional[str] = None,
) -> RunRecord:
    """Train the run `cfg` describes into `run_dir` (Hydra's output directory for it); returns its
    record. `overrides`: the command-line overrides, recorded in summary.json.
    `process_ends_with_run`: this process exits after this run (see fit.fit_and_record).
    `job`: raydra's launcher's settings when this run is one of its multirun jobs (its W&B group;
    the job's own directory to continue in, for a resumed multirun). `multirun_label`: for a job of
    any Hydra multirun, what sets it apart from the others (its W&B name, its job type "job")."""
    started = time.time()
    marks = {"run_began": startup.run_began(), "run_entered": started}
    run_dir = fresh_dir = Path(run_dir).resolve()
    run_id = f"{datetime.now():%Y-%m-%d_%H-%M-%S}_{layout.ray_safe(cfg.name)}_{uuid.uuid4().hex[:6]}"
    # A resumed multirun continues the job's run in its own directory, where this job runs again.
    continues = job.resume if job and job.resume else None
    # The run's stages, its record and where it is written (raydra.run.sequence). A refusal before the
    # spec exists is recorded in this invocation's directory, no storage; nowhere for an invocation
    # that continues another run: the run's record is left as it was until this invocation has the
    # run running again (RunSequence.start), and its own directory is no run (_no_run_here).
    run = RunSequence(
        cfg,
        run_dir,
        run_id,
        overrides,
        started,
        place=None if cfg.resume or continues else Place(dir=str(run_dir), id=run_id, storage=None, logged_config={}),
    )
    release_run = lambda: None  # noqa: E731
    fitted = False  # whether this invocation trained: only then may it add to the run's W&B run

    def settle(ending: Ending) -> None:
        """The run's record as the lifecycle found it ended; a completed run's fit recorded it."""
        in_place = _continues_here(cfg.resume or continues, fresh_dir)
        if run.place is None and not in_place:
            _no_run_here(fresh_dir)
        if ending.status == INTERRUPTED and not ending.final:
            _interrupted(run, ending.reason, final=False)
        elif ending.status == INTERRUPTED:
            # Ray Train's controller and workers train on until this process leaves Ray, and a
            # checkpoint they register after the one named here deletes it under
            # checkpoint.num_to_keep (seen in the suite: summary.json named a checkpoint gone a
            # moment later). Leave first, then give a checkpoint that was being registered as Ray
            # stopped them a moment (unless a second stop signal hurries the stop: ending.hurried).
            # A SIGTERM during Ray's shutdown still reaches raydra's handler (cluster.connect).
            if ray.is_initialized():
                ray.shutdown()
            _interrupted(run, ending.reason, hurried=ending.hurried)
        elif ending.status == FAILED and run.place is None and in_place:
            _refused_in_place(fresh_dir, ending.reason)
        elif ending.status == FAILED:
            # Hung (raydra.run.hang_watch), or failed with the error's sentence (the lifecycle's `reason`).
            run.failed(ending.error, say=True)

    def continue_with() -> str:
        # A continuation stopped before it took its run over is continued as it was asked.
        return f"resume={cfg.resume or continues}" if run.place is None and run_dir == fresh_dir else f"resume={run_dir}"

    redact_yaml_files(run_dir / layout.HYDRA_DIR)
    if not _continues_here(cfg.resume or continues, run_dir):
        # A fresh directory, its config written by Hydra a moment ago: this machine's (raydra.records.trust).
        # A run continued in place keeps the mark it has, or its lack, which resume= then checks.
        trust.mark_run(run_dir)
    try:
        with Lifecycle(settle, continue_with=continue_with, settle_at_once=True, process_ends_with_it=process_ends_with_run) as life:
            requeued = batch_system.requeued()
            if requeued and not cfg.resume and not job:
                # SLURM runs a requeued job's batch script again: the run it started continues.
                continues = _run_of_requeued_job(cfg, requeued)
                if continues:
                    run.place = None
            if (run_dir / layout.SUMMARY).exists() and not _continues_here(cfg.resume or continues, run_dir):
                raise RaydraError(f"{run_dir} already holds a run; give this one its own hydra.run.dir.")
            # From here on the run reads its prepared config only (read-only: raydra.run.prepare).
            local = cfg.scale.num_workers == 0
            prepared = run.prepare(
                Invocation(
                    overrides=tuple(overrides),
                    job_ray_address=job.ray_address if job else None,
                    continues=continues,
                    # A Ray run's `_target_`s' arguments are checked alongside Ray's start (below).
                    arguments_by_caller=not local,
                )
            )
            cfg = prepared.config
            if cfg.resume:
                run.record, release_run = _continue(prepared.composed, run.record, run_dir)
                run_dir, run_id = Path(run.record.run_dir), run.record.run_id
            else:
                release_run = lock.hold(run_dir, "this run")
            if cfg.paths.storage:
                # Before Ray starts: a bad URI, endpoint or credentials fail in a second, not after it.
                sync.check_writable(cfg.paths.storage)
            marks["prepared"] = time.time()
            # A job of raydra's launcher had these very checks made on its config by the launcher,
            # before any job started (raydra.multirun.admission refuses the whole multirun there):
            # making them again imported the optimizer's and scheduler's modules in every job
            # (transformers: ~0.45 s of CPU each, beside the jobs training on the same cores).
            checked = (
                _check_and_import_in_background(cfg, resolve.data_to_describe(cfg), check_arguments=job is None) if not local else None
            )
            life.connect(cfg, run_dir, local=local, dashboard=not process_ends_with_run, launchers_local=bool(job and job.local_ray))
            if checked is not None:
                # A refusal comes here, before the run is recorded running and before any worker starts.
                checked()
            marks["ray_ready"] = time.time()
            spec = run.start(
                prepared,
                wandb_group=job.wandb_group if job else None,
                kind="run" if multirun_label is None else "job",
                label=multirun_label,
            )
            log.info(f"run {run_id}\n  dir  {run_dir}" + (f"\n  storage  {spec.place.storage}" if spec.place.storage else ""))
            if not spec.local:
                check_fits(spec.scale)
                if not spec.place.storage:
                    sync.check_shared(run_dir)
                if spec.loader == "ray_data":
                    check_room_for_data(spec.scale)
                worker_output.start_run(run_dir)
            marks["resolved"] = time.time()
            fitted = True
            try:
                # SLURM's time-limit notice (when this process watches for it): the workers checkpoint
                # at the step in flight and the fit ends interrupted.
                with contextlib.nullcontext() if spec.local else life.stops_on_notice():
                    run.fit(spec, marks=marks, process_ends_with_run=process_ends_with_run)
            finally:
                worker_output.end_run()
    finally:
        if fitted:
            # However the run ended, its W&B run holds what metrics.csv holds and says how it ended.
            wandb_run.complete(run_dir)
        release_run()
        startup.run_ended()
    _report(run.record, spec)
    sync.push_driver_files(run.place)  # driver.log with the closing lines
    return run.record


def _interrupted(run: RunSequence, reason: Optional[str], final: bool = True, hurried: Optional[threading.Event] = None) -> None:
    """Record the run interrupted (Ctrl-C, SIGTERM, SLURM's time-limit notice), with its last
    checkpoint; `reason` says what stopped it and the command that continues it (raydra.run.lifecycle).
    `final=False`: summary.json alone, at once, as the run directory stands (the final record
    follows once the workers are gone). `hurried`: set by a second stop signal, which ends the wait
    for a checkpoint being registered. No `run.place`: a continuation stopped before it took its run
    over, which records nothing."""
    record, place, started = run.record, run.place, run.started
    if place is None:
        if final:
            record_ended(record.interrupted(reason, started), None)
        return
    # The record's Optional run_dir and run_id: a run's record names them from its opening record on.
    run_dir, run_id = Path(record.run_dir), record.run_id  # pyright: ignore[reportArgumentType]
    home = place.storage or str(run_dir)
    if not final:
        if Path(place.dir).exists():
            last = last_checkpoint(run_dir, run_id, place.storage) if place.storage is None else None  # pyright: ignore[reportArgumentType]
            summary.write(Path(place.dir), record.interrupted(reason, started, record.relative(last, home)))
        return
    last = last_checkpoint(run_dir, run_id, place.storage, settle_s=5.0, hurried=hurried)  # pyright: ignore[reportArgumentType]
    record_ended(record.interrupted(reason, started, record.relative(last, home)), place)


def _no_run_here(fresh_dir: Path) -> None:
    """The directory Hydra made for an invocation that was to continue another run, and was refused
    or stopped before it took that run over: nothing that makes it look like a run stays (`raydra
    compare` takes a directory with .hydra/config.yaml for one; this machine's mark). Its driver.log
    stays: for an invocation run in the background it may be the one place the refusal is written."""
    shutil.rmtree(fresh_dir / layout.HYDRA_DIR, ignore_errors=True)
    (fresh_dir / layout.MACHINE_MARK).unlink(missing_ok=True)


def _refused_in_place(run_dir: Path, reason: Optional[str]) -> None:
    """A run to continue in its own directory (a resumed multirun's job, whose launcher reads the
    job's outcome from its summary.json; a requeued SLURM job with a fixed hydra.run.dir), refused
    before it was taken over: the refusal is recorded on the run's own record, which keeps its id,
    history, wall time and checkpoints, and so can still be continued once the cause is fixed."""
    own = summary.try_read(run_dir)
    place = Place(dir=str(run_dir), id=own.run_id, storage=None, logged_config={}) if own else None  # pyright: ignore[reportArgumentType]: a run's record names its id
    record_ended(own.failed(reason) if own else RunRecord(error=reason), place)


def _run_of_requeued_job(cfg: DictConfig, job_id: str) -> Optional[str]:
    """The run this SLURM job started before it was requeued, if it started one: the run it continues."""
    earlier = resume.of_slurm_job(cfg, job_id)
    if earlier is None:
        return None
    log.info(f"SLURM requeued job {job_id}: continuing its run {earlier}")
    return str(earlier)


def _continues_here(resumes: Optional[str], run_dir: Path) -> bool:
    """resume= names this invocation's own directory (a resumed multirun's job, a requeued SLURM
    job whose hydra.run.dir is fixed): the run continues in place."""
    return bool(resumes) and resumes != "latest" and Path(str(resumes)).expanduser().resolve() == run_dir


def _check_and_import_in_background(cfg: DictConfig, data_target: Optional[str], check_arguments: bool = True) -> Callable[[], None]:
    """Check the `_target_`s' arguments of the prepared `cfg` (raydra.config.arguments), then import the
    modules the fit needs, in another thread, while Ray starts in this one (~3 s here: its processes
    take the other core). The check imports the optimizer's and scheduler's modules (torch,
    transformers: ~1.5 s), which held Ray's start back when it came first; torch is needed next
    anyway, with Ray Train (~3 s more), as is a data module that describes its data.

    Returns a function that waits for the check and raises its RaydraError. A refusal is made once
    more in the calling thread, so that it never stems from an import that met another thread's
    halfway. The imports after the check are only a warm-up: whoever needs a module imports it as
    usual (waiting for this thread if it is halfway), and an import that fails here fails there
    too, with its own error.

    Not a daemon thread: a run refused before its fit needs the modules (a cluster without a shared
    disk, seconds after Ray starts) would otherwise exit with torch half-imported, and the
    interpreter's teardown printed a traceback from torch's finalizers.

    `check_arguments=False`: the caller has checked them already; the imports alone."""
    from raydra.config import arguments

    own_copy = copy.deepcopy(cfg)  # read by this thread alone
    done = threading.Event()
    passed: List[bool] = []

    def check_then_warm() -> None:
        try:
            if check_arguments:
                arguments.check(own_copy, raydras_own=False)
            passed.append(True)
        except Exception:
            pass  # checked again, and said, in the caller's thread
        finally:
            done.set()
        if not passed:
            return  # a refused run needs none of them; its process ends without waiting for them
        for name in ("ray.train.torch", (data_target or "").rpartition(".")[0]):
            if name:
                with contextlib.suppress(Exception):
                    importlib.import_module(name)

    threading.Thread(target=check_then_warm, name="raydra-check-imports").start()

    def wait() -> None:
        done.wait()
        if not passed:
            arguments.check(cfg, raydras_own=False)

    return wait


def _continue(cfg: DictConfig, opening: RunRecord, fresh_dir: Path) -> Any:
    """Switch this invocation over to the run it resumes: its record continued (its directory, run
    id, start and history), and the run's lock (run_record.hold), held until the invocation ends."""
    run_dir = resume.find(cfg)
    location = layout.location(cfg.paths.storage, cfg.paths.outputs, run_dir)
    # Checked before this invocation takes the run over: a refusal leaves the run's record as it was.
    _check_same_storage(cfg, summary.read(run_dir), location)
    release = lock.hold(run_dir, f"resume={cfg.resume}", wait_s=RUN_LOCK_WAIT_S)
    try:
        # Read again with the lock held: the driver this one waited for may have completed the run
        # meanwhile (whose record this one would then rewrite as its own), or changed what else
        # resume.check reads.
        previous = resume.check(cfg, run_dir)
        _check_same_storage(cfg, previous, location)
    except BaseException:
        release()
        raise
    # In the directory where the run is now, wherever it was first written.
    continued = opening.resumed_from(previous, log=str(fresh_dir / layout.DRIVER_LOG), overrides=previous.overrides, run_dir=str(run_dir))
    log.info(f"resuming {run_dir} (this invocation's driver.log: {fresh_dir})")
    return continued, release


def _check_same_storage(cfg: DictConfig, previous: RunRecord, location: Optional[str]) -> None:
    """A resumed run must find its checkpoints where they were written: with another (or no)
    paths.storage, Ray Train would find none there and silently train from the start."""
    before = previous.storage
    # summary.json holds the location masked (a URI may carry credentials): compare it so.
    location = redact(location) if location else None
    if (before or None) != location:
        hint = f"add paths.storage=<the storage it was started with> (its checkpoints are in {before})" if before else "drop paths.storage"
        raise RaydraError(
            f"resume={cfg.resume}: the run kept its checkpoints in {before or 'its run directory'}, not {location or 'the run directory'}; {hint}."
        )


def _report(record: RunRecord, spec: RunSpec) -> None:
    final, best = record.metrics.final, record.metrics.best
    monitor = record.monitor.metric
    lines = [f"done in {record.wall_time_s:.1f} s"]
    shown = {k: v for k, v in final.items() if k.startswith("test/")}
    if monitor in best:
        shown[f"best {monitor}"] = best[monitor]
    lines[0] += "  " + "  ".join(f"{k} {v:.4f}" for k, v in shown.items())
    if record.throughput.get("samples_per_s"):
        lines[0] += f"  {record.throughput['samples_per_s']:.0f} samples/s"
    if record.ledger is not None:
        lines.append(f"  compute  {record.ledger.sentence()}")
    lines.append(f"  dir  {record.run_dir}")
    if record.checkpoints.best:
        lines.append(f"  best checkpoint  {record.checkpoint('best')}")
    exported = Path(record.run_dir) / layout.HF_EXPORT  # pyright: ignore[reportArgumentType]: a started run's record names its directory
    if exported.is_dir():
        lines.append(f"  hugging face  {exported}  (transformers' from_pretrained)")
    wandb = (spec.logger or {}).get("wandb")
    if wandb and wandb["mode"] == "offline":
        lines.append(f"  W&B ran offline; upload with: wandb sync {record.run_dir}/wandb/offline-run-*")
    log.info("\n".join(lines))
