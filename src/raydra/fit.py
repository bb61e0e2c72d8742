"""The fit core: one resolved config in, one trained run directory and its record out.

    resolve(cfg, run_dir, run_id)   composed config -> plain data the workers can use (no Hydra there)
    fit_and_record(config, summary) TorchTrainer(worker.train_loop) -> summary.json's outcome

Every run goes through here: a single run (raydra.driver), a Tune trial (raydra.sweep.trial) and,
through the driver, each job of a Hydra multirun. Nothing here reads Hydra's global state, exits
the process or installs signal handlers: errors are raised for the caller to record, so any entry
can call it as a library.
"""

import contextlib
import logging
import netrc
import os
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf, open_dict

from raydra import run_record, startup, storage
from raydra import summary as run_summary
from raydra.cluster import has_no_autoscaler, worker_resources
from raydra.errors import WORKER_RANK, RaydraError
from raydra.private_apis import (
    elastic_reacts_quickly,
    poll_workers_often,
    registered_checkpoint_names,
    torch_trainer_class,
    worker_setup_hook_env,
)
from raydra.redact import redact
from raydra.schema import is_elastic, worker_range
from raydra.worker import preload

log = logging.getLogger("raydra")

# How often Ray Train's controller takes the workers' reports (Ray's default, 2 s, paces short epochs).
CONTROLLER_POLL_S = 0.5
# An elastic group that cannot be placed is given up after this long and sized again from the nodes
# alive then (Ray's default, 60 s, is what a run that lost a node waited, twice: private_apis).
# Ray marks a lost node dead after about 15 s of failed health checks.
ELASTIC_START_TIMEOUT_S = 15.0


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
        # The user's words for the run (root key tags), and the seed every worker started from.
        "tags": [str(tag) for tag in (cfg["tags"] or [])],
        "seed": cfg["seed"],
        # The strategy's settings, not only its name: sharding and layout decide memory and checkpoints.
        "strategy": OmegaConf.to_container(cfg["strategy"], resolve=True) if OmegaConf.is_config(cfg) else dict(cfg["strategy"]),
        # An elastic group's ([min, max]) starts as its max; the outcome replaces it with the last size.
        "world_size": worker_range(cfg["scale"]["num_workers"])[1],
        "use_gpu": cfg["scale"]["use_gpu"],
        "git_commit": run_summary.git_commit(Path(__file__).parent),
        "versions": run_summary.versions(),
    }


def fit_and_record(
    config: Dict[str, Any],
    summary: Dict[str, Any],
    started: float,
    *,
    tune_trial: bool = False,
    callbacks: Sequence[Any] = (),
    marks: Optional[Dict[str, float]] = None,
    process_ends_with_run: bool = False,
) -> Dict[str, Any]:
    """Fit a resolved plain-dict config into config["run"]["dir"] and record the outcome in its
    summary.json. The one fit behind a single run, a Hydra multirun job and a Tune trial; errors
    propagate for the caller to record as it sees fit.

    `tune_trial`: the fit runs inside a Tune trial (its workers leave the trial's own CPU share free,
    and a group that cannot be placed fails instead of waiting). `callbacks`: Ray Train UserCallbacks
    for the TorchTrainer, such as the sweep's report to Tune. `marks`: the caller's start-up marks
    (raydra.startup), completed here and by rank 0 into summary.json's `startup`.
    `process_ends_with_run`: this process exits once this fit is over (a `python train.py` run, a
    multirun launcher's job), so Ray removes the run's placement groups as the process's Ray job
    ends, whatever becomes of the run's controller, and Ray Train's cleaner for them is not started.
    """
    marks = dict(marks or {})
    record_start(config, summary)
    try:
        # With paths.storage, the workers' files reach this run directory while the run goes on (a
        # trial's process needs no copy: the sweep's driver follows the trial's storage itself).
        with contextlib.nullcontext() if tune_trial else run_record.Follower(config["run"]):
            result = _fit(config, tune_trial, list(callbacks), marks, process_ends_with_run)
    finally:
        summary["data"] = _data_record(config)
    summary.update(_outcome(result, config))
    summary["startup"] = startup.phases({**marks, **((result.return_value or {}).get("startup_marks") or {})})
    summary["finished_at"] = run_summary.now()
    summary["wall_time_s"] = round(time.time() - started, 2)
    write_summary(config["run"], summary)
    return summary


def write_summary(run: Dict[str, Any], summary: Dict[str, Any]) -> None:
    """summary.json in the run directory, and with paths.storage the driver's files in storage too."""
    run_summary.write(Path(run["dir"]), summary)
    run_record.push_driver_files(run)


