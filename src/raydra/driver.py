"""The driver: one composed config in, one trained run directory out.

    validate -> resolve once into plain data -> connect to Ray -> check the cluster can hold it
    -> TorchTrainer(train_loop on every worker) -> summary.json

Single runs and Hydra multirun jobs both come through `run`, Tune trials (sweep.py) through
`fit_and_record`, which `run` uses too; there is no second training path.
"""

import logging
import re
import signal
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from raydra import resume
from raydra import summary as run_summary
from raydra.cluster import check_fits, check_room_for_data, connect, worker_resources
from raydra.console import worker_output
from raydra.errors import RaydraError
from raydra.loggers import wandb_mode
from raydra.redact import redact, redact_hydra_records
from raydra.schema import validate

log = logging.getLogger("raydra")


def run(cfg: DictConfig) -> Optional[float]:
    """Train the run `cfg` describes; returns its best monitored metric (for Hydra sweepers)."""
    if cfg.get("tune") is not None:
        from raydra import sweep

        return sweep.run(cfg)
    started = time.time()
    run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    run_id = f"{datetime.now():%Y-%m-%d_%H-%M-%S}_{cfg.name}_{uuid.uuid4().hex[:6]}"
    summary = new_summary(cfg, run_dir, run_id, list(HydraConfig.get().overrides.task))
    restore_sigterm = lambda: None  # noqa: E731
    redact_hydra_records(run_dir)
    try:
        if (run_dir / run_summary.SUMMARY).exists():
            raise RaydraError(f"{run_dir} already holds a run; give this one its own hydra.run.dir.")
        validate(cfg)
        if cfg.resume:
            run_dir, run_id = _continue(cfg, summary, run_dir)
        config = _resolve(cfg, run_dir, run_id)
        _record_start(config, summary)
        log.info(f"run {run_id}\n  dir  {run_dir}")

        connect(cfg.ray.address, cfg.ray.num_cpus, cfg.verbose)
        # After connecting: ray.init installs its own SIGTERM handler, which would end the process
        # without a summary.
        restore_sigterm = _sigterm_interrupts()
        check_fits(cfg.scale)
        if cfg.data.get("loader") == "ray_data":
            check_room_for_data(cfg.scale)
        worker_output.start_run(run_dir)
        try:
            fit_and_record(config, summary, started)
        finally:
            worker_output.end_run()
    except RaydraError as error:
        _fail(summary, run_dir, started, str(error))
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        summary["checkpoints"] = {"last": _last_checkpoint(run_dir, run_id)}
        _fail(summary, run_dir, started, "interrupted (Ctrl-C or SIGTERM); continue it with resume=" + str(run_dir), status="interrupted")
        raise
    except Exception as error:
        _fail(summary, run_dir, started, _one_line(error))
        raise
    finally:
        restore_sigterm()
    _report(summary, config)
    return summary["metrics"]["best"].get(cfg.checkpoint.monitor)


def new_summary(cfg: Any, run_dir: Path, run_id: str, overrides: List[str]) -> Dict[str, Any]:
    """summary.json's opening content, from a composed config or its resolved plain form."""
    return {
        "name": cfg["name"],
        "run_id": run_id,
        "run_dir": str(run_dir),
        "status": "running",
        "error": None,
        "started_at": run_summary.now(),
        "overrides": overrides,
        "monitor": {"metric": cfg["checkpoint"]["monitor"], "mode": cfg["checkpoint"]["mode"]},
        # The strategy's settings, not only its name: sharding and layout decide memory and checkpoints.
        "strategy": OmegaConf.to_container(cfg["strategy"], resolve=True) if OmegaConf.is_config(cfg) else dict(cfg["strategy"]),
        "world_size": cfg["scale"]["num_workers"],
        "use_gpu": cfg["scale"]["use_gpu"],
        "git_commit": run_summary.git_commit(Path(__file__).parent),
        "versions": run_summary.versions(),
    }


