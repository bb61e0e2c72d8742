"""What every Ray Train worker runs: rebuild the run from its spec and fit it with Lightning.

The driver hands over the run's spec (raydra.config.spec.RunSpec), already resolved (Hydra's resolvers do
not exist here). Rank 0's WorkerOutcome reaches the driver as `Result.return_value`; that is how
test metrics, throughput and memory figures get into summary.json.
"""

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

import pyarrow.fs
import ray.train
import torch
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

import raydra.worker
from raydra.cluster.worker_output import PROGRESS_MARK
from raydra.config import arguments
from raydra.config.spec import RunSpec, WorkerOutcome
from raydra.errors import WORKER_RANK, RaydraError
from raydra.lightning import pl
from raydra.records.envelope import COMPLETED, FAILED, INTERRUPTED
from raydra.records.hf_export import HFExport
from raydra.records.layout import CHECKPOINT_FILE, METRICS, worker_log
from raydra.records.sync import WorkerMirror
from raydra.records.wandb_run import EXIT_CODES, copy_segments, finish_in_process
from raydra.worker.callbacks import stop_record
from raydra.worker.contract import check_importable
from raydra.worker.log_routing import route_logs
from raydra.worker.throughput import model_state_bytes, peak_memory_bytes
from raydra.worker.trainer import Fitting, build_trainer
from raydra.worker.watchdog import Heartbeat, Progress, Watchdog

# The end of the imports above (raydra.run.startup's phases; their start is raydra.worker.IMPORTS_STARTED).
IMPORTED = time.time()


def train_loop(config: Dict[str, Any]) -> WorkerOutcome:
    """`config`: {"spec": the run's RunSpec, "watch": the hang watchdog's WatchLink or None}, as
    Ray hands the TorchTrainer's train_loop_config."""
    entered = time.time()
    spec: RunSpec = config["spec"]
    context = ray.train.get_context()
    rank = context.get_world_rank()
    # Watched from here: start-up's deadline counts from this worker's start.
    progress = Progress(spec.failure)
    link = config.get("watch")
    watchdog = Watchdog(progress, link, rank, context.get_world_size(), local=spec.local, run_id=spec.place.id).start() if link else None
    # With paths.storage, this worker's part of the record (its log; rank 0's metrics.csv, samples,
    # W&B files) is written on its own node and pushed to storage at every report and at the end,
    # whatever happens: a failed run's worker logs are what explains it.
    mirror = WorkerMirror(spec.place, rank)
    record = spec.paths.output_dir or spec.place.dir
    if str(mirror.dir) != record:
        # ${paths.output_dir} (a logger's save_dir, a callback's path) means the run's record as this
        # worker writes it: the scratch directory that is pushed to storage.
        spec = dataclasses.replace(_moved(spec, record, str(mirror.dir)), place=spec.place)
    spec = spec.with_place(dir=str(mirror.dir))
    if rank == 0:
        mirror.restore([METRICS])
        if spec.place.storage and (spec.logger or {}).get("wandb"):
            # What the run's earlier W&B segments hold, for the one this attempt starts (raydra.records.wandb_run).
            copy_segments(spec.place.storage, mirror.dir)
    log_file = mirror.dir / worker_log(rank)
    unroute = route_logs(log_file, verbose=spec.verbose, local=spec.local)
    try:
        with contextlib.ExitStack() as stack:
            # Local mode: Ray Train hands no checkpoint back; the driver names the run's last one. Under
            # Ray, Ray Train's own checkpoint of this run comes first (a restarted worker group), then
            # the one the driver named (a PBT trial continuing another trial's checkpoint).
            fetching = time.time()
            if spec.local:
                restored = spec.place.restore
            else:
                restored = _restored_checkpoint_path(stack, spec.place.id, rank) or _named_checkpoint(stack, spec.place.restore)
            if restored:
                # The compute ledger's restore: the download here, the load in Heartbeat.on_load_checkpoint.
                progress.spent.restore_s += time.time() - fetching
            outcome = _train(spec, mirror, restored, Heartbeat(progress, link, context.get_world_size()) if link else None)
            outcome.startup_marks["train_entered"] = entered
            return outcome
    except KeyboardInterrupt:
        # Local mode: Ctrl-C or SIGTERM in the driver's own process. What W&B was given is flushed.
        finish_in_process(EXIT_CODES[INTERRUPTED], INTERRUPTED)
        raise
    except Exception as error:
        # What W&B was given is flushed, and the run says failed there until a restarted group or
        # the driver says otherwise (raydra.records.wandb_run).
        finish_in_process(EXIT_CODES[FAILED], FAILED)
        # The driver gets the exception's last line (errors.one_line), which points here for the rest.
        with open(log_file, "a") as file:
            file.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}][raydra][ERROR] worker {rank} failed:\n")
            file.write("".join(traceback.format_exception(type(error), error, error.__traceback__)))
        with contextlib.suppress(AttributeError):  # an exception type that takes no attributes
            setattr(error, WORKER_RANK, rank)
        raise
    finally:
        if watchdog:
            watchdog.stop()
        mirror.close()
        unroute()


