"""`tune=`: a Ray Tune search over runs, each trial the same fit as a single run.

    validate (space keys, distributions, sampled values) -> connect -> how many trials fit side by side
    -> Tuner(trial) or Tuner.restore(<sweep dir>/tune) -> settle every trial's summary.json
    -> trials table, best_config.yaml, best checkpoint, sweep.json

A trial is Tune's function trainable `_trial`: it applies its sampled values by dotted key to the
composed config (resolved again per trial, so keys interpolated from a sampled one follow it),
validates it, and calls driver.fit_and_record, which launches the TorchTrainer with
TuneReportCallback. The sweep directory is the Hydra run directory of the invocation:

    <outputs>/sweeps/<date>/<time>_<name>/
      sweep.json             status (running / completed / failed / interrupted), metric, best trial
      trials.csv, trials.md  one row per trial: sampled values, metric, epochs, status, wall time
      best_config.yaml       the best trial's whole config: python train.py --config-path <dir> --config-name best_config
      best_checkpoint.ckpt   link to the best trial's best checkpoint
      trials/<trial id>/     one run directory per trial (.hydra/, summary.json, metrics.csv, checkpoints/, wandb/)
      tune/                  Ray Tune's experiment state, what tune.resume=<sweep dir> restores
      driver.log, logs/ray.log, .hydra/
"""

import copy
import csv
import logging
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import ray.tune
import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from ray.tune.integration.ray_train import TuneReportCallback

from raydra import driver
from raydra import summary as run_summary
from raydra.cluster import TRIAL_CPU, check_fits, connect, trials_that_fit
from raydra.console import worker_output
from raydra.errors import RaydraError
from raydra.loggers import wandb_mode
from raydra.redact import redact_hydra_records
from raydra.resume import changed_keys
from raydra.schema import validate

log = logging.getLogger("raydra")

SWEEP = "sweep.json"
# Tune's sampling functions by the name used in tune.space; `grid` is tune.grid_search.
DISTRIBUTIONS = (
    "uniform", "quniform", "loguniform", "qloguniform", "randn", "qrandn",
    "randint", "qrandint", "lograndint", "qlograndint", "choice", "grid",
)
# A value written as an interpolation that calls a resolver (${now:...}, ${hydra:...}, ${oc.env:...}):
# Tune's trial processes have no Hydra, so these are resolved on the driver before trials start.
RESOLVER_CALL = re.compile(r"\$\{\s*[\w.\-]+\s*:")
# Keys a resumed sweep may change: where and how it runs, not what it trains.
RESUMABLE_CHANGES = ("tune.resume", "tune.max_concurrent")


# ---------------------------------------------------------------------------------------------
# The search space


def parse_space(cfg: DictConfig) -> Dict[str, Tuple[str, List[Any]]]:
    """tune.space as {dotted key: (distribution, arguments)}, checked against the composed config.

    Keys may be dotted (`model.optimizer.lr: {...}`) or nested (`model: {dropout: {...}}`, which is
    what `+tune.space.model.dropout=...` makes); a key set to null is left out of the search. A key
    with several distributions takes the last.
    """
    space: Dict[str, Tuple[str, List[Any]]] = {}

    def walk(node: Dict[str, Any], prefix: str) -> None:
        for key, spec in node.items():
            path = f"{prefix}{key}"
            if spec is None:
                continue
            target = OmegaConf.select(cfg, path, default=_ABSENT, throw_on_resolution_failure=False)
            if target is _ABSENT:
                raise RaydraError(
                    f"tune.space: {path} is not a key of the composed config; check its spelling "
                    "(python train.py --cfg job prints every key)."
                )
            if isinstance(target, DictConfig):
                if not isinstance(spec, dict):
                    raise RaydraError(f"tune.space: {path} is a group of keys, not one value; search a key inside it.")
                walk(spec, path + ".")
                continue
            if not isinstance(spec, dict) or not spec:
                raise RaydraError(
                    f"tune.space.{path} must be a distribution and its arguments, "
                    "e.g. {loguniform: [1e-4, 1e-1]} or {choice: [32, 64]}."
                )
            # Hydra merges a dict given on the command line into the YAML's instead of replacing
            # it, so `'tune.space={lr: {choice: [...]}}'` over a YAML `{loguniform: [...]}` leaves
            # both; the one given last (the command line's) is the one meant.
            name, args = list(spec.items())[-1]
            if name not in DISTRIBUTIONS:
                raise RaydraError(
                    f"tune.space.{path}: {name} is not a distribution raydra knows; use one of {', '.join(DISTRIBUTIONS)}."
                )
            args = list(args) if isinstance(args, (list, tuple)) else [args]
            space[path] = (name, args)

    walk(OmegaConf.to_container(cfg.tune.space, resolve=True), "")
    if not space:
        raise RaydraError("tune.space leaves no key to search; give at least one key a distribution.")
    return space


