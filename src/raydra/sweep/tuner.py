"""The sweep's driver: validate the space, connect, run Tune's search (or continue an interrupted
one), and leave the sweep record; Tune runs each trial through raydra.sweep.trial."""

import logging
import os
import posixpath
import re
import signal
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import ray.tune
import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from raydra import storage
from raydra.cluster.ray_cluster import TRIAL_CPU, check_fits, trials_that_fit
from raydra.cluster.worker_output import worker_output
from raydra.config.spec import Place
from raydra.errors import RaydraError
from raydra.private_apis.ray_tune import replace_restored_tuner_callbacks, restore_scheduler_rungs, restored_tuner_scheduler
from raydra.records import layout, sync
from raydra.records import sweep as sweep_record
from raydra.records.envelope import Status
from raydra.records.sweep import SweepRecord, TrialCounts
from raydra.redact import redact_yaml_files
from raydra.run.lifecycle import COMPLETED, INTERRUPTED, Ending, Lifecycle
from raydra.run.prepare import Invocation, prepare, writable
from raydra.run.resolve import wandb_mode
from raydra.run.resume import changed_keys
from raydra.sweep import pbt, report
from raydra.sweep.report import TrialEvents
from raydra.sweep.space import check_samples, domain, parse_mutations, parse_space
from raydra.sweep.trial import run_trial

log = logging.getLogger("raydra")

# A value written as an interpolation that calls a resolver (${now:...}, ${hydra:...}, ${oc.env:...}):
# Tune's trial processes have no Hydra, so these are resolved on the driver before trials start.
RESOLVER_CALL = re.compile(r"\$\{\s*[\w.\-]+\s*:")
# Keys a resumed sweep may change: where and how it runs, not what it trains.
RESUMABLE_CHANGES = ("tune.resume", "tune.max_concurrent")