def _moved(node: Any, old: str, new: str) -> Any:
    """`node` with every path below the directory `old` (in a string, such as sqlite:////<old>/x.db) below `new` instead."""
    if dataclasses.is_dataclass(node):
        return dataclasses.replace(node, **{f.name: _moved(getattr(node, f.name), old, new) for f in dataclasses.fields(node) if f.init})
    if isinstance(node, dict):
        return {key: _moved(value, old, new) for key, value in node.items()}
    if isinstance(node, list):
        return [_moved(value, old, new) for value in node]
    if isinstance(node, str):
        return re.sub(re.escape(old) + r"(?=/|$)", lambda _: new, node)
    return node


def _train(spec: RunSpec, mirror: WorkerMirror, restored: Optional[str], heartbeat: Optional[Heartbeat] = None) -> WorkerOutcome:
    """This worker's part of one attempt of the run, phase by phase; `restored`: the Lightning
    checkpoint it resumes from (None: it starts afresh). The arguments are checked before anything
    is built, and the trainer built after the model, whose node its callbacks record; `built` ends
    start-up in summary.json's phases (raydra.run.startup)."""
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    _set_up_process(spec)
    _check_arguments(spec)
    datamodule = _build_data(spec, world_size)
    model, model_config, shard_blocks = _build_model(spec, restored)
    fitting = build_trainer(
        spec,
        rank=rank,
        world_size=world_size,
        mirror=mirror,
        restored=restored,
        heartbeat=heartbeat,
        model_config=model_config,
        shard_blocks=shard_blocks,
    )
    built = time.time()
    stopped_early = _fit(fitting, model, datamodule, restored)
    test_metrics, test_skipped = _test(fitting.trainer, model, datamodule, spec, rank)
    _finish_loggers(fitting.trainer)
    return _outcome(spec, fitting, model, rank, world_size, (test_metrics, test_skipped), stopped_early, built)


def _set_up_process(spec: RunSpec) -> None:
    """The process's torch settings and seeds, before anything is built: the model's initial weights
    and the data's shuffling come from the seed."""
    # Each worker gets its CPU share; torch's default (all cores) makes N workers fight over them.
    torch.set_num_threads(max(1, int(spec.scale.cpus_per_worker)))
    if spec.trainer.tf32 and spec.scale.use_gpu:
        torch.set_float32_matmul_precision("high")
    pl.seed_everything(spec.seed, workers=True, verbose=False)


def _check_arguments(spec: RunSpec) -> None:
    """raydra's own model and data classes are not imported on the driver of a Ray run (Lightning
    there delayed its first step by seconds): their arguments are checked here, said in one
    sentence before either is built, rather than as a TypeError from inside it."""
    if not spec.local:
        arguments.check(OmegaConf.create({"model": spec.model, "data": spec.data}), raydras_own=True)