def _data_record(config: Dict[str, Any]) -> Dict[str, Any]:
    """What the data turned out to be: classes found in it and, under ray_data, rows per split."""
    data = config["data"]
    record = {key: data[key] for key in ("num_classes", "class_names", "loader") if data.get(key) is not None}
    if "data_rows" in config["run"]:
        record["rows"] = config["run"]["data_rows"]
    return record


def record_start(config: Dict[str, Any], summary: Dict[str, Any]) -> None:
    """summary.json as the run starts: what it will train with, written before any worker starts."""
    summary["config_hash"] = run_summary.config_hash(config)
    # As resolved: a ModelCheckpoint among the callbacks may have set it (raydra.callbacks).
    summary["monitor"] = {"metric": config["checkpoint"]["monitor"], "mode": config["checkpoint"]["mode"]}
    summary["precision"] = config["trainer"]["precision"]
    summary["storage"] = config["run"]["storage"]
    if "wandb" in config["logger"]:
        # Where to find the run in W&B: a multirun's or sweep's jobs share a group there.
        summary["wandb"] = {key: config["logger"]["wandb"].get(key) for key in ("project", "entity", "group", "mode")}
    if config["run"].get("init_weights"):
        # The checkpoint whose weights the run started from (ckpt_path=, found).
        summary["ckpt_path"] = config["run"]["init_weights"]
    write_summary(config["run"], summary)


def last_checkpoint(run_dir: Path, run_id: str, storage_location: Optional[str] = None, settle_s: float = 0.0) -> Optional[str]:
    """The newest checkpoint Ray wrote for this run (a path or a storage URI): what resume= will
    continue from. Ray numbers its checkpoint directories in order.

    Under Ray only a checkpoint it registered counts: a copy cut short by a full disk or a kill is a
    directory too. `settle_s`: the run may still be going (the driver was interrupted, its workers
    not yet stopped); while a newer directory than the latest registered one exists, wait up to this
    long for Ray to register it (and drop the one before, under checkpoint.num_to_keep)."""
    where = storage.join(run_record.checkpoints_location({"dir": str(run_dir), "storage": storage_location}), run_id)
    deadline = time.time() + settle_s
    while True:
        # checkpoint_<time>/checkpoint.ckpt, a file or (sharded) a folder; not Ray's checkpoint_manager_snapshot.json,
        # nor local mode's .checkpoint_<time>.partial being written.
        parts = [f.split("/") for f in storage.list_files(where)]
        found = sorted({p[0] for p in parts if len(p) > 1 and p[1] == run_summary.CHECKPOINT_FILE and p[0].startswith("checkpoint_")})
        registered = registered_checkpoint_names(where)
        if registered is None:
            break
        kept = [name for name in registered if name in found]
        if not (found and (not kept or found[-1] > kept[-1])) or time.time() >= deadline:
            found = kept
            break
        time.sleep(0.2)
    return storage.join(where, found[-1], run_summary.CHECKPOINT_FILE) if found else None


def resolve(cfg: DictConfig, run_dir: Path, run_id: str, wandb_group: Optional[str] = None) -> Dict[str, Any]:
    """Plain data for the workers: they have no Hydra, so every interpolation is resolved here.
    `cfg` gets its run directory as paths.output_dir (and what describe_data finds) first.
    `wandb_group`: the W&B group of a run whose logger.wandb.group is null (a multirun's)."""
    with open_dict(cfg):
        cfg.paths.output_dir = str(run_dir)
    describe_data(cfg)
    config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    # What loggers may record: masked here, where the secrets are known. A worker's environment
    # is its Ray node's, which need not hold the variables this process was started with.
    config["run"] = {
        "dir": str(run_dir),
        "id": run_id,
        "logged_config": redact(dict(config)),
        "storage": run_record.location(config["paths"]["storage"], config["paths"]["outputs"], run_dir),
    }
    if config["ckpt_path"]:
        config["run"]["init_weights"] = _initial_weights(config["ckpt_path"])
    if config["checkpoint"]["upload"] == "auto":
        config["checkpoint"]["upload"] = "background" if config["run"]["storage"] else "wait"
    if config["trainer"]["precision"] == "auto":
        config["trainer"]["precision"] = "bf16-mixed" if config["scale"]["use_gpu"] else "32-true"
    if "wandb" in config["logger"]:
        config["logger"]["wandb"]["mode"] = wandb_mode(config["logger"]["wandb"].get("mode"))
        if config["logger"]["wandb"].get("group") is None:
            config["logger"]["wandb"]["group"] = wandb_group
    return config