class _Absent:
    pass


_ABSENT = _Absent()


def domain(key: str, name: str, args: List[Any]) -> Any:
    """The Ray Tune domain for one key of tune.space."""
    tune = ray.tune
    try:
        if name == "grid":
            return tune.grid_search(args)
        if name == "choice":
            return tune.choice(args)
        return getattr(tune, name)(*args)
    except (TypeError, ValueError, AssertionError) as error:
        raise RaydraError(f"tune.space.{key}: {name} {args} is not valid ({error}); e.g. uniform and loguniform take [low, high].") from None


def check_samples(cfg: DictConfig, space: Dict[str, Tuple[str, List[Any]]]) -> None:
    """Every choice, and both ends of every range, must make a valid run: a type the schema
    accepts and values validate() accepts, so a bad space fails before any trial starts."""
    for key, (name, args) in space.items():
        dom = domain(key, name, args)
        if name in ("choice", "grid"):
            values = args
        elif type(dom).__name__ == "Integer":
            values = [dom.lower, dom.upper - 1]  # randint's upper bound is exclusive
        elif type(dom).__name__ == "Float" and dom.lower is not None and dom.upper is not None:
            values = [float(dom.lower), (dom.lower + dom.upper) / 2, float(dom.upper)]
        else:
            values = dom.sample(size=2)
        for value in values:
            trial_cfg = copy.deepcopy(cfg)
            try:
                OmegaConf.update(trial_cfg, key, _plain(value), merge=False)
                validate(trial_cfg)
            except (OmegaConfBaseException, RaydraError) as error:
                reason = str(error).strip().splitlines()[0]
                raise RaydraError(f"tune.space.{key}: the value {value} makes an invalid run ({reason}); narrow the space.") from None


def _plain(value: Any) -> Any:
    """numpy scalars (what Tune samples) as Python numbers, which OmegaConf and YAML accept."""
    return value.item() if hasattr(value, "item") else value


# ---------------------------------------------------------------------------------------------
# One trial: Tune's function trainable


def _trial(sampled: Dict[str, Any], base: Dict[str, Any], sweep: Dict[str, Any]) -> None:
    started = time.time()
    # Held from the start: when Tune stops a trial it sets the session's stop event and drops the
    # session at once, often before this thread sees its fit end.
    tune_session = _tune_session()
    trial_id = ray.tune.get_context().get_trial_id()
    run_dir = Path(sweep["dir"], "trials", trial_id)
    run_id = f"{sweep['id']}_{trial_id}"
    sampled = {key: _plain(value) for key, value in sampled.items()}
    overrides = sweep["overrides"] + [f"{key}={value}" for key, value in sampled.items()]
    previous = run_summary.read(run_dir) if (run_dir / run_summary.SUMMARY).is_file() else None

    conf = OmegaConf.create(base)
    for key, value in sampled.items():
        OmegaConf.update(conf, key, value, merge=False)
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(conf))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides, sort_keys=False))
    redact_hydra_records(run_dir)
    summary = driver.new_summary(conf, run_dir, run_id, overrides)
    summary["trial"] = {"sweep": sweep["id"], "id": trial_id, "sampled": sampled}
    if previous:
        # A resumed sweep runs an unfinished trial again under the same run id: Train V2 continues
        # it from its last checkpoint.
        summary["started_at"] = previous["started_at"]
        summary["resumed"] = previous.get("resumed", []) + [{"at": run_summary.now(), "from_status": previous.get("status")}]
    # The sweep only starts as many trials as the cluster holds, so a worker group that does not
    # start is slow (a loaded node, a stopped trial's workers still leaving), not starved: Train
    # V2's 60 s default failed trials on a busy 2-CPU machine. Still an error, never a hang.
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "300")
    try:
        validate(conf)
        config = driver._resolve(conf, run_dir, run_id)
        driver.fit_and_record(config, summary, started, tune_trial=True)
    except Exception as error:
        if _stopped_by_tune(tune_session) or _settled(run_dir):
            # The scheduler ended this trial; the sweep driver records it from Tune's results.
            raise
        reason = str(error) if isinstance(error, RaydraError) else driver._one_line(error)
        summary.update(status="failed", error=reason, finished_at=run_summary.now(), wall_time_s=round(time.time() - started, 2))
        run_summary.write(run_dir, summary)
        raise
    # The last epoch reaches Tune only now, with the test metrics, once summary.json is complete
    # (see ReportToTune).
    final = dict(summary["metrics"]["final"])
    final["epochs_done"] = summary.get("epochs_completed")
    ray.tune.report(final)