def _build_data(spec: RunSpec, world_size: int) -> Any:
    """The data module: this worker's shard of the rows the driver prepared (data.loader=ray_data),
    else the data node as Hydra builds it."""
    if spec.loader == "ray_data":
        from raydra.data.ray_data import RayDataModule

        return RayDataModule(spec.place.data_rows, spec.data["batch_size"], world_size, spec.seed)
    check_importable(spec.data, "data")
    return instantiate(spec.data)


def _build_model(spec: RunSpec, restored: Optional[str]) -> Tuple[Any, Dict[str, Any], Optional[List[str]]]:
    """The LightningModule, started from ckpt_path='s weights and compiled where the run asks; with the
    model node it was built from (what its checkpoints keep as hyperparameters) and strategy=fsdp's
    shard_blocks, which that node holds for raydra."""
    model_config = dict(spec.model)
    # Read by strategy=fsdp; the module's constructor does not take it.
    shard_blocks = model_config.pop("shard_blocks", None)
    # As Hydra builds it (lightning-hydra-template's convention): nested `_target_` nodes arrive built
    # (a `net` as its nn.Module), `_partial_` ones as partials, unless the model's own node says
    # otherwise (`_recursive_: false` for plain config, `_convert_`). PlainHyperparameters keeps the
    # checkpoints plain data all the same.
    check_importable(model_config, "model")
    model = instantiate(model_config)
    if spec.place.init_weights and restored is None:
        _start_from(model, spec)
    if spec.trainer.compile:
        compile_networks(model)
    return model, model_config, shard_blocks


def _fit(fitting: Fitting, model: Any, datamodule: Any, restored: Optional[str]) -> Optional[Dict[str, Any]]:
    """Lightning's fit, from `restored` if any; returns summary.json's `stopped_early` (None: it was not)."""
    # After a worker death or resume=, Lightning restores weights, optimizer, scheduler, loop counters
    # and callback state (Resumable: RNG) from the last reported checkpoint. weights_only: a
    # checkpoint is plain tensors and containers, so loading it runs no pickled code.
    with _interrupts_reach_the_driver(fitting.trainer):
        fitting.trainer.fit(model, datamodule=datamodule, ckpt_path=restored, weights_only=True)
    stopped_early = stop_record(fitting.trainer, fitting.user_callbacks)
    if fitting.resumable.resumed_at:
        at = fitting.resumable.resumed_at
        logging.getLogger("raydra").info(
            f"resumed from {restored} at epoch {at['epoch']}, batch {at['batches']} of {at['of']} (global step {at['global_step']})"
        )
    return stopped_early


def _test(trainer: Any, model: Any, datamodule: Any, spec: RunSpec, rank: int) -> Tuple[Dict[str, float], Optional[str]]:
    """The test/* metrics once fit is done (run_test), a Ctrl-C meanwhile reaching the driver as one."""
    # Local mode logs on the driver's console itself; a Ray worker's rank 0 prints for it.
    with _interrupts_reach_the_driver(trainer):
        return run_test(trainer, model, datamodule, spec.trainer.test, rank if not spec.local else -1)