def _initial_weights(ckpt_path: str) -> str:
    """The checkpoint ckpt_path names (itself, or a run's best), checked to be there; local paths made
    absolute, since the workers run elsewhere."""
    from raydra import checkpoints

    try:
        found = checkpoints.locate(ckpt_path, "best")
    except RaydraError as error:
        raise RaydraError(f"ckpt_path={ckpt_path}: {error}") from None
    return found if storage.is_uri(found) else str(Path(found).resolve())


def describe_data(cfg: DictConfig) -> None:
    """Fill what the data can state about itself (a Hugging Face ClassLabel's names, an image
    folder's class folders) into data.num_classes and data.class_names, before resolving, so the
    model's `${data.num_classes}` follows and the user never repeats it. A stated count must agree."""
    target = data_to_describe(cfg)
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


def data_to_describe(cfg: DictConfig) -> Optional[str]:
    """The data module's `_target_` when its class is to describe the data: its config leaves
    num_classes or class_names null (data=hf, data=imagefolder). A data config that states its
    classes and has no class_names key (digits, cifar10, synthetic) is not asked, so the driver
    need not import the class's module, and Lightning with it (~3 s of CPU before the fit)."""
    data = cfg.data
    if not data.get("_target_"):
        return None
    asks = data.get("num_classes") is None or ("class_names" in data and data.class_names is None)
    return data._target_ if asks else None


def wandb_mode(requested: Any) -> str:
    """online only when an API key is configured; never prompt, never wait on the network."""
    if requested:
        return str(requested)
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if _wandb_api_key_configured() else "offline"


def _wandb_api_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    import wandb

    # `wandb login` stores the key in ~/.netrc under the server's host name.
    hosts = {"api.wandb.ai", urlparse(wandb.Settings().base_url).hostname}
    try:
        entries = netrc.netrc().hosts
    except (FileNotFoundError, netrc.NetrcParseError):
        return False
    return any(host in entries for host in hosts)


def _fit(config: Dict[str, Any], tune_trial: bool, callbacks: List[Any], marks: Dict[str, float], process_ends_with_run: bool) -> Any:
    import ray.train
    from ray.train.torch import TorchConfig

    from raydra.worker import train_loop

    run_id = config["run"]["id"]
    scale, ckpt = config["scale"], config["checkpoint"]
    poll_workers_often(CONTROLLER_POLL_S)
    # Ray reads and writes its storage through this filesystem: a URI's options (endpoint,
    # scheme) are parsed once here, not by each of Ray's processes.
    filesystem, storage_path = storage.filesystem(run_record.checkpoints_location(config["run"]))
    failure = {"max_failures": config["failure"]["max_failures"]}
    if tune_trial:
        # A trial whose workers cannot be placed must fail, not wait: by default Ray restarts
        # the controller of a worker group that timed out starting, without end.
        failure["controller_failure_limit"] = 0
    datasets = None
    elastic = is_elastic(scale["num_workers"])
    if scale["num_workers"] == 0:
        # Local mode: Ray Train hands the training function no checkpoint to resume from; the
        # run's own last one (resume=) is named here, where the run's record is.
        config["run"]["restore"] = last_checkpoint(Path(config["run"]["dir"]), run_id, config["run"]["storage"])
        if not config["verbose"]:
            # Its notice that local mode runs in this process: the driver has said so already.
            logging.getLogger("ray.train").setLevel(logging.WARNING)
    if config["data"].get("loader") == "ray_data":
        from raydra.data.ray_data import build

        # Built here, once, so preprocessing runs as Ray Data tasks beside the workers; each
        # worker only learns the row counts, which size its batches.
        datasets, config["run"]["data_rows"] = build(config)
    trainer = torch_trainer_class(placement_group_cleaner=not process_ends_with_run, autoscaling_requests=not has_no_autoscaler())(
        train_loop,
        train_loop_config=config,
        datasets=datasets,
        # The process group's backend and timeout are Ray's to set, not Lightning's; every strategy's
        # schema carries both (schema.ProcessGroupConfig, where their defaults live).
        torch_config=TorchConfig(backend=config["strategy"]["backend"], timeout_s=config["strategy"]["timeout_s"]),
        scaling_config=ray.train.ScalingConfig(
            # Ray takes [min, max] as a tuple of ints; it starts once min fit and grows to max.
            num_workers=worker_range(scale["num_workers"]) if elastic else scale["num_workers"],
            elastic_resize_monitor_interval_s=scale["resize_check_s"],
            use_gpu=scale["use_gpu"],
            resources_per_worker=worker_resources(OmegaConf.create(scale), tune_trial=tune_trial),
            placement_strategy=scale["placement_strategy"],
        ),
        run_config=ray.train.RunConfig(
            # A unique name under the run's own directory: Train V2 resumes any run whose
            # name and storage path it has seen before, which is what resume= relies on.
            name=run_id,
            storage_path=storage_path,
            storage_filesystem=filesystem,
            failure_config=ray.train.FailureConfig(**failure),
            callbacks=callbacks,
            worker_runtime_env=_worker_runtime_env(config),
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=ckpt["num_to_keep"], checkpoint_score_attribute=ckpt["monitor"], checkpoint_score_order=ckpt["mode"]
            ),
        ),
    )
    marks["fit_started"] = time.time()
    try:
        with elastic_reacts_quickly(ELASTIC_START_TIMEOUT_S) if elastic else contextlib.nullcontext():
            result = trainer.fit()
    except Exception as error:
        friendly = _user_error(error) or _storage_failure(config, error)
        if friendly:
            raise friendly from None  # its one sentence, without Ray's worker-failure trace
        raise
    if result.error:
        raise _user_error(result.error) or result.error
    return result