def _tune_session() -> Any:
    from ray.train._internal.session import get_session

    return get_session()


def _stopped_by_tune(session: Any) -> bool:
    return session is not None and session.stop_event.is_set()


def _settled(run_dir: Path) -> bool:
    """Whether the sweep driver already recorded this trial as stopped: its record is final."""
    path = run_dir / run_summary.SUMMARY
    return path.is_file() and run_summary.read(run_dir).get("status") == "stopped"


class ReportToTune(TuneReportCallback):
    """TuneReportCallback for every epoch but the last. A scheduler stops a trial the moment it
    reports its last epoch (ASHA's max_t), which would cut off the trial's test and its
    summary.json; the trial reports that epoch itself after writing them."""

    def __init__(self, max_epochs: int) -> None:
        super().__init__()
        self.max_epochs = max_epochs

    def after_report(self, run_context: Any, metrics: List[Dict[str, Any]], checkpoint: Any) -> None:
        # Mid-epoch checkpoints (checkpoint.every_n_steps) are no epoch for ASHA to count.
        if not metrics or metrics[0].get("mid_epoch") or metrics[0].get("epoch", -1) + 1 >= self.max_epochs:
            return
        # ASHA counts epochs_done, not Tune's training_iteration, which starts again at 1 when a
        # resumed sweep restarts a trial that Train V2 continues from a later epoch.
        metrics = [dict(metrics[0], epochs_done=metrics[0]["epoch"] + 1), *metrics[1:]]
        super().after_report(run_context, metrics, checkpoint)


# ---------------------------------------------------------------------------------------------
# The sweep driver