def _outcome(
    spec: RunSpec,
    fitting: Fitting,
    model: Any,
    rank: int,
    world_size: int,
    tested: Tuple[Dict[str, float], Optional[str]],
    stopped_early: Optional[Dict[str, Any]],
    built: float,
) -> WorkerOutcome:
    """What this worker tells the driver (rank 0's reaches it): the figures summary.json records."""
    trainer, throughput, report, kept = fitting.trainer, fitting.throughput, fitting.report, fitting.kept
    test_metrics, test_skipped = tested
    return WorkerOutcome(
        hf_export=_hf_export(model, spec) if rank == 0 else None,
        test_metrics=test_metrics,
        test_skipped=test_skipped,
        throughput=throughput.summary(),
        # Every worker's figure: sharding makes them differ, and the largest decides what fits.
        memory_per_worker=_gather(
            trainer,
            {
                "peak_bytes": peak_memory_bytes(trainer.strategy.root_device),
                "model_state_bytes": model_state_bytes(model, trainer.optimizers),
            },
        ),
        checkpoint_save_s=report.seconds,
        checkpoint_upload_s=report.upload_seconds,
        global_step=trainer.global_step,
        epochs_completed=trainer.current_epoch,
        stopped_early=stopped_early,
        world_size=world_size,
        resizes=fitting.resumable.resizes,
        local_record=kept.record() if kept else None,
        startup_marks={
            "worker_imports_started": raydra.worker.IMPORTS_STARTED,
            "worker_imported": IMPORTED,
            "built": built,
            "first_step": throughput.first_step_at,
        },
    )


def _hf_export(model: Any, spec: RunSpec) -> Optional[HFExport]:
    """What the run's Hugging Face export holds, from a module that exports (ViTClassifier.hf_export),
    told the class names and image processor by the data's class (image_inputs of raydra's own,
    from the data config: the same under data.loader=ray_data, whose worker holds no such module)."""
    describe = getattr(model, "hf_export", None)
    if describe is None:
        return None
    data_class = get_class(spec.data["_target_"])
    inputs = data_class.image_inputs(spec.data) if hasattr(data_class, "image_inputs") else None
    return describe(inputs)


@contextlib.contextmanager
def _interrupts_reach_the_driver(trainer: Any) -> Any:
    """Lightning answers a KeyboardInterrupt (Ctrl-C, or the driver's SIGTERM raised as one) with
    its own graceful stop, then ignores SIGINT and calls sys.exit(1). In local mode this is the
    driver's process, which must record the run as interrupted with its resume command: it gets
    its KeyboardInterrupt back, and Ctrl-C its usual meaning."""
    try:
        yield
    except SystemExit:
        if not trainer.interrupted:
            raise
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)
        raise KeyboardInterrupt from None


def _start_from(model: torch.nn.Module, spec: RunSpec) -> None:
    """ckpt_path: the weights of another run's checkpoint (found by the driver), before training starts."""
    from raydra.records.checkpoints import fetch, load_weights

    if type(model).configure_model is not pl.LightningModule.configure_model:
        raise RaydraError(
            f"ckpt_path={spec.ckpt_path}: {type(model).__name__} builds its layers in configure_model, once training has "
            "started, so there is nothing to load weights into before; start it from the weights its own keys name "
            "(model.pretrained), or continue its run with resume=."
        )
    found = spec.place.init_weights
    with tempfile.TemporaryDirectory(prefix="raydra-ckpt-path-") as scratch:
        load_weights(
            model,
            fetch(found, scratch),
            f"ckpt_path={spec.ckpt_path}",
            "point ckpt_path at a run (or checkpoint) of a model with these model.* settings",
        )
    logging.getLogger("raydra").info(f"started from the weights of {found}")


def compile_networks(model: torch.nn.Module) -> List[str]:
    """trainer.compile=true: torch.compile the LightningModule's forward, when it has its own, and
    in place each child with trainable weights. Returns what was compiled ("forward", child names).

    The forward is one graph, everything it calls included: compiled on its own, in place, an
    `nn.Sequential` (the ViT's conv stem) lands in code dynamo skips and ran eager. The forward is
    replaced on the instance, as Lightning's own `from_compiled` does, so `self(x)` and
    `self.forward(x)` both run it compiled. The children are for training steps that call a network
    directly (SD's UNet; SD has no forward); called from the compiled forward, they are traced
    into its graph. Compiling the whole LightningModule (`torch.compile(model)`) makes Lightning
    trace whole training steps, and dynamo fails on `self.log` inside them (torch 2.13: "'method'
    object has no attribute '__dict__'"). Neither way renames a parameter, so checkpoints load with
    or without compile. Frozen parts (an SD VAE and text encoder) stay eager: they would add
    compile time for forward-only work.
    """
    import torchmetrics

    compiled = []
    if type(model).forward is not pl.LightningModule.forward:
        model.forward = torch.compile(model.forward)
        compiled.append("forward")
    for name, child in model.named_children():
        if isinstance(child, torchmetrics.Metric) or not any(p.requires_grad for p in child.parameters()):
            continue
        child.compile()
        compiled.append(name)
    if not compiled:
        raise RaydraError(
            f"trainer.compile=true found no forward and no trainable submodule in {type(model).__name__} to compile; "
            "set trainer.compile=false."
        )
    return compiled