def run_sweep(
    cfg: DictConfig, output_dir: Path, overrides: List[str], config_dir: Optional[str] = None, job_ray_address: Optional[str] = None
) -> SweepRecord:
    """Run the sweep `cfg.tune` describes in `output_dir` (Hydra's output directory for it), or
    continue the one tune.resume names; returns the sweep's record (sweep.json), its best trial
    in `best`. `config_dir`: the primary config's directory, which best_config.yaml searches.
    `job_ray_address`: the multirun's cluster, when the sweep is one of its jobs.

    Raises RaydraError for bad input or a sweep in which no trial completed, KeyboardInterrupt
    when interrupted (Ctrl-C, SIGTERM) after recording how to continue it."""
    started = time.time()
    fresh_dir = Path(output_dir).resolve()
    redact_yaml_files(fresh_dir / layout.HYDRA_DIR)
    sweep_dir = fresh_dir
    tune_cfg = cfg.tune
    metric = tune_cfg.metric or cfg.checkpoint.monitor
    mode = tune_cfg.mode or cfg.checkpoint.mode
    record = SweepRecord.started(
        name=cfg.name,
        id=layout.ray_safe(f"{fresh_dir.parent.name}_{fresh_dir.name}"),
        sweep_dir=str(fresh_dir),
        overrides=list(overrides),
        search=tune_cfg.search,
        scheduler=tune_cfg.scheduler,
        metric=metric,
        mode=mode,
        num_samples=tune_cfg.num_samples,
    )
    trial_events = TrialEvents(metric, cfg.trainer.max_epochs)
    # Another sweep's record in this directory is refused and left as it was.
    claimed = not (fresh_dir / layout.SWEEP).exists()

    def settle(ending: Ending) -> None:
        if ending.status == COMPLETED:
            report.end(sweep_dir, record, write=claimed)
            return
        if ending.status == INTERRUPTED:
            report.settle_trials(sweep_dir, None, trial_events, metric, mode, tune_cfg.scheduler, interrupted=True)
        report.end(sweep_dir, record.settled(ending, started), write=claimed)

    # Tune ends its trials and saves its state on SIGINT, so tune.resume= can continue the sweep:
    # SIGTERM is handed to it as SIGINT.
    with Lifecycle(settle, continue_with=lambda: f"tune.resume={sweep_dir}", sigterm_as_sigint=True) as life:
        if not claimed:
            raise RaydraError(f"{fresh_dir} already holds a sweep; give this one its own hydra.run.dir.")
        # A ModelCheckpoint among the callbacks sets checkpoint.*, and with it what the sweep optimises.
        prepared = prepare(cfg, Invocation(overrides=tuple(overrides), job_ray_address=job_ray_address))
        cfg, composed = prepared.config, prepared.composed
        tune_cfg = cfg.tune
        metric = trial_events.metric = tune_cfg.metric or cfg.checkpoint.monitor
        mode = tune_cfg.mode or cfg.checkpoint.mode
        record = record.with_settings(metric=metric, mode=mode)
        mutations = parse_mutations(cfg) if tune_cfg.scheduler == "pbt" else {}
        if tune_cfg.resume:
            sweep_dir, record = _continue(composed, fresh_dir)
        else:
            space = parse_space(cfg)
            check_samples(cfg, space)
            check_samples(cfg, mutations, "pbt.mutations" if tune_cfg.pbt.mutations else "space")
            record = record.with_settings(
                space={key: {name: args} for key, (name, args) in space.items()},
                mutations={key: {name: args} for key, (name, args) in mutations.items()},
            )
        sweep_record.write(sweep_dir, record)
        # With paths.storage, Tune's state and every trial's record live there; the trials' records
        # are pulled into this sweep directory as they go.
        sweep_place = Place(
            dir=str(sweep_dir), id=record.id, storage=layout.location(cfg.paths.storage, cfg.paths.outputs, sweep_dir), logged_config={}
        )
        if sweep_place.storage:
            sync.check_writable(cfg.paths.storage)
            record = record.with_settings(storage=sweep_place.storage)

        life.connect(cfg, sweep_dir)
        check_fits(OmegaConf.to_object(cfg.scale))
        if not sweep_place.storage:
            sync.check_shared(sweep_dir)
        concurrency = _concurrency(cfg)
        if tune_cfg.scheduler == "pbt" and tune_cfg.pbt.synch and concurrency < tune_cfg.num_samples:
            # Ray's synchronous PBT waits for the trials that are running: those that start later
            # would wait for a perturbation time already passed, and never be compared or copied.
            raise RaydraError(
                f"tune.pbt.synch=true needs all {tune_cfg.num_samples} trials running at once, but {concurrency} fit side by side; "
                "lower tune.num_samples, give the trials fewer resources (scale.num_workers, scale.cpus_per_worker), or set tune.pbt.synch=false."
            )
        record = record.with_settings(max_concurrent=concurrency)
        log.info(
            f"sweep {record.id}: {tune_cfg.num_samples} trials of {cfg.name}, {concurrency} at a time, "
            f"{tune_cfg.search} search, {tune_cfg.scheduler} scheduler, {mode} {metric}\n  dir  {sweep_dir}"
        )
        trial_events.scheduler_state = sweep_dir / layout.SCHEDULER_STATE
        # The driver's own file, here even when Tune keeps its state in storage.
        trial_events.scheduler_state.parent.mkdir(parents=True, exist_ok=True)
        tuner = _tuner(cfg, sweep_dir, sweep_place.storage, record, concurrency, trial_events, list(mutations))
        # PBT's copies, kept in sweep.json as they happen (a resumed sweep's record holds the earlier ones).
        trial_events.lineage = list(record.lineage)

        def lineage_grew(lineage: List[sweep_record.Exploit]) -> None:
            nonlocal record
            record = record.with_settings(lineage=list(lineage))
            sweep_record.write(sweep_dir, record)

        trial_events.lineage_grew = lineage_grew
        worker_output.start_run(sweep_dir)
        # Concurrent trials' epoch lines would interleave; TrialEvents prints one line per trial event.
        echo, worker_output.echo_progress = worker_output.echo_progress, False
        try:
            # SLURM's time-limit notice stops the sweep as Ctrl-C does (_stop_as_ctrl_c).
            with sync.Follower(sweep_place, skip=(layout.TUNE, layout.CHECKPOINTS)), life.stops_on_notice(_stop_as_ctrl_c):
                grid = tuner.fit()
        except Exception as error:
            friendly = _tune_error(error, metric)
            if friendly:
                raise friendly from None
            raise
        finally:
            worker_output.end_run()
            worker_output.echo_progress = echo
        rows = report.settle_trials(sweep_dir, grid, trial_events, metric, mode, tune_cfg.scheduler)
        report.write_tables(sweep_dir, rows, metric, trial_events.lineage if tune_cfg.scheduler == "pbt" else None)
        unfinished = [row for row in rows if row.status in ("running", "pending", "interrupted")]
        if unfinished:
            raise KeyboardInterrupt
        best = report.best(rows, mode)
        if best is None:
            first_error = next((row.error for row in rows if row.error), "no trial completed")
            raise RaydraError(f"no trial of the sweep completed; the first error: {first_error}")
        chosen = report.write_best(cfg, sweep_dir, best, metric, config_dir)
        counts = TrialCounts(**{status: sum(row.status == status for row in rows) for status in ("completed", "stopped", "failed")})
        spent = report.ledger(rows, slots=concurrency * cfg.scale.num_workers, wall_s=report.sweep_wall(record, rows), best=best.trial)
        record = record.completed(started, chosen, counts, spent)
    best, trials = record.best, record.trials
    log.info(
        f"sweep done in {record.wall_time_s:.1f} s: {trials.completed} completed, "
        f"{trials.stopped} stopped early, {trials.failed} failed\n"
        f"  best trial {best.trial}  {metric} {best.metric:.4f}  {report.fmt_sampled(best.sampled)}\n"
        + (f"  compute  {report.ledger_sentence(record.ledger)}\n" if record.ledger else "")
        + f"  trials  {sweep_dir / layout.TRIALS_MD}\n"
        f"  rerun   python train.py --config-path {sweep_dir} --config-name best_config"
    )
    return record