def run(cfg: DictConfig) -> Optional[float]:
    """Run the sweep `cfg.tune` describes; returns the best trial's metric."""
    started = time.time()
    fresh_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    redact_hydra_records(fresh_dir)
    sweep_dir = fresh_dir
    tune_cfg = cfg.tune
    metric = tune_cfg.metric or cfg.checkpoint.monitor
    mode = tune_cfg.mode or cfg.checkpoint.mode
    record: Dict[str, Any] = {
        "kind": "tune sweep",
        "name": cfg.name,
        "id": f"{fresh_dir.parent.name}_{fresh_dir.name}",
        "sweep_dir": str(fresh_dir),
        "status": "running",
        "error": None,
        "started_at": run_summary.now(),
        "overrides": list(HydraConfig.get().overrides.task),
        "search": tune_cfg.search,
        "scheduler": tune_cfg.scheduler,
        "metric": metric,
        "mode": mode,
        "num_samples": tune_cfg.num_samples,
    }
    restore_sigterm = lambda: None  # noqa: E731
    progress = Progress(metric, cfg.trainer.max_epochs)
    try:
        if (fresh_dir / SWEEP).exists():
            raise RaydraError(f"{fresh_dir} already holds a sweep; give this one its own hydra.run.dir.")
        validate(cfg)
        if tune_cfg.resume:
            sweep_dir, record = _continue(cfg, fresh_dir)
        else:
            space = parse_space(cfg)
            check_samples(cfg, space)
            record["space"] = {key: {name: args} for key, (name, args) in space.items()}
        _write_record(sweep_dir, record)

        connect(cfg.ray.address, cfg.ray.num_cpus, cfg.verbose)
        restore_sigterm = _sigterm_stops_tune()
        check_fits(cfg.scale)
        concurrency = _concurrency(cfg)
        record["max_concurrent"] = concurrency
        log.info(
            f"sweep {record['id']}: {tune_cfg.num_samples} trials of {cfg.name}, {concurrency} at a time, "
            f"{tune_cfg.search} search, {tune_cfg.scheduler} scheduler, {mode} {metric}\n  dir  {sweep_dir}"
        )
        progress.scheduler_state = sweep_dir / "tune" / "scheduler_state.pkl"
        tuner = _tuner(cfg, sweep_dir, record, concurrency, progress)
        worker_output.start_run(sweep_dir)
        # Concurrent trials' epoch lines would interleave; _Progress prints one line per trial event.
        echo, worker_output.echo_progress = worker_output.echo_progress, False
        try:
            grid = tuner.fit()
        except Exception as error:
            raise _tune_error(error, metric) or error
        finally:
            worker_output.end_run()
            worker_output.echo_progress = echo
        rows = _settle_trials(sweep_dir, grid, progress, metric, mode, tune_cfg.scheduler)
        _write_tables(sweep_dir, rows, metric)
        unfinished = [row for row in rows if row["status"] in ("running", "pending", "interrupted")]
        if unfinished:
            raise KeyboardInterrupt
        best = _best(rows, mode)
        if best is None:
            first_error = next((row["error"] for row in rows if row["error"]), "no trial completed")
            raise RaydraError(f"no trial of the sweep completed; the first error: {first_error}")
        record["best"] = _write_best(cfg, sweep_dir, best, metric)
        record["trials"] = {status: sum(row["status"] == status for row in rows) for status in ("completed", "stopped", "failed")}
    except RaydraError as error:
        _end(record, sweep_dir, started, "failed", str(error))
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        _settle_trials(sweep_dir, None, progress, metric, mode, tune_cfg.scheduler, interrupted=True)
        _end(record, sweep_dir, started, "interrupted", f"interrupted; continue it with tune.resume={sweep_dir}")
        raise SystemExit(130) from None
    except Exception as error:
        _end(record, sweep_dir, started, "failed", driver._one_line(error))
        raise
    finally:
        restore_sigterm()
    _end(record, sweep_dir, started, "completed", None)
    best = record["best"]
    log.info(
        f"sweep done in {record['wall_time_s']:.1f} s: {record['trials']['completed']} completed, "
        f"{record['trials']['stopped']} stopped early, {record['trials']['failed']} failed\n"
        f"  best trial {best['trial']}  {metric} {best['metric']:.4f}  {_fmt_sampled(best['sampled'])}\n"
        f"  trials  {sweep_dir / 'trials.md'}\n"
        f"  rerun   python train.py --config-path {sweep_dir} --config-name best_config"
    )
    return best["metric"]


def _continue(cfg: DictConfig, fresh_dir: Path) -> Tuple[Path, Dict[str, Any]]:
    """The sweep tune.resume names, checked to be an unfinished raydra sweep of the same config."""
    sweep_dir = Path(cfg.tune.resume).expanduser().resolve()
    if not (sweep_dir / SWEEP).is_file() or not (sweep_dir / "tune").is_dir():
        raise RaydraError(
            f"tune.resume={cfg.tune.resume}: {sweep_dir} is not a raydra sweep directory (no sweep.json and tune/); "
            "pass the directory a tune= run printed."
        )
    record = run_summary.read(sweep_dir, SWEEP)
    if record.get("status") == "completed":
        raise RaydraError(f"tune.resume={cfg.tune.resume}: {sweep_dir} already completed; start a new sweep instead.")
    old = yaml.safe_load((sweep_dir / ".hydra" / "config.yaml").read_text())
    changes = [c for c in changed_keys(old, cfg) if not c.startswith(RESUMABLE_CHANGES)]
    if changes:
        raise RaydraError(
            f"tune.resume={cfg.tune.resume}: the config differs from the one the sweep started with "
            f"({'; '.join(changes)}); resume with the original overrides plus tune.resume=..."
        )
    record.update(status="running", error=None)
    record["resumed"] = record.get("resumed", []) + [{"at": run_summary.now(), "from_status": record.get("status"), "log": str(fresh_dir / "driver.log")}]
    # The invocation's own Hydra directory points at the sweep it continued, so it never reads as a sweep of its own.
    _write_record(fresh_dir, {"kind": "tune sweep resume", "status": "resumed elsewhere", "sweep_dir": str(sweep_dir)})
    log.info(f"resuming sweep {sweep_dir} (this invocation's driver.log: {fresh_dir})")
    return sweep_dir, record


