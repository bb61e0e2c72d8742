"""The fit core: one run's spec in (raydra.run.resolve), one trained run directory and its record out.

    fit_and_record(spec, record)   TorchTrainer(worker.train_loop) -> summary.json's outcome

Every run goes through here: a single run (raydra.run.driver), a Tune trial (raydra.sweep.trial) and,
through the driver, each job of a Hydra multirun. Nothing here reads Hydra's global state, exits
the process or installs signal handlers: errors are raised for the caller to record, so any entry
can call it as a library.
"""

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, cast

from raydra import storage
from raydra.cluster.ray_cluster import has_no_autoscaler, worker_resources
from raydra.config.project import builds_only_known_classes, targets
from raydra.config.spec import RunSpec, WorkerOutcome
from raydra.errors import storage_failure, user_error
from raydra.private_apis.ray import worker_setup_hook_env
from raydra.private_apis.ray_train import (
    elastic_reacts_quickly,
    poll_workers_often,
    torch_config,
    torch_trainer_class,
    worker_groups_start_within,
)
from raydra.private_apis.torch import FLIGHT_RECORDER_ENTRIES, FLIGHT_RECORDER_ENV
from raydra.records import hf_export, layout, sync
from raydra.records.checkpoints import last_checkpoint
from raydra.records.ledger import Ledger
from raydra.records.summary import RunRecord
from raydra.run import recording, startup
from raydra.run.hang_watch import RunHung, Watching
from raydra.worker import preload

log = logging.getLogger("raydra")

# How often Ray Train's controller takes the workers' reports (Ray's default, 2 s, paces short epochs).
CONTROLLER_POLL_S = 0.5
# How long Ray Train waits for a worker group to start before that start fails (Ray's default: 60 s),
# by the kind of run; a value set in RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S wins over both.
# An elastic group that cannot be placed is given up after 15 s and sized again from the nodes alive
# then (60 s is what a run that lost a node waited, twice: private_apis); Ray marks a lost node dead
# after about 15 s of failed health checks.
ELASTIC_START_TIMEOUT_S = 15.0
# Set on the exception that ended a fit: the run's compute ledger up to then (ledger_of).
LEDGER_ATTRIBUTE = "raydra_ledger"
# A sweep starts only as many trials as the cluster holds, so a trial's group that does not start is
# slow (a loaded node, a stopped trial's workers still leaving), not starved: 60 s failed trials on
# a busy 2-CPU machine. 300 s: still an error, never a hang.
TRIAL_START_TIMEOUT_S = 300.0