def _restored_checkpoint_path(stack: contextlib.ExitStack, run_id: str, rank: int) -> Optional[str]:
    """The Lightning checkpoint inside the Ray checkpoint this attempt resumes from, if any: in
    place on a local or shared disk; from object storage, downloaded into a directory of this
    worker's own, removed when `stack` closes. Not `Checkpoint.as_directory`: the node's workers
    share its directory, and one that comes to it after another's download has ended downloads
    again over the files the other is reading (CI, on S3: "PytorchStreamReader failed reading file").
    The directory is named after the run and rank, so the copy a killed attempt left behind (an
    elastic resize, a lost worker: no clean-up runs) is replaced by the next, not kept beside it."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        return os.path.join(checkpoint.path, CHECKPOINT_FILE)
    local = os.path.join(tempfile.gettempdir(), f"raydra-restore-{run_id}-rank{rank}")
    shutil.rmtree(local, ignore_errors=True)
    stack.callback(shutil.rmtree, local, ignore_errors=True)
    return os.path.join(checkpoint.to_directory(local), CHECKPOINT_FILE)


def _named_checkpoint(stack: contextlib.ExitStack, location: Optional[str]) -> Optional[str]:
    """The Lightning checkpoint the driver named, on this disk: in place, or downloaded from storage
    into a directory of this worker's own, removed when `stack` closes."""
    if location is None:
        return None
    from raydra.records.checkpoints import fetch

    scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="raydra-restore-"))
    return str(fetch(location, scratch))


def _gather(trainer: Any, figures: Dict[str, int]) -> List[Dict[str, int]]:
    """Every worker's `figures`, in rank order, on every worker."""
    if not torch.distributed.is_initialized():
        return [figures]
    gathered: List[Any] = [None] * trainer.world_size
    torch.distributed.all_gather_object(gathered, figures)
    return gathered


def run_test(trainer: Any, model: Any, datamodule: Any, enabled: bool, rank: int) -> Tuple[Dict[str, float], Optional[str]]:
    """The test/* metrics, and why there are none when the run tests nothing (None when it tested).
    Rank 0 prints the reason for the driver's console (-1: nobody prints, as in local mode).

    Data without a test split is not tested at all: no other split stands in for it, so nothing is
    ever reported as a test figure that is not one."""
    if not enabled:
        return {}, "trainer.test=false"
    if not _has_test_split(datamodule):
        reason = "the data has no test split"
        logging.getLogger("raydra").info(f"no test: {reason}")
        if rank == 0:
            print(f"{PROGRESS_MARK}no test: {reason}", flush=True)
        return {}, reason
    trainer.test(model, datamodule=datamodule, verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}, None


def _has_test_split(datamodule: Any) -> bool:
    """A test_dataloader of its own and, for a module that knows once set up (raydra's say so in
    has_test_split), a test split behind it."""
    if type(datamodule).test_dataloader is pl.LightningDataModule.test_dataloader:
        return False
    return bool(getattr(datamodule, "has_test_split", True))


def _finish_loggers(trainer: Any) -> None:
    # Close the W&B run here: a multirun or a Tune trial must not carry it into the next job.
    for logger in trainer.loggers:
        logger.finalize("success")
        if hasattr(logger, "end"):
            logger.end(exit_code=EXIT_CODES[COMPLETED], status=COMPLETED)