def _continue(cfg: DictConfig, fresh_dir: Path) -> Tuple[Path, SweepRecord]:
    """The sweep tune.resume names, checked to be an unfinished raydra sweep of the same config."""
    sweep_dir = Path(cfg.tune.resume).expanduser().resolve()
    if not (sweep_dir / layout.SWEEP).is_file() or not (sweep_dir / layout.TUNE).is_dir():
        raise RaydraError(
            f"tune.resume={cfg.tune.resume}: {sweep_dir} is not a raydra sweep directory (no sweep.json and tune/); "
            "pass the directory a tune= run printed."
        )
    previous = sweep_record.read(sweep_dir)
    if previous.status == Status.COMPLETED:
        raise RaydraError(f"tune.resume={cfg.tune.resume}: {sweep_dir} already completed; start a new sweep instead.")
    old = yaml.safe_load((sweep_dir / layout.CONFIG).read_text())
    changes = [c for c in changed_keys(old, cfg) if not c.startswith(RESUMABLE_CHANGES)]
    if changes:
        raise RaydraError(
            f"tune.resume={cfg.tune.resume}: the config differs from the one the sweep started with "
            f"({'; '.join(changes)}); resume with the original overrides plus tune.resume=..."
        )
    record = previous.resumed_from_here(log=str(fresh_dir / layout.DRIVER_LOG))
    # The invocation's own Hydra directory points at the sweep it continued, so it never reads as a sweep of its own.
    sweep_record.write(fresh_dir, SweepRecord.continued_in(str(sweep_dir)))
    log.info(f"resuming sweep {sweep_dir} (this invocation's driver.log: {fresh_dir})")
    return sweep_dir, record