def fit_and_record(
    spec: RunSpec,
    record: RunRecord,
    started: float,
    *,
    tune_trial: bool = False,
    callbacks: Sequence[Any] = (),
    marks: Optional[Dict[str, float]] = None,
    process_ends_with_run: bool = False,
) -> RunRecord:
    """Fit the run `spec` describes into its place's directory and record the outcome in its
    summary.json (`record`: the run's record as summary.record_start wrote it); returns the completed
    record. The one fit behind a single run, a Hydra multirun job and a Tune trial; errors propagate
    for the caller to record.

    `tune_trial`: the fit runs inside a Tune trial (its workers leave the trial's own CPU share free,
    and a group that cannot be placed fails instead of waiting). `callbacks`: Ray Train UserCallbacks
    for the TorchTrainer, such as the sweep's report to Tune. `marks`: the caller's start-up marks
    (raydra.run.startup), completed here and by rank 0 into summary.json's `startup`.
    `process_ends_with_run`: this process exits once this fit is over (a `python train.py` run, a
    multirun launcher's job), so Ray removes the run's placement groups as the process's Ray job
    ends, whatever becomes of the run's controller, and Ray Train's cleaner for them is not started.
    """
    marks = dict(marks or {})
    spec, datasets = _before_workers(spec)
    # The hang watchdog's meeting point, for this fit's workers (every attempt's).
    watching = Watching(spec.failure, Path(spec.place.dir), spec.local, spec.place.id) if spec.failure.watchdog else None
    try:
        # With paths.storage, the workers' files reach this run directory while the run goes on (a
        # trial's process needs no copy: the sweep's driver follows the trial's storage itself).
        with contextlib.nullcontext() if tune_trial else sync.Follower(spec.place):
            result = _fit(spec, datasets, tune_trial, list(callbacks), marks, process_ends_with_run, watching)
    except (Exception, KeyboardInterrupt) as error:
        findings = watching.close() if watching else None
        spent = recording.ledger(spec, record, marks, findings)
        if findings and findings.ended_by_hang:
            # The workers' end was the watchdog's doing: the run hung (in local mode, the watchdog
            # interrupted this process's training).
            raise RunHung(findings, spent) from error
        # A run that failed or was interrupted cost its workers too: its caller records it (ledger_of).
        with contextlib.suppress(AttributeError):  # an exception type that takes no attributes
            setattr(error, LEDGER_ATTRIBUTE, spent)
        raise
    findings = watching.close() if watching else None
    worker = result.return_value or WorkerOutcome()
    marks.update(worker.startup_marks)
    completed = record.completed(
        started,
        # With the rows per split the driver counted (data.loader=ray_data).
        data=recording.data_record(spec),
        startup=startup.phases(marks),
        **(findings.record_fields() if findings else {}),
        **recording.outcome(result, worker, spec),
        ledger=recording.ledger(spec, record, marks, findings),
    )
    best = completed.checkpoint("best", spec.place.storage or spec.place.dir)
    if worker.hf_export is not None and best:
        # Before the record says completed: a completed run has its export.
        hf_export.write(worker.hf_export, best, Path(spec.place.dir), spec.place.storage)
    recording.save(spec.place, completed)
    return completed


def ledger_of(error: BaseException) -> Optional[Ledger]:
    """The compute ledger of the fit `error` ended (fit_and_record sets it), if any."""
    return getattr(error, LEDGER_ATTRIBUTE, None)


def _before_workers(spec: RunSpec) -> Tuple[RunSpec, Optional[Dict[str, Any]]]:
    """What the driver learns before the workers start, in a new spec: local mode's checkpoint to
    continue from, and under data.loader=ray_data the datasets and their row counts."""
    datasets = None
    if spec.local:
        # Local mode: Ray Train hands the training function no checkpoint to resume from; the
        # run's own last one (resume=) is named here, where the run's record is.
        spec = spec.with_place(restore=last_checkpoint(Path(spec.place.dir), spec.place.id, spec.place.storage))
        if not spec.verbose:
            # Its notice that local mode runs in this process: the driver has said so already.
            logging.getLogger("ray.train").setLevel(logging.WARNING)
    if spec.loader == "ray_data":
        from raydra.data.ray_data import build

        # Built here, once, so preprocessing runs as Ray Data tasks beside the workers; each
        # worker only learns the row counts, which size its batches.
        datasets, rows = build(spec.data, spec.verbose)
        spec = spec.with_place(data_rows=rows)
    return spec, datasets