def fit_and_record(config: Dict[str, Any], summary: Dict[str, Any], started: float, tune_trial: bool = False) -> Dict[str, Any]:
    """Fit a resolved plain-dict config into config["run"]["dir"] and record the outcome in its
    summary.json. The one fit behind a single run, a Hydra multirun job and a Tune trial; errors
    propagate for the caller to record as it sees fit."""
    _record_start(config, summary)
    try:
        result = _fit(config, Path(config["run"]["dir"]), config["run"]["id"], tune_trial)
    finally:
        summary["data"] = _data_record(config)
    summary.update(_outcome(result, config))
    summary["finished_at"] = run_summary.now()
    summary["wall_time_s"] = round(time.time() - started, 2)
    run_summary.write(Path(config["run"]["dir"]), summary)
    return summary


def _data_record(config: Dict[str, Any]) -> Dict[str, Any]:
    """What the data turned out to be: classes found in it and, under ray_data, rows per split."""
    data = config["data"]
    record = {key: data[key] for key in ("num_classes", "class_names", "loader") if data.get(key) is not None}
    if "data_rows" in config["run"]:
        record["rows"] = config["run"]["data_rows"]
    return record


def _record_start(config: Dict[str, Any], summary: Dict[str, Any]) -> None:
    summary["config_hash"] = run_summary.config_hash(config)
    summary["precision"] = config["trainer"]["precision"]
    run_summary.write(Path(config["run"]["dir"]), summary)


def _continue(cfg: DictConfig, summary: Dict[str, Any], fresh_dir: Path) -> Any:
    """Switch this invocation over to the run it resumes: its directory, run id and start time."""
    run_dir = resume.find(cfg)
    previous = run_summary.read(run_dir)
    summary.update(
        run_id=previous["run_id"], run_dir=str(run_dir), started_at=previous["started_at"],
        overrides=previous.get("overrides", []),
        resumed=previous.get("resumed", []) + [{"at": run_summary.now(), "from_status": previous.get("status"),
                                                 "log": str(fresh_dir / "driver.log")}],
    )
    log.info(f"resuming {run_dir} (this invocation's driver.log: {fresh_dir})")
    return run_dir, previous["run_id"]