def _concurrency(cfg: DictConfig) -> int:
    fits = trials_that_fit(cfg.scale)
    asked = cfg.tune.max_concurrent
    if asked is not None and asked > fits:
        log.info(f"tune.max_concurrent={asked} but the cluster holds {fits} trial(s) side by side; running {fits} at a time")
    return min(asked or fits, fits)


def _tuner(cfg: DictConfig, sweep_dir: Path, record: Dict[str, Any], concurrency: int, progress: "Progress") -> Any:
    tune = ray.tune

    # Tune saves its experiment state every few seconds rather than on its adaptive period, so a
    # sweep killed outright loses at most that much of its record of finished trials.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")
    if not cfg.verbose:
        # Tune's newer console output prints its banner and paths even at verbose=0; Progress
        # prints what a researcher needs.
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    sweep = {"dir": str(sweep_dir), "id": record["id"], "overrides": [o for o in record["overrides"] if not o.startswith("tune.resume=")]}
    trainable = tune.with_resources(
        tune.with_parameters(_trial, base=_trial_base(cfg, record["id"]), sweep=sweep), {"CPU": TRIAL_CPU}
    )
    if cfg.tune.resume:
        tuner = tune.Tuner.restore(
            str(sweep_dir / "tune"), trainable, resume_unfinished=True, resume_errored=False, restart_errored=False
        )
        # The restored RunConfig holds the interrupted driver's callback, unpickled; this process
        # needs its own to see the trials. Tuner.restore takes no callbacks of its own.
        tuner._local_tuner.get_run_config().callbacks = [progress]
        # Tuner.restore brings back the scheduler as it was created, with no rungs: trials run
        # after a resume would be compared only with each other. Progress saved its rungs.
        progress.scheduler = tuner._local_tuner._tune_config.scheduler
        if progress.scheduler is not None and progress.scheduler_state.is_file():
            # Only the rungs: Tune refuses a scheduler that already holds a metric and mode.
            unset = {k: v for k, v in vars(progress.scheduler).items() if k in ("_metric", "_mode", "_metric_op")}
            progress.scheduler.restore(str(progress.scheduler_state))
            vars(progress.scheduler).update(unset)
        return tuner
    space = {key: domain(key, name, args) for key, (name, args) in parse_space(cfg).items()}
    metric, mode = record["metric"], record["mode"]
    progress.scheduler = _scheduler(cfg)
    return tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            metric=metric,
            mode=mode,
            num_samples=cfg.tune.num_samples,
            search_alg=_search(cfg, concurrency),
            scheduler=progress.scheduler,
            # Random search limits itself (above); Tune wraps Optuna in a ConcurrencyLimiter.
            max_concurrent_trials=concurrency if cfg.tune.search == "optuna" else None,
            # A stopped trial's process must end: reused, its training thread would run on.
            reuse_actors=False,
        ),
        run_config=tune.RunConfig(
            name="tune", storage_path=str(sweep_dir), verbose=1 if cfg.verbose else 0, callbacks=[progress]
        ),
    )


def _search(cfg: DictConfig, concurrency: int) -> Any:
    # metric and mode go to TuneConfig only: Tune refuses them twice.
    if cfg.tune.search == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        if not cfg.verbose:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
        return OptunaSearch(seed=cfg.tune.seed)
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=cfg.tune.seed, max_concurrent=concurrency)