def _concurrency(cfg: DictConfig) -> int:
    fits = trials_that_fit(OmegaConf.to_object(cfg.scale))
    asked = cfg.tune.max_concurrent
    if asked is not None and asked > fits:
        log.info(f"tune.max_concurrent={asked} but the cluster holds {fits} trial(s) side by side; running {fits} at a time")
    return min(asked or fits, fits)


def _tuner(
    cfg: DictConfig,
    sweep_dir: Path,
    sweep_storage: Optional[str],
    record: SweepRecord,
    concurrency: int,
    trial_events: "TrialEvents",
    mutations: List[str],
) -> Any:
    tune = ray.tune
    filesystem, tune_root = storage.filesystem(sweep_storage or str(sweep_dir))

    # Tune saves its experiment state every few seconds rather than on its adaptive period, so a
    # sweep killed outright loses at most that much of its record of finished trials.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")
    if not cfg.verbose:
        # Tune's newer console output prints its banner and paths even at verbose=0; TrialEvents
        # prints what a researcher needs.
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    sweep = {
        "dir": str(sweep_dir),
        "storage": sweep_storage,
        "id": record.id,
        "overrides": [o for o in record.overrides if not o.startswith("tune.resume=")],
        # tune.scheduler=pbt: the keys PBT perturbs (raydra.sweep.pbt).
        "mutations": mutations,
    }
    trial_events.mutations = mutations
    trainable = tune.with_resources(tune.with_parameters(run_trial, base=_trial_base(cfg, record.id), sweep=sweep), {"CPU": TRIAL_CPU})
    if cfg.tune.resume:
        tuner = tune.Tuner.restore(
            posixpath.join(tune_root, layout.TUNE),
            trainable,
            resume_unfinished=True,
            resume_errored=False,
            restart_errored=False,
            storage_filesystem=filesystem,
        )
        # The restored RunConfig holds the interrupted driver's callback, unpickled; this process
        # needs its own to see the trials. Tuner.restore takes no callbacks of its own.
        replace_restored_tuner_callbacks(tuner, [trial_events])
        # Tuner.restore brings back the scheduler as it was created, with no rungs: trials run
        # after a resume would be compared only with each other. TrialEvents saved ASHA's rungs (PBT
        # keeps no state Ray can save: it starts again from the trials' next reports).
        trial_events.scheduler = restored_tuner_scheduler(tuner) if cfg.tune.scheduler == "asha" else None
        if trial_events.scheduler is not None and trial_events.scheduler_state.is_file():
            restore_scheduler_rungs(trial_events.scheduler, str(trial_events.scheduler_state))
        return tuner
    space = {key: domain(key, name, args) for key, (name, args) in parse_space(cfg).items()}
    metric, mode = record.metric, record.mode
    scheduler = _scheduler(cfg)
    # The scheduler whose state TrialEvents saves after each result: ASHA's rungs.
    trial_events.scheduler = scheduler if cfg.tune.scheduler == "asha" else None
    return tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            metric=metric,
            mode=mode,
            num_samples=cfg.tune.num_samples,
            search_alg=_search(cfg, concurrency),
            scheduler=scheduler,
            # Random search limits itself (above); Tune wraps Optuna in a ConcurrencyLimiter.
            max_concurrent_trials=concurrency if cfg.tune.search == "optuna" else None,
            # A stopped trial's process must end: reused, its training thread would run on.
            reuse_actors=False,
        ),
        run_config=tune.RunConfig(
            name=layout.TUNE,
            storage_path=tune_root,
            storage_filesystem=filesystem,
            verbose=1 if cfg.verbose else 0,
            callbacks=[trial_events],
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
    if cfg.tune.scheduler == "pbt":
        return pbt.scheduler(cfg, parse_mutations(cfg))
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
    base = writable(cfg)
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


def _stop_as_ctrl_c() -> bool:
    """SLURM's time-limit notice to a sweep: Tune ends its trials and saves its state, as on Ctrl-C.
    The job is not requeued: tune.resume=<sweep dir> continues the sweep."""
    os.kill(os.getpid(), signal.SIGINT)
    return False


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