def _fit(
    spec: RunSpec,
    datasets: Any,
    tune_trial: bool,
    callbacks: List[Any],
    marks: Dict[str, float],
    process_ends_with_run: bool,
    watching: Optional[Watching],
) -> Any:
    import ray.train

    from raydra.worker import train_loop

    scale, ckpt = spec.scale, spec.checkpoint
    poll_workers_often(CONTROLLER_POLL_S)
    # Ray reads and writes its storage through this filesystem: a URI's options (endpoint,
    # scheme) are parsed once here, not by each of Ray's processes.
    filesystem, storage_path = storage.filesystem(layout.checkpoints_location(spec.place))
    failure: Dict[str, Any] = {"max_failures": spec.failure.max_failures}
    if tune_trial:
        # A trial whose workers cannot be placed must fail, not wait: by default Ray restarts
        # the controller of a worker group that timed out starting, without end.
        failure["controller_failure_limit"] = 0
    trainer = torch_trainer_class(placement_group_cleaner=not process_ends_with_run, autoscaling_requests=not has_no_autoscaler())(
        train_loop,
        # A dict, as Ray hands it to the training function; the spec inside pickles whole.
        train_loop_config={"spec": spec, "watch": watching.link if watching else None},
        datasets=datasets,
        # The process group's backend and timeout are Ray's to set, not Lightning's; every strategy's
        # schema carries both (schema.ProcessGroupConfig, where their defaults live). Its rendezvous
        # store listens on rank 0's node's address alone (Ray's own, on every interface).
        torch_config=torch_config(backend=spec.strategy.backend, timeout_s=spec.strategy.timeout_s),
        scaling_config=ray.train.ScalingConfig(
            # Ray takes [min, max] as a tuple of ints; it starts once min fit and grows to max.
            num_workers=(scale.min_workers, scale.max_workers) if scale.elastic else scale.num_workers,
            elastic_resize_monitor_interval_s=scale.resize_check_s,
            use_gpu=scale.use_gpu,
            resources_per_worker=worker_resources(scale, tune_trial=tune_trial),
            placement_strategy=scale.placement_strategy,
        ),
        run_config=ray.train.RunConfig(
            # A unique name under the run's own directory: Train V2 resumes any run whose
            # name and storage path it has seen before, which is what resume= relies on.
            name=spec.place.id,
            storage_path=storage_path,
            storage_filesystem=filesystem,
            failure_config=ray.train.FailureConfig(**failure),
            callbacks=callbacks,
            worker_runtime_env=_worker_runtime_env(spec),
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=ckpt.num_to_keep,
                checkpoint_score_attribute=ckpt.monitor,
                # min or max, as config.checks holds it (OmegaConf's schemas cannot say Literal).
                checkpoint_score_order=cast(Literal["max", "min"], ckpt.mode),
            ),
        ),
    )
    marks["fit_started"] = time.time()
    # Elastic groups never run in a trial (validate refuses it), so at most one of the two applies.
    if scale.elastic:
        starting = elastic_reacts_quickly(ELASTIC_START_TIMEOUT_S)
    else:
        starting = worker_groups_start_within(TRIAL_START_TIMEOUT_S) if tune_trial else contextlib.nullcontext()
    try:
        with starting:
            result = trainer.fit()
    except SystemExit:
        if spec.local:
            raise
        # Ray Train's fit answers Ctrl-C with a handler of its own (it replaces the process's SIGINT
        # handler for the fit): it aborts the controller and ends the process with sys.exit(0), which
        # left summary.json "running" and said nothing. The run was interrupted, as on SIGTERM.
        raise KeyboardInterrupt from None
    except Exception as error:
        friendly = user_error(error) or storage_failure(spec.place.storage and spec.paths.storage, error)
        if friendly:
            raise friendly from None  # its one sentence, without Ray's worker-failure trace
        raise
    if result.error:
        raise user_error(result.error) or result.error
    return result


def _worker_runtime_env(spec: RunSpec) -> Dict[str, Any]:
    """Ray Train's workers start importing the training code as their processes start, while Ray
    Train still sets up the group (raydra.worker.preload): the model's and data's classes too.
    A setup hook of the user's own (ray.runtime_env.worker_process_setup_hook) keeps its place."""
    if (spec.ray.runtime_env or {}).get("worker_process_setup_hook"):
        return {}
    # The model's and data's classes and what they are built with (an optimizer, a learning-rate
    # schedule): found as Hydra's instantiate will find them, so set-up imports nothing more.
    objects = ["raydra.worker.loop", *targets(spec.model), *targets(spec.data)]
    env = {preload.OBJECTS_ENV: ",".join(dict.fromkeys(objects)), **worker_setup_hook_env("raydra.worker.preload.start")}
    if spec.failure.watchdog and FLIGHT_RECORDER_ENV not in os.environ:
        # What each worker's collectives were doing, kept with its stacks when a hang is found.
        env[FLIGHT_RECORDER_ENV] = str(FLIGHT_RECORDER_ENTRIES)
    if builds_only_known_classes(spec.model, spec.data, spec.callbacks, spec.logger):
        # Nothing of the user's runs there, so nothing asks for torchmetrics' optional integrations.
        env[preload.LEAN_ENV] = "1"
    return {"env_vars": env}