def _scheduler(cfg: DictConfig) -> Any:
    if cfg.tune.scheduler == "fifo":
        return None
    from ray.tune.schedulers import ASHAScheduler

    asha = cfg.tune.asha
    return ASHAScheduler(
        time_attr="epochs_done",
        max_t=asha.max_t or cfg.trainer.max_epochs,
        grace_period=asha.grace_period,
        reduction_factor=asha.reduction_factor,
        brackets=asha.brackets,
    )


def _trial_base(cfg: DictConfig, sweep_id: str) -> Dict[str, Any]:
    """The composed config as plain, still-unresolved data for the trials: resolved per trial
    after its sampled values are applied, so ${data.batch_size}-style references follow them."""
    base = copy.deepcopy(cfg)
    base.tune = None
    base.resume = None
    if "wandb" in base.logger:
        # Decided once here: the trials' processes may not see this shell's key or WANDB_MODE.
        base.logger.wandb.mode = wandb_mode(base.logger.wandb.mode)
        if base.logger.wandb.group is None:
            base.logger.wandb.group = sweep_id
    plain = OmegaConf.to_container(base, resolve=False)
    _freeze_resolver_calls(base, plain)
    return plain


def _freeze_resolver_calls(node: Any, plain: Any) -> None:
    items = plain.items() if isinstance(plain, dict) else enumerate(plain)
    for key, value in list(items):
        if isinstance(value, (dict, list)):
            _freeze_resolver_calls(node[key], value)
        elif isinstance(value, str) and RESOLVER_CALL.search(value):
            resolved = node[key]
            plain[key] = OmegaConf.to_container(resolved, resolve=True) if isinstance(resolved, (DictConfig, ListConfig)) else resolved


