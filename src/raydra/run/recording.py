"""What goes into a run's record (raydra.records.summary.RunRecord), from what the run knows at each stage:

    new_summary    the composed config, before it is validated: the record a refusal is written in
    record_start   the resolved spec: what the run will train with, written before any worker starts
    outcome        Ray Train's result and rank 0's WorkerOutcome: the figures of a completed run
    failure        the record of a run an error ended: failed with its one line, or hung

The record's type, its transitions and its file are raydra.records.summary's; this module only builds values.
"""

import dataclasses
import hashlib
import json
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, OmegaConf

from raydra import storage
from raydra.cluster.batch_system import job_record
from raydra.config.schema import is_worker_count, worker_range
from raydra.config.spec import Place, RunSpec, WorkerOutcome
from raydra.errors import said
from raydra.records import layout, summary, sync
from raydra.records.layout import CHECKPOINT_FILE
from raydra.records.ledger import Ledger, run_ledger, unseen_ledger
from raydra.records.summary import Checkpoints, Metrics, Monitor, RunRecord
from raydra.run.hang_watch import Findings, RunHung

PACKAGES = ("raydra", "ray", "torch", "lightning", "pytorch-lightning", "transformers", "hydra-core", "wandb", "diffusers")


def config_hash(resolved: Dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()


def versions() -> Dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def git_commit(cwd: Path) -> Any:
    """The commit the code ran from, with "-dirty" when the tree had uncommitted changes."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def new_summary(cfg: DictConfig, run_dir: Path, run_id: str, overrides: List[str]) -> RunRecord:
    """The run's opening record, from the composed config, before it is validated."""
    return RunRecord.started(
        name=cfg["name"],
        run_id=run_id,
        run_dir=str(run_dir),
        overrides=list(overrides),
        monitor=Monitor(metric=cfg["checkpoint"]["monitor"], mode=cfg["checkpoint"]["mode"]),
        tags=[str(tag) for tag in (cfg["tags"] or [])],
        seed=cfg["seed"],
        strategy=OmegaConf.to_container(cfg["strategy"], resolve=True),
        # An elastic group's ([min, max]) starts as its max. Null where scale.num_workers is no
        # count: validation, after this, refuses it by name.
        world_size=worker_range(cfg.scale.num_workers)[1] if is_worker_count(cfg.scale.num_workers) else None,
        use_gpu=cfg["scale"]["use_gpu"],
        git_commit=git_commit(Path(__file__).parent),
        versions=versions(),
        # The SLURM job it runs in (the batch system's job): how a requeued job finds the run it
        # started (resume.of_slurm_job).
        slurm=job_record() or None,
    )


def record_start(spec: RunSpec, opening: RunRecord) -> RunRecord:
    """The record as the run starts: what it will train with, saved before any worker starts."""
    wandb = None
    if spec.logger and "wandb" in spec.logger:
        # Where to find the run in W&B: a multirun's or sweep's jobs share a group there.
        wandb = {key: spec.logger["wandb"].get(key) for key in ("project", "entity", "group", "mode")}
    started = opening.with_start(
        config_hash=config_hash(spec.resolved_config()),
        # As resolved: a ModelCheckpoint among the callbacks may have set it (raydra.config.user_callbacks).
        monitor=Monitor(metric=spec.checkpoint.monitor, mode=spec.checkpoint.mode),
        precision=spec.trainer.precision,
        storage=spec.place.storage,
        data=data_record(spec),
        wandb=wandb,
        # The checkpoint whose weights the run started from (ckpt_path=, found).
        ckpt_path=spec.place.init_weights or None,
    )
    save(spec.place, started)
    return started


def failure(run: RunRecord, error: Optional[BaseException], started: float) -> RunRecord:
    """The record of a run that `error` ended: hung, with what the watchdog found (raydra.run.hang_watch),
    or failed, with the error's sentence (a RaydraError's) or its last line (None: a failed
    raydra.run.lifecycle Ending without its error, which the lifecycle never makes)."""
    if isinstance(error, RunHung):
        return error.ended(run, started)
    return run.failed(said(error) if error is not None else None, started)


def save(place: Place, run: RunRecord) -> None:
    """summary.json in the run directory, and with paths.storage the driver's files in storage too."""
    summary.write(Path(place.dir), run)
    sync.push_driver_files(place)


def data_record(spec: RunSpec) -> Dict[str, Any]:
    """What the data turned out to be: classes found in it and, under ray_data, rows per split."""
    data = spec.data
    record = {key: data[key] for key in ("num_classes", "class_names", "loader") if data.get(key) is not None}
    if spec.place.data_rows is not None:
        record["rows"] = spec.place.data_rows
    return record


def outcome(result: Any, worker: WorkerOutcome, spec: RunSpec) -> Dict[str, Any]:
    """A completed run's figures (RunRecord.completed's fields): Ray Train's result (reports,
    checkpoints) and rank 0's WorkerOutcome."""
    memory = worker.memory_per_worker
    save_s = worker.checkpoint_save_s
    upload_s = worker.checkpoint_upload_s
    checkpoints = layout.checkpoints_location(spec.place)
    # The record names the checkpoints relative to the run's home, so a moved run finds its own.
    home = spec.place.storage or spec.place.dir
    monitor, mode = spec.checkpoint.monitor, spec.checkpoint.mode
    local = worker.local_record
    if local:
        # Local mode: Ray Train kept nothing; the training function's own record says the same.
        import pandas

        history = pandas.DataFrame(local["history"]) if local["history"] else None
        kept = [(c["path"], c["metrics"]) for c in local["checkpoints"]]
        last_path, run_path = local["last"], storage.join(checkpoints, spec.place.id)
    else:
        history = result.metrics_dataframe
        kept = [(c.path, m) for c, m in result.best_checkpoints or []]
        last_path, run_path = (result.checkpoint.path if result.checkpoint else None), result.path
    # The last report's metrics (local mode keeps its reports itself), then the test's.
    last_report = local["history"][-1] if local and local["history"] else result.metrics or {}
    final = {k: json_number(v) for k, v in last_report.items()}
    final.update(worker.test_metrics)
    best: Dict[str, Any] = {}
    if history is not None and monitor in history:
        row = history.loc[history[monitor].idxmax() if mode == "max" else history[monitor].idxmin()]
        best = {k: json_number(v) for k, v in row.items() if json_number(v) is not None}
    best_checkpoint = None
    if kept:
        # Mid-epoch checkpoints report the monitor as the worst value there is (unvalidated weights;
        # NaN in runs recorded before): never the best.
        worst = float("-inf") if mode == "max" else float("inf")
        scored = [(c, m.get(monitor)) for c, m in kept]
        scored = [(c, v if isinstance(v, (int, float)) and v == v else worst) for c, v in scored]
        pick = max if mode == "max" else min
        best_checkpoint = pick(scored, key=lambda pair: pair[1])[0]
    return {
        "metrics": Metrics(final=final, best=best),
        "throughput": worker.throughput,
        "peak_memory_bytes": max((w["peak_bytes"] for w in memory), default=None),
        "memory_per_worker": memory,
        "epochs_completed": worker.epochs_completed,
        "test_skipped": worker.test_skipped,
        "global_step": worker.global_step,
        "stopped_early": worker.stopped_early,
        **_sizes(worker, spec),
        "checkpoints": Checkpoints(
            best=summary.relative_to(_ckpt_file(checkpoints, best_checkpoint), home),
            last=summary.relative_to(_ckpt_file(checkpoints, last_path), home),
            dir=summary.relative_to(storage.location_of(checkpoints, run_path), home),
            save_s_mean=round(sum(save_s) / len(save_s), 3) if save_s else None,
            upload_s_mean=round(sum(upload_s) / len(upload_s), 3) if upload_s else None,
            upload=spec.checkpoint.upload,
        ),
    }


def ledger(spec: RunSpec, record: RunRecord, marks: Dict[str, float], findings: Optional[Findings]) -> Ledger:
    """The run's compute ledger as it ends (raydra.records.ledger): its slots from its process's start
    (`marks`' run_began) to now, split by what its workers reported to the hang watchdog's Watch.
    Start-up ends at rank 0's first step in the first worker group (summary.json's phases end at the
    last group's, which a restart makes later)."""
    workers = 1 if spec.local else (record.world_size or spec.scale.num_workers)
    attempts = findings.attempts if findings else []
    first = next((r.first_step_at for r in attempts[0] if r.rank == 0), attempts[0][0].first_step_at) if attempts else None
    first = first or marks.get("first_step")
    began, now = marks.get("run_began"), time.time()
    if findings is None:
        spent = unseen_ledger(workers, spec.scale.use_gpu, began, now, first, "failure.watchdog=false: the workers' time was not followed")
    else:
        spent = run_ledger(workers, spec.scale.use_gpu, began, now, first, attempts)
    prices = spec.ledger
    price = prices.price_per_gpu_hour if spec.scale.use_gpu else prices.price_per_cpu_hour
    return dataclasses.replace(spent, price_per_hour=price if price is not None else prices.price_per_hour)


def _sizes(worker: WorkerOutcome, spec: RunSpec) -> Dict[str, Any]:
    """An elastic run's final world size and its resizes (when, from, to, at which step), as rank 0
    of the last worker group knew them from the checkpoints it continued."""
    scale = spec.scale
    if not scale.elastic:
        return {}
    return {"world_size": worker.world_size, "num_workers": {"min": scale.min_workers, "max": scale.max_workers}, "resizes": worker.resizes}


def _ckpt_file(checkpoints: str, checkpoint_path: Optional[str]) -> Optional[str]:
    """The Lightning checkpoint file of a Ray checkpoint directory, as a path or a storage URI."""
    if checkpoint_path is None:
        return None
    return storage.join(storage.location_of(checkpoints, checkpoint_path), CHECKPOINT_FILE)


def json_number(value: Any) -> Any:
    """A metric as JSON holds it: an int when whole, a float otherwise, None when not a number
    (raydra.compare.recorded_run.number, by contrast, only passes numbers through)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() and abs(number) < 2**53 else number