def _worker_runtime_env(config: Dict[str, Any]) -> Dict[str, Any]:
    """Ray Train's workers start importing the training code as their processes start, while Ray
    Train still sets up the group (raydra.worker.preload): the model's and data's modules too.
    A setup hook of the user's own (ray.runtime_env.worker_process_setup_hook) keeps its place."""
    if (config["ray"].get("runtime_env") or {}).get("worker_process_setup_hook"):
        return {}
    modules = ["raydra.worker.loop"] + [
        target.rpartition(".")[0] for target in (config["model"].get("_target_"), config["data"].get("_target_")) if target
    ]
    env = {preload.MODULES_ENV: ",".join(modules), **worker_setup_hook_env("raydra.worker.preload.start")}
    return {"env_vars": env}


def _user_error(error: BaseException) -> Optional[RaydraError]:
    """A RaydraError raised on a worker (a missing data path, say), unwrapped from Ray's failure
    report so the user reads its one sentence instead of a worker's stack trace; or a known
    mistake of the user's code, said as one sentence (OLD_CONVENTION)."""
    failures = list(getattr(error, "worker_failures", {}).values()) + [error]
    for failure in failures:
        while failure is not None:
            if isinstance(failure, RaydraError):
                return RaydraError(str(failure).strip().splitlines()[-1])
            built = OLD_CONVENTION.search(str(failure))
            if built:
                kind = "partial" if built["kind"] in ("partial", "_DeferredTarget") else built["kind"]
                return RaydraError(
                    f"the model calls hydra.utils.instantiate on a {kind} that raydra has already built, as Hydra builds a "
                    "model (a _partial_ optimizer or scheduler arrives as a partial, a nested _target_ as its object): call it "
                    "instead (self.hparams.optimizer(params=self.parameters())), or add `_recursive_: false` to the model's "
                    "YAML to get plain config (docs/own-project.md)."
                )
            failure = failure.__cause__ or getattr(failure, "cause", None)
    return None


# Hydra's words for instantiate() called on something already built (a module written for raydra's
# earlier convention, `instantiate(self.hparams.optimizer)`, now handed a functools.partial).
OLD_CONVENTION = re.compile(r"Cannot instantiate config of type (?P<kind>\w+)")


# What pyarrow says when a store refuses or misses a write (S3's words; GCS's are alike).
STORAGE_FAILURE = ("AWS Error", "ACCESS_DENIED", "AccessDenied", "NoSuchBucket", "When creating key", "google::cloud::Status")


def _storage_failure(config: Dict[str, Any], error: BaseException) -> Optional[RaydraError]:
    """A storage failure on a Ray node (the Train controller or a worker) as one sentence. The
    driver's own check passed, so the node differs: most often it lacks the credentials, which
    pyarrow reads from each node's own environment."""
    if not config["run"]["storage"] or not any(word in str(error) for word in STORAGE_FAILURE):
        return None
    reason = run_record.storage_error(config["paths"]["storage"], error).rstrip(".")
    return RaydraError(
        f"{reason}, on a Ray node: give every node the credentials in its own environment (they are not sent from the driver)."
    )