def _sigterm_stops_tune() -> Any:
    """SIGTERM stops the sweep the way Ctrl-C does: Tune ends its trials and saves its state, so
    tune.resume= can continue it. Returns the function that puts the old handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))
    return lambda: signal.signal(signal.SIGTERM, previous)


def _tune_error(error: BaseException, metric: str) -> Optional[RaydraError]:
    text = ""
    while error is not None:
        text += str(error)
        error = error.__cause__ or error.__context__
    if "did not include the specified metric" in text:
        return RaydraError(
            f"tune.metric={metric} is not among the metrics the trials report; use a logged metric such as "
            "val/acc or val/loss (metrics.csv of any run lists them), or set checkpoint.monitor."
        )
    return None


# ---------------------------------------------------------------------------------------------
# After the search: every trial's record, the table, the best trial


class Progress(ray.tune.Callback):
    """One console line per trial event, and every trial's latest status for the sweep's record."""

    def __init__(self, metric: str, max_epochs: int) -> None:
        self.metric, self.max_epochs = metric, max_epochs
        # Trial id -> Tune status after Tune's last step: a snapshot, because stopping an
        # interrupted sweep changes the trials' own status afterwards.
        self.statuses: Dict[str, str] = {}
        self.scheduler: Any = None
        self.scheduler_state: Optional[Path] = None

    def _save_scheduler(self) -> None:
        # Called after the scheduler has seen the result, so its rungs include it.
        if self.scheduler is None or self.scheduler_state is None or not self.scheduler_state.parent.is_dir():
            return
        tmp = self.scheduler_state.with_suffix(".tmp")
        self.scheduler.save(str(tmp))
        os.replace(tmp, self.scheduler_state)

    def on_step_end(self, iteration: int, trials: List[Any], **info: Any) -> None:
        self.statuses = {trial.trial_id: trial.status for trial in trials}

    def on_trial_start(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
        log.info(f"trial {trial.trial_id} started: {_fmt_sampled(trial.config)}")

    def on_trial_result(self, iteration: int, trials: List[Any], trial: Any, result: Dict[str, Any], **info: Any) -> None:
        value = result.get(self.metric)
        if isinstance(value, (int, float)):
            log.info(f"trial {trial.trial_id} epoch {result.get('epochs_done')}: {self.metric} {value:.4f}")
        self._save_scheduler()

    def on_trial_complete(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
        epochs = (trial.last_result or {}).get("epochs_done", 0)
        how = "done" if epochs >= self.max_epochs else "stopped early"
        log.info(f"trial {trial.trial_id} {how} after {epochs} epoch(s)")

    def on_trial_error(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
        log.info(f"trial {trial.trial_id} failed (its summary.json says why)")

    def __getstate__(self) -> Dict[str, Any]:
        # Tune pickles its RunConfig, callbacks included, into the sweep's tune/ directory.
        return {"metric": self.metric, "max_epochs": self.max_epochs, "statuses": {}, "scheduler": None, "scheduler_state": None}


def _settle_trials(
    sweep_dir: Path, grid: Any, progress: Any, metric: str, mode: str, scheduler: str, interrupted: bool = False
) -> List[Dict[str, Any]]:
    """Bring every trial's summary.json to its final state and return the table's rows.

    A trial writes its own summary.json, except when Tune ends its process: a trial ASHA stopped
    is recorded here from what it reported to Tune.
    """
    results = {}
    for result in grid or []:
        if result.metrics and "trial_id" in result.metrics:
            results[result.metrics["trial_id"]] = result
    statuses = progress.statuses
    rows = []
    seen = set()
    for run_dir in sorted(Path(sweep_dir, "trials").glob("*/" + run_summary.SUMMARY)):
        run_dir = run_dir.parent
        summary = run_summary.read(run_dir)
        trial_id = summary.get("trial", {}).get("id", run_dir.name)
        seen.add(trial_id)
        status, result = statuses.get(trial_id), results.get(trial_id)
        # A trial Tune ended without error but that did not record its completion was stopped by
        # the scheduler (its process may have noted the stop as a failure on its way out).
        if status == "TERMINATED" and result is not None and summary["status"] in ("running", "failed", "interrupted"):
            summary.update(_stopped(result, metric, mode, run_dir, summary["run_id"], scheduler))
            run_summary.write(run_dir, summary)
        if summary["status"] == "running":
            if status == "ERROR":
                summary.update(status="failed", error=_one_line_error(result) or "the trial's process died")
            elif interrupted or status in ("RUNNING", "PENDING", "PAUSED"):
                summary.update(status="interrupted", error="the sweep was interrupted; continue it with tune.resume=" + str(sweep_dir))
            if summary["status"] != "running":
                summary.setdefault("finished_at", run_summary.now())
                run_summary.write(run_dir, summary)
        rows.append(_row(summary, run_dir, metric, sweep_dir))
    for trial_id, status in statuses.items():
        if trial_id not in seen:
            rows.append({"trial": trial_id, "sampled": {}, "status": "pending" if status in ("PENDING", "PAUSED", "RUNNING") else status.lower(),
                         "final": None, "best": None, "epochs": None, "wall_s": None, "error": None, "run_dir": None, "summary": None})
    return rows


def _stopped(result: Any, metric: str, mode: str, run_dir: Path, run_id: str, scheduler: str) -> Dict[str, Any]:
    history = result.metrics_dataframe
    last = result.metrics
    final = {k: driver._number(v) for k, v in last.items() if "/" in k and driver._number(v) is not None}
    best: Dict[str, Any] = {}
    if history is not None and metric in history:
        row = history.loc[history[metric].idxmax() if mode == "max" else history[metric].idxmin()]
        best = {k: driver._number(v) for k, v in row.items() if "/" in str(k) and driver._number(v) is not None}
    epochs = last.get("epochs_done")
    return {
        "status": "stopped",
        "error": None,
        "stopped_by": f"the {scheduler} scheduler after {epochs} epoch(s)",
        "metrics": {"final": final, "best": best},
        "epochs_completed": epochs,
        "wall_time_s": round(float(last.get("time_total_s", 0.0)), 2),
        "finished_at": run_summary.now(),
        "checkpoints": {"best": None, "last": driver._last_checkpoint(run_dir, run_id)},
    }


def _one_line_error(result: Any) -> Optional[str]:
    if result is None or result.error is None:
        return None
    return driver._one_line(result.error)


def _row(summary: Dict[str, Any], run_dir: Path, metric: str, sweep_dir: Path) -> Dict[str, Any]:
    metrics = summary.get("metrics") or {}
    return {
        "trial": summary.get("trial", {}).get("id", run_dir.name),
        "sampled": summary.get("trial", {}).get("sampled", {}),
        "status": summary["status"],
        "final": (metrics.get("final") or {}).get(metric),
        "best": (metrics.get("best") or {}).get(metric),
        "epochs": summary.get("epochs_completed"),
        "wall_s": summary.get("wall_time_s"),
        "error": summary.get("error"),
        "run_dir": str(run_dir.relative_to(sweep_dir)),
        "summary": summary,
    }


def _best(rows: List[Dict[str, Any]], mode: str) -> Optional[Dict[str, Any]]:
    """The completed trial with the best final metric (what Tune compares at each trial's end)."""
    done = [row for row in rows if row["status"] == "completed" and isinstance(row["final"], (int, float))]
    if not done:
        return None
    return (max if mode == "max" else min)(done, key=lambda row: row["final"])


def _write_tables(sweep_dir: Path, rows: List[Dict[str, Any]], metric: str) -> None:
    keys = sorted({key for row in rows for key in row["sampled"]})
    header = ["trial", *keys, metric, f"best {metric}", "epochs", "status", "wall_s", "run_dir", "error"]
    table = [
        [row["trial"], *[row["sampled"].get(key) for key in keys], row["final"], row["best"], row["epochs"],
         row["status"], row["wall_s"], row["run_dir"], row["error"] or ""]
        for row in rows
    ]
    with (sweep_dir / "trials.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(table)

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "" if value is None else str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in line) + " |" for line in table]
    (sweep_dir / "trials.md").write_text("\n".join(lines) + "\n")