def _sigterm_interrupts() -> Any:
    """SIGTERM (a scheduler's or `kill`'s stop) ends the run the way Ctrl-C does: workers stopped,
    summary.json marked interrupted. Returns the function that puts the old handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _last_checkpoint(run_dir: Path, run_id: str) -> Optional[str]:
    """The newest checkpoint Ray wrote for this run: what resume= will continue from."""
    found = sorted(Path(run_dir, "checkpoints", run_id).glob("checkpoint_*/checkpoint.ckpt"), key=lambda p: p.stat().st_mtime)
    return str(found[-1]) if found else None


def _resolve(cfg: DictConfig, run_dir: Path, run_id: str) -> Dict[str, Any]:
    """Plain data for the workers: they have no Hydra, so every interpolation is resolved here."""
    _describe_data(cfg)
    config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    # What loggers may record: masked here, where the secrets are known. A worker's environment
    # is its Ray node's, which need not hold the variables this process was started with.
    config["run"] = {"dir": str(run_dir), "id": run_id, "logged_config": redact(dict(config))}
    if config["trainer"]["precision"] == "auto":
        config["trainer"]["precision"] = "bf16-mixed" if config["scale"]["use_gpu"] else "32-true"
    if "wandb" in config["logger"]:
        config["logger"]["wandb"]["mode"] = wandb_mode(config["logger"]["wandb"].get("mode"))
    return config


def _describe_data(cfg: DictConfig) -> None:
    """Fill what the data can state about itself (a Hugging Face ClassLabel's names, an image
    folder's class folders) into data.num_classes and data.class_names, before resolving, so the
    model's `${data.num_classes}` follows and the user never repeats it. A stated count must agree."""
    target = cfg.data.get("_target_")
    if not target:
        return
    from hydra.utils import get_class

    describe = getattr(get_class(target), "describe", None)
    if describe is None:
        return
    facts = describe(**{k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items() if k != "_target_"})
    stated = cfg.data.get("num_classes")
    if stated is not None and stated != facts["num_classes"]:
        where = cfg.data.get("name") or cfg.data.get("root")
        raise RaydraError(
            f"{where} has {facts['num_classes']} classes ({', '.join(facts['class_names'][:5])}"
            f"{', ...' if facts['num_classes'] > 5 else ''}) but data.num_classes={stated}; "
            f"set data.num_classes={facts['num_classes']} or leave it null."
        )
    with open_dict(cfg):
        cfg.data.num_classes = facts["num_classes"]
        cfg.data.class_names = facts["class_names"]


def _fit(config: Dict[str, Any], run_dir: Path, run_id: str, tune_trial: bool = False) -> Any:
    import ray.train
    from ray.train.torch import TorchTrainer

    from raydra.strategies import torch_config
    from raydra.worker import train_loop

    scale, ckpt = config["scale"], config["checkpoint"]
    callbacks, failure = [], {"max_failures": config["failure"]["max_failures"]}
    if tune_trial:
        from raydra.sweep import ReportToTune

        callbacks.append(ReportToTune(config["trainer"]["max_epochs"]))
        # A trial whose workers cannot be placed must fail, not wait: by default Ray restarts
        # the controller of a worker group that timed out starting, without end.
        failure["controller_failure_limit"] = 0
    datasets = None
    if config["data"].get("loader") == "ray_data":
        from raydra.data.ray_data import build

        # Built here, once, so preprocessing runs as Ray Data tasks beside the workers; each
        # worker only learns the row counts, which size its batches.
        datasets, config["run"]["data_rows"] = build(config)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=config,
        datasets=datasets,
        torch_config=torch_config(config["strategy"]),
        scaling_config=ray.train.ScalingConfig(
            num_workers=scale["num_workers"],
            use_gpu=scale["use_gpu"],
            resources_per_worker=worker_resources(OmegaConf.create(scale), tune_trial=tune_trial),
            placement_strategy=scale["placement_strategy"],
        ),
        run_config=ray.train.RunConfig(
            # A unique name under the run's own directory: Train V2 resumes any run whose
            # name and storage path it has seen before, which is what resume= relies on.
            name=run_id,
            storage_path=str(run_dir / "checkpoints"),
            failure_config=ray.train.FailureConfig(**failure),
            callbacks=callbacks,
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=ckpt["num_to_keep"],
                checkpoint_score_attribute=ckpt["monitor"],
                checkpoint_score_order=ckpt["mode"],
            ),
        ),
    )
    try:
        result = trainer.fit()
    except Exception as error:
        raise _user_error(error) or error
    if result.error:
        raise _user_error(result.error) or result.error
    return result


def _user_error(error: BaseException) -> Optional[RaydraError]:
    """A RaydraError raised on a worker (a missing data path, say), unwrapped from Ray's failure
    report so the user reads its one sentence instead of a worker's stack trace."""
    failures = list(getattr(error, "worker_failures", {}).values()) + [error]
    for failure in failures:
        while failure is not None:
            if isinstance(failure, RaydraError):
                return RaydraError(str(failure).strip().splitlines()[-1])
            failure = failure.__cause__ or getattr(failure, "cause", None)
    return None


