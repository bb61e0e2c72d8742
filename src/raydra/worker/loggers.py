"""Lightning loggers for rank 0, built from the `logger` group: raydra's own (metrics.csv, W&B)
and any other Lightning logger by `_target_` (logger=tensorboard, logger=mlflow, the user's own).

W&B is imported only when a run asks for it, so `logger=csv` runs need no wandb install; the same
goes for any `_target_` logger's package. Every logger gets the run's config (secrets masked) as
its hyperparameters, once, as it is built, and W&B and MLflow the run's tags. Lightning's own
logging of hyperparameters as a fit starts is off (the worker's Trainer, enable_autolog_hparams):
it would add the module's and data module's `save_hyperparameters()` values flat at the top level,
beside the same values under `model.` and `data.` (a top-level `num_workers: 0` beside
`scale.num_workers: 2`). TensorBoard's directory and hp_metric: raydra.worker.tensorboard.
"""

import contextlib
import csv
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

from raydra.config.project import RAYDRA_LOGGERS
from raydra.config.spec import RunSpec
from raydra.errors import out_of_space
from raydra.private_apis.lightning import csv_columns, csv_pending, csv_saved, set_csv_columns
from raydra.records import metrics_csv
from raydra.records.layout import METRICS
from raydra.redact import redact
from raydra.storage import replacing


def build_loggers(spec: RunSpec, rank: int, resumed_from: Optional[Dict[str, Any]] = None) -> List[Any]:
    """`resumed_from`: where the checkpoint this attempt restarts from stands (raydra.worker.trainer._position_of), if anywhere."""
    # Only rank 0 writes: other ranks' metrics are the same after sync_dist, and a second writer
    # would fight over metrics.csv and start a second W&B run.
    if rank != 0:
        return []
    # Imported here, on the worker: the driver only needs wandb_mode, and Lightning (with torch)
    # would add seconds to every driver start.
    from raydra.lightning import pl

    run_dir = Path(spec.place.dir)
    settings = {name: value for name, value in (spec.logger or {}).items() if value is not None}
    loggers = []
    if "csv" in settings:
        # name="" and version="" put metrics.csv straight into the run directory.
        csv_logger = pl.loggers.CSVLogger(
            save_dir=str(run_dir), name="", version="", flush_logs_every_n_steps=settings["csv"].get("flush_logs_every_n_steps", 50)
        )
        _keep_rows_up_to(csv_logger, resumed_from)
        # Written to hparams.yaml in the run directory at once.
        csv_logger.log_hyperparams(_logged(spec))
        loggers.append(csv_logger)
    if "wandb" in settings:
        loggers.append(_wandb_logger(spec, settings["wandb"], run_dir))
    for name, node in settings.items():
        if name not in RAYDRA_LOGGERS:
            loggers.append(_logger_from_config(spec, name, node, resumed_from))
    return loggers


def _logger_from_config(spec: RunSpec, name: str, node: Dict[str, Any], resumed_from: Optional[Dict[str, Any]] = None) -> Any:
    """logger.<name>: hydra.utils.instantiate of its `_target_`, writing where its settings say (the
    presets: inside the run's record, through ${paths.output_dir} and ${paths.log_dir})."""
    from hydra.utils import get_class, instantiate

    from raydra.lightning import pl
    from raydra.worker.contract import check_importable
    from raydra.worker.tensorboard import arguments as tensorboard_arguments

    check_importable(node, f"logger.{name}")
    extra: Dict[str, Any] = {}
    if issubclass(get_class(node["_target_"]), pl.loggers.MLFlowLogger):
        if not spec.verbose:
            # MLflow sets up its own console handler as it is imported; its notices (creating the
            # store's tables) are not the run's news.
            os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
        # The run's tags as MLflow tags (a word each), and its id, which names its raydra record.
        extra["tags"] = {**(node.get("tags") or {}), **{str(tag): "" for tag in spec.tags or []}, "raydra.run_id": spec.place.id}
        if not node.get("run_name"):
            extra["run_name"] = spec.place.id
    tensorboard = issubclass(get_class(node["_target_"]), pl.loggers.TensorBoardLogger)
    if tensorboard:
        extra.update(tensorboard_arguments(node, spec.place.id, resumed_from))
    logger = instantiate(node, **extra)
    if tensorboard:
        # No metric: Lightning's placeholder hp_metric of -1 is not written; the run's first best
        # brings its hyperparameters to the HPARAMS view (HpMetric). Saved at once: the directory,
        # the purge of what an earlier attempt logged after its checkpoint, and hparams.yaml.
        logger.log_hyperparams(_logged(spec), metrics={})
        logger.save()
    else:
        logger.log_hyperparams(_logged(spec))
    return logger