def _write_best(cfg: DictConfig, sweep_dir: Path, best: Dict[str, Any], metric: str) -> Dict[str, Any]:
    """best_config.yaml: the whole composed config with the best trial's values, a primary config
    Hydra can run on its own; and a link to that trial's best checkpoint."""
    config = copy.deepcopy(cfg)
    config.tune = None
    config.resume = None
    for key, value in best["sampled"].items():
        OmegaConf.update(config, key, value, merge=False)
    conf_dir = next(
        (s["path"] for s in HydraConfig.get().runtime.config_sources if s["provider"] == "main" and s["schema"] == "file"), None
    )
    head = {"defaults": ["raydra_schema", "_self_", {"hydra": "default"}]}
    if conf_dir:
        head["hydra"] = {"searchpath": [f"file://{conf_dir}"]}
    text = (
        f"# The best trial ({best['trial']}, {metric} {best['final']}) of the sweep in {sweep_dir}.\n"
        f"# Rerun it exactly:  python train.py --config-path {sweep_dir} --config-name best_config\n"
        + yaml.safe_dump(head, sort_keys=False)
        + OmegaConf.to_yaml(config)
    )
    (sweep_dir / "best_config.yaml").write_text(text)
    checkpoint = (best["summary"].get("checkpoints") or {}).get("best")
    link = sweep_dir / "best_checkpoint.ckpt"
    if link.is_symlink() or link.exists():
        link.unlink()
    if checkpoint:
        link.symlink_to(os.path.relpath(checkpoint, sweep_dir))
    return {
        "trial": best["trial"], "metric": best["final"], "sampled": best["sampled"],
        "run_dir": str(sweep_dir / best["run_dir"]), "checkpoint": checkpoint,
        "config": str(sweep_dir / "best_config.yaml"),
    }


def _write_record(sweep_dir: Path, record: Dict[str, Any]) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    run_summary.write(sweep_dir, record, name=SWEEP)


def _end(record: Dict[str, Any], sweep_dir: Path, started: float, status: str, reason: Optional[str]) -> None:
    record.update(status=status, error=reason, finished_at=run_summary.now(), wall_time_s=round(time.time() - started, 2))
    if sweep_dir.exists():
        _write_record(sweep_dir, record)
    if reason:
        log.error(f"error: {reason}" if status == "failed" else reason)


def _fmt_sampled(sampled: Dict[str, Any]) -> str:
    return "  ".join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}" for key, value in sampled.items())