def _outcome(result: Any, config: Dict[str, Any]) -> Dict[str, Any]:
    worker = result.return_value or {}
    memory = worker.get("memory_per_worker", [])
    save_s = worker.get("checkpoint_save_s") or []
    monitor, mode = config["checkpoint"]["monitor"], config["checkpoint"]["mode"]
    history = result.metrics_dataframe
    final = {k: _number(v) for k, v in (result.metrics or {}).items()}
    final.update(worker.get("test_metrics", {}))
    best: Dict[str, Any] = {}
    if history is not None and monitor in history:
        row = history.loc[history[monitor].idxmax() if mode == "max" else history[monitor].idxmin()]
        best = {k: _number(v) for k, v in row.items() if _number(v) is not None}
    best_checkpoint = None
    if result.best_checkpoints:
        # Mid-epoch checkpoints report the monitor as NaN (unvalidated weights): never the best.
        worst = float("-inf") if mode == "max" else float("inf")
        scored = [(c, m.get(monitor)) for c, m in result.best_checkpoints]
        scored = [(c, v if isinstance(v, (int, float)) and v == v else worst) for c, v in scored]
        pick = max if mode == "max" else min
        best_checkpoint = pick(scored, key=lambda pair: pair[1])[0]
    return {
        "status": "completed",
        "metrics": {"final": final, "best": best},
        "throughput": worker.get("throughput", {}),
        "peak_memory_bytes": max((w["peak_bytes"] for w in memory), default=None),
        "memory_per_worker": memory,
        "epochs_completed": worker.get("epochs_completed"),
        "global_step": worker.get("global_step"),
        "checkpoints": {
            "best": _ckpt_file(best_checkpoint),
            "last": _ckpt_file(result.checkpoint),
            "dir": result.path,
            # Mean time training stood still per checkpoint (write + hand-over to Ray), rank 0's view.
            "save_s_mean": round(sum(save_s) / len(save_s), 3) if save_s else None,
        },
    }


def _ckpt_file(checkpoint: Any) -> Optional[str]:
    from ray.train.lightning import RayTrainReportCallback

    return None if checkpoint is None else str(Path(checkpoint.path) / RayTrainReportCallback.CHECKPOINT_NAME)


def _number(value: Any) -> Any:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


def _one_line(error: BaseException) -> str:
    """The error as one line; for a failed worker group, the lowest failed rank's own exception
    (Ray's first line only says that workers failed)."""
    failures = getattr(error, "worker_failures", None) or {}
    if failures:
        rank = min(failures)
        # Ray hands the worker's exception back as its traceback text.
        raised = [line for line in str(failures[rank]).splitlines() if EXCEPTION_LINE.match(line)]
        if raised:
            return f"worker {rank}: {raised[-1][:400]} (the whole trace is in logs/worker_{rank}.log)"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


# "ValueError: ...", "torch._dynamo.exc.InternalTorchDynamoError: ...": a traceback's last word.
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def _fail(summary: Dict[str, Any], run_dir: Path, started: float, reason: str, status: str = "failed") -> None:
    summary.update(status=status, error=reason, finished_at=run_summary.now(), wall_time_s=round(time.time() - started, 2))
    if run_dir.exists():
        run_summary.write(run_dir, summary)
    log.error(f"error: {reason}")


def _report(summary: Dict[str, Any], config: Dict[str, Any]) -> None:
    final, best = summary["metrics"]["final"], summary["metrics"]["best"]
    monitor = summary["monitor"]["metric"]
    lines = [f"done in {summary['wall_time_s']:.1f} s"]
    shown = {k: v for k, v in final.items() if k.startswith("test/")}
    if monitor in best:
        shown[f"best {monitor}"] = best[monitor]
    lines[0] += "  " + "  ".join(f"{k} {v:.4f}" for k, v in shown.items())
    if summary["throughput"].get("samples_per_s"):
        lines[0] += f"  {summary['throughput']['samples_per_s']:.0f} samples/s"
    lines.append(f"  dir  {summary['run_dir']}")
    if summary["checkpoints"]["best"]:
        lines.append(f"  best checkpoint  {summary['checkpoints']['best']}")
    wandb = config["logger"].get("wandb")
    if wandb and wandb["mode"] == "offline":
        lines.append(f"  W&B ran offline; upload with: wandb sync {summary['run_dir']}/wandb/offline-run-*")
    log.info("\n".join(lines))