def _keep_rows_up_to(csv_logger: Any, position: Optional[Dict[str, Any]]) -> None:
    """Lightning's CSV writer deletes an existing metrics.csv when it opens. A restarted or resumed
    run keeps the rows up to its checkpoint instead (through its epoch, or before its step for a
    mid-epoch checkpoint); later rows are trained again."""
    path = Path(csv_logger.log_dir) / METRICS
    rows, fields = [], None
    if position is not None and path.exists():
        # resume= refused a damaged file before taking the run over; a restart's copy (from storage) is read alike.
        fields, logged = metrics_csv.read(path)
        rows = [r for r in logged if _before(r, position)]
    # Opening the writer removes an existing metrics.csv: moved aside first, so that until the kept
    # rows are whole on disk (a full disk may refuse them) the old file is there to put back.
    aside = path.with_name(f".{METRICS}.before-restart")
    if rows:
        os.replace(path, aside)
    writer = csv_logger.experiment
    replace_csv_whole(writer)
    if rows:
        # The writer appends to an existing file only with the header it knows about.
        set_csv_columns(writer, sorted(fields))
        try:
            with replacing(path) as tmp, open(tmp, "w", newline="") as file:
                # A row with more values than the header names (seen once after a SIGTERM in local
                # mode: "dict contains fields not in fieldnames: None") keeps its named columns; the
                # unnamed values belong to no metric.
                kept = csv.DictWriter(file, fieldnames=sorted(fields), extrasaction="ignore")
                kept.writeheader()
                kept.writerows(rows)
        except OSError as error:
            os.replace(aside, path)
            full = out_of_space(error, path, METRICS)
            if full:
                raise full from None
            raise
        aside.unlink()


def _before(row: Dict[str, str], position: Dict[str, Any]) -> bool:
    if row.get("epoch") in (None, ""):
        return False
    epoch = int(float(row["epoch"]))
    if epoch != position["epoch"] or not position["mid_epoch"]:
        return epoch <= position["epoch"]
    # Lightning labels a step's row with the step count before it: a checkpoint taken after
    # global step s holds the rows labelled up to s - 1.
    return row.get("step") not in (None, "") and int(float(row["step"])) < position["global_step"]


def _wandb_logger(spec: RunSpec, settings: Dict[str, Any], run_dir: Path) -> Any:
    """This attempt's segment of the run's W&B run (raydra.worker.wandb_logger), with the config logged."""
    from raydra.records.wandb_run import RunSettings
    from raydra.worker.wandb_logger import segment_logger

    os.environ.setdefault("WANDB_SILENT", "true")
    logged = _logged(spec)
    run = RunSettings.of(settings, logged.get("tags") or [], logged, spec.checkpoint.monitor, spec.checkpoint.mode)
    logger = segment_logger(run, spec.place.id, run_dir)
    logger.log_hyperparams(logged)
    return logger


def _logged(spec: RunSpec) -> Dict[str, Any]:
    """The config as the driver masked it (Place.logged_config), with this process's own secrets masked too."""
    return redact(spec.place.logged_config)


def replace_csv_whole(writer: Any) -> None:
    """Make Lightning's CSV experiment writer replace metrics.csv whole at each save (written beside
    and renamed over) instead of appending to it, so a full disk or a kill mid-write leaves the
    previous complete file, never a truncated row. Each save copies the file once more; metrics.csv
    stays small (one row per logged step)."""

    def save() -> None:
        path, pending, before, new_columns = csv_pending(writer)
        if not pending:
            return
        columns = csv_columns(writer)
        exists = os.path.isfile(path)
        try:
            with replacing(path) as tmp:
                if exists and not new_columns:
                    shutil.copyfile(path, tmp)
                    rows, mode = pending, "a"
                else:
                    # New columns: the header changes, so every row is written again under it.
                    with open(path, newline="") if exists else contextlib.nullcontext([]) as file:
                        rows = list(csv.DictReader(file)) + pending
                    mode = "w"
                with open(tmp, mode, newline="") as file:
                    out = csv.DictWriter(file, fieldnames=columns, extrasaction="ignore")
                    if mode == "w":
                        out.writeheader()
                    out.writerows(rows)
        except OSError as error:
            set_csv_columns(writer, before)  # the file on disk still has the old header
            full = out_of_space(error, path, METRICS)
            if full:
                raise full from None
            raise
        csv_saved(writer)

    writer.save = save