def _outcome(result: Any, config: Dict[str, Any]) -> Dict[str, Any]:
    worker = result.return_value or {}
    memory = worker.get("memory_per_worker", [])
    save_s = worker.get("checkpoint_save_s") or []
    upload_s = worker.get("checkpoint_upload_s") or []
    checkpoints = run_record.checkpoints_location(config["run"])
    monitor, mode = config["checkpoint"]["monitor"], config["checkpoint"]["mode"]
    local = worker.get("local_record")
    if local:
        # Local mode: Ray Train kept nothing; the training function's own record says the same.
        import pandas

        history = pandas.DataFrame(local["history"]) if local["history"] else None
        kept = [(c["path"], c["metrics"]) for c in local["checkpoints"]]
        last_path, run_path = local["last"], storage.join(checkpoints, config["run"]["id"])
    else:
        history = result.metrics_dataframe
        kept = [(c.path, m) for c, m in result.best_checkpoints or []]
        last_path, run_path = (result.checkpoint.path if result.checkpoint else None), result.path
    # The last report's metrics (local mode keeps its reports itself), then the test's.
    last_report = local["history"][-1] if local and local["history"] else result.metrics or {}
    final = {k: number(v) for k, v in last_report.items()}
    final.update(worker.get("test_metrics", {}))
    best: Dict[str, Any] = {}
    if history is not None and monitor in history:
        row = history.loc[history[monitor].idxmax() if mode == "max" else history[monitor].idxmin()]
        best = {k: number(v) for k, v in row.items() if number(v) is not None}
    best_checkpoint = None
    if kept:
        # Mid-epoch checkpoints report the monitor as NaN (unvalidated weights): never the best.
        worst = float("-inf") if mode == "max" else float("inf")
        scored = [(c, m.get(monitor)) for c, m in kept]
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
        # Why final metrics hold no test/* (the data has no test split, trainer.test=false); null when tested.
        "test_skipped": worker.get("test_skipped"),
        "global_step": worker.get("global_step"),
        # Why training ended before trainer.max_epochs, when a callback (EarlyStopping) stopped it.
        "stopped_early": worker.get("stopped_early"),
        **_sizes(worker, config),
        "checkpoints": {
            "best": _ckpt_file(checkpoints, best_checkpoint),
            "last": _ckpt_file(checkpoints, last_path),
            "dir": storage.location_of(checkpoints, run_path),
            # Mean time training stood still per checkpoint (write, and a waited-for upload), rank 0's view.
            "save_s_mean": round(sum(save_s) / len(save_s), 3) if save_s else None,
            # Mean time an upload to storage took (in the background with checkpoint.upload=background).
            "upload_s_mean": round(sum(upload_s) / len(upload_s), 3) if upload_s else None,
            "upload": config["checkpoint"]["upload"],
        },
    }


def _sizes(worker: Dict[str, Any], config: Dict[str, Any]) -> Dict[str, Any]:
    """An elastic run's final world size and its resizes (when, from, to, at which step), as rank 0
    of the last worker group knew them from the checkpoints it continued."""
    num_workers = config["scale"]["num_workers"]
    if not is_elastic(num_workers):
        return {}
    low, high = worker_range(num_workers)
    return {"world_size": worker.get("world_size"), "num_workers": {"min": low, "max": high}, "resizes": worker.get("resizes", [])}


def _ckpt_file(checkpoints: str, checkpoint_path: Optional[str]) -> Optional[str]:
    """The Lightning checkpoint file of a Ray checkpoint directory, as a path or a storage URI."""
    if checkpoint_path is None:
        return None
    return storage.join(storage.location_of(checkpoints, checkpoint_path), run_summary.CHECKPOINT_FILE)


def number(value: Any) -> Any:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


def one_line(error: BaseException) -> str:
    """The error as one line; for a failed worker group, the lowest failed rank's own exception
    (Ray's first line only says that workers failed)."""
    if getattr(error, WORKER_RANK, None) is not None:
        # Raised by the training function in this process (local mode): the worker's own exception.
        rank = getattr(error, WORKER_RANK)
        return f"worker {rank}: {_first_line(error)[:400]} (the whole trace is in logs/worker_{rank}.log)"
    failures = getattr(error, "worker_failures", None) or {}
    if failures:
        rank = min(failures)
        # The worker's exception comes back as itself (Ray 2.60 unwraps it from its traceback
        # text), or as that text, whose last exception line is the one raised.
        raised = [line for line in str(failures[rank]).splitlines() if EXCEPTION_LINE.match(line)]
        return (
            f"worker {rank}: {(raised[-1] if raised else _first_line(failures[rank]))[:400]} (the whole trace is in logs/worker_{rank}.log)"
        )
    return _first_line(error)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


# "ValueError: ...", "torch._dynamo.exc.InternalTorchDynamoError: ...": a traceback's last word.
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")
