"""The Lightning Trainer a worker fits with (raydra.worker.loop builds it between the model and the fit):
raydra's callbacks in the order their records need, the user's after them, rank 0's loggers, the
strategy, and the trainer group's settings as they are."""

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import ray.train.torch
import torch
from ray.train.lightning import RayLightningEnvironment

from raydra import storage
from raydra.config.schema import lightning_trainer_arguments
from raydra.config.spec import RunSpec
from raydra.errors import RaydraError
from raydra.lightning import pl
from raydra.records.checkpoints import checkpoint_meta
from raydra.records.layout import checkpoints_location
from raydra.records.sync import WorkerMirror
from raydra.worker.callbacks import build_callbacks
from raydra.worker.checkpoint_report import LocalCheckpoints, TimedReport
from raydra.worker.console_progress import ConsoleProgress
from raydra.worker.contract import Contract
from raydra.worker.hyperparameters import PlainHyperparameters
from raydra.worker.loggers import build_loggers
from raydra.worker.preemption import PreemptionNotice
from raydra.worker.resumable import Resumable
from raydra.worker.strategies import build_strategy, check_ray_environment
from raydra.worker.tensorboard import HpMetric, ModelGraph
from raydra.worker.throughput import Throughput, peak_flops
from raydra.worker.watchdog import Heartbeat


@dataclass(frozen=True)
class Fitting:
    """The trainer, and what the phases after the fit read from its callbacks: the figures the
    outcome reports, where a resumed run resumed, and which of the user's callbacks stopped it early."""

    trainer: Any
    throughput: Throughput
    report: TimedReport
    resumable: Resumable
    # Local mode: the run's checkpoints kept on this machine (Ray Train keeps none in the driver's process).
    kept: Optional[LocalCheckpoints]
    user_callbacks: List[Tuple[str, Any]]


def build_trainer(
    spec: RunSpec,
    *,
    rank: int,
    world_size: int,
    mirror: WorkerMirror,
    restored: Optional[str],
    heartbeat: Optional[Heartbeat],
    model_config: Dict[str, Any],
    shard_blocks: Optional[List[str]],
) -> Fitting:
    """`restored`: the checkpoint this attempt resumes from; `model_config`: the model node the module
    was built from (its checkpoints' hyperparameters); `shard_blocks`: strategy=fsdp's, from that node."""
    scale, trainer_cfg, local = spec.scale, spec.trainer, spec.local
    device = ray.train.torch.get_device()
    _check_precision(device, str(trainer_cfg.precision))
    throughput = Throughput(world_size=world_size, peak_flops=peak_flops(device, str(trainer_cfg.precision)))
    # Throughput logs its epoch figures in on_train_epoch_end, so it must run before Ray's report.
    ckpt = spec.checkpoint
    kept = (
        LocalCheckpoints(Path(storage.join(checkpoints_location(spec.place), spec.place.id)), ckpt.num_to_keep, ckpt.monitor, ckpt.mode)
        if local
        else None
    )
    report = TimedReport(
        every_n_epochs=ckpt.every_n_epochs,
        every_n_steps=ckpt.every_n_steps,
        monitor=ckpt.monitor,
        mode=ckpt.mode,
        background_upload=ckpt.upload == "background",
        after_report=mirror.push,
        local=kept,
        saving=heartbeat.progress.saving if heartbeat else None,
    )
    # The world size is Ray's, at run time: an elastic group ([min, max]) restarts on another size.
    resumable = Resumable(world_size=world_size, elastic=scale.elastic)
    # The contract first: its sentence must come before a callback that trips over the same thing.
    # HpMetric before the report: an epoch's checkpoint keeps the best that epoch logged.
    callbacks = [
        Contract(monitor=ckpt.monitor),
        throughput,
        resumable,
        HpMetric(ckpt.monitor, ckpt.mode),
        report,
        PlainHyperparameters(model_config, spec.data),
        ModelGraph(),
    ]
    if heartbeat:
        # First: its marks come before any other callback's hook can block (and its per-rank step
        # times are logged before the epoch's report).
        callbacks.insert(0, heartbeat)
    if rank == 0:
        callbacks.append(
            ConsoleProgress(
                max_steps=trainer_cfg.max_steps,
                world_size=world_size,
                # Local mode is the driver's own process: its log shows the lines as they are.
                emit=logging.getLogger("raydra").info if local else None,
            )
        )
    if not local and spec.failure.preemption_notice:
        # Last of raydra's: it checkpoints through `report` after Resumable has counted the batch.
        callbacks.append(PreemptionNotice(report, rank))
    # The user's, after raydra's own (whose checks and records come first).
    user_callbacks = build_callbacks(spec.callbacks, rank)
    callbacks += [callback for _, callback in user_callbacks]
    if heartbeat:
        callbacks.append(heartbeat.tail())
    trainer = pl.Trainer(
        accelerator="gpu" if scale.use_gpu else "cpu",
        # Local mode: one device in this process, Lightning's own single-device strategy.
        devices=1 if local else "auto",
        strategy="auto" if local else build_strategy(spec.strategy, shard_blocks),
        plugins=[] if local else [RayLightningEnvironment()],
        callbacks=callbacks,
        logger=build_loggers(spec, rank, resumed_from=_position_of(restored)) or False,
        # Ray owns checkpointing: TimedReport saves and reports at checkpoint.every_n_epochs/every_n_steps.
        enable_checkpointing=False,
        # Each logger has the run's config as its hyperparameters (build_loggers); Lightning's own
        # would add the module's and data module's save_hyperparameters() flat beside it.
        enable_autolog_hparams=False,
        enable_progress_bar=False,
        enable_model_summary=spec.verbose,
        default_root_dir=str(Path(spec.place.dir)),
        # max_epochs, precision, gradient_clip_val, ...: the trainer group as it is (TrainerConfig).
        **lightning_trainer_arguments(dataclasses.asdict(trainer_cfg)),
    )
    if not local:
        trainer = check_ray_environment(trainer)
    return Fitting(trainer, throughput, report, resumable, kept, user_callbacks)


def _position_of(checkpoint_path: Optional[str]) -> Optional[Dict[str, Any]]:
    """Where a restored checkpoint stands (epoch, global step, whether mid-epoch); metrics.csv rows
    after it are about to be logged again."""
    if checkpoint_path is None:
        return None
    # The run's own checkpoint (resume= of a run from elsewhere was let through by name on the driver).
    meta = checkpoint_meta(checkpoint_path, trusted=True)
    data = meta.get("callbacks", {}).get("Resumable", {}).get("data", {})
    return {"epoch": int(meta["epoch"]), "global_step": int(meta["global_step"]), "mid_epoch": bool(data.get("mid_epoch"))}


def _check_precision(device: torch.device, precision: str) -> None:
    """bf16 needs an Ampere-or-newer GPU; only the worker can see which GPU it got."""
    if device.type == "cuda" and precision.startswith("bf16") and not torch.cuda.is_bf16_supported():
        raise RaydraError(
            f"trainer.precision={precision} needs a GPU with bf16 support (Ampere or newer), but this worker has a "
            f"{torch.cuda.get_device_name(device)}; use trainer.precision=16-mixed."
        )
