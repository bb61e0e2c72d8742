"""One W&B run for each raydra run, Tune trial and multirun job, holding every step the run's
metrics.csv holds and saying how the run ended, whatever ended it.

W&B keeps a run as segments: each process that logs to it writes a `.wandb` file of its own under
the run's wandb/ (a worker group's rank 0 at each start, restart and resume=; the driver that
closes it), joined by the run's id when `wandb sync` uploads them in order of their start. A
process killed before it flushed leaves a file that ends early: SIGTERM 3 s into epoch 4 of 8 left
a file ending at step 69 where metrics.csv reached 179, and a trial ASHA stopped left a file with
no record at all. So:

- every segment continues W&B's `_step` where the earlier ones stopped, and never logs a
  (step, metric) that an earlier segment holds (the steps a restarted group trains again);
- rank 0, as it starts again, first logs the rows of metrics.csv (the ones kept up to the
  checkpoint it restarts from) that no segment holds (raydra.worker.wandb_logger);
- once the run has ended, its driver (a sweep's driver, for a trial Tune ended) logs what is still
  missing with the summary (the monitored metric's best, raydra's status and error) and the exit
  code that says how it ended (`complete`). W&B shows exit code 0 as finished, any other as failed:
  completed and stopped runs end 0, failed ones 1, interrupted ones 130 (Ctrl-C's code);
  `raydra/status` in the summary says which.

A metric's step is Lightning's `trainer/global_step`, W&B's x-axis for every key, as metrics.csv's
`step` column. The W&B settings and the config a segment needs are kept in wandb/raydra.json
(RUN_FILE), written by the worker as it starts the run, so that whoever completes it later needs
nothing but the run directory. Reading W&B's files goes through raydra.private_apis.wandb.wandb_records.
"""

import contextlib
import json
import logging
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, FrozenSet, Iterator, List, Literal, Optional, Tuple

from raydra.errors import RaydraError
from raydra.records import metrics_csv
from raydra.records import summary as summary_record
from raydra.records.envelope import Status
from raydra.records.layout import METRICS, WANDB, WANDB_RUN_FILE
from raydra.storage import replacing

log = logging.getLogger("raydra")

# W&B's x-axis for every metric (Lightning's WandbLogger defines it so): the trainer's global step.
STEP_KEY = "trainer/global_step"
# metrics.csv's coordinates: the step is W&B's STEP_KEY, the epoch a value logged beside every metric.
CSV_STEP, EPOCH = "step", "epoch"
# Lightning's WandbLogger joins its `prefix` to each key with this (Logger.LOGGER_JOIN_CHAR).
PREFIX_JOIN = "-"
# How a run ended, as a W&B exit code (0 shows as finished, anything else as failed), and the
# summary keys that say it in raydra's words.
EXIT_CODES = {Status.COMPLETED: 0, Status.STOPPED: 0, Status.PRUNED: 0, Status.FAILED: 1, Status.INTERRUPTED: 130}
STATUS_KEY, ERROR_KEY = "raydra/status", "raydra/error"
BEST_PREFIX = "best/"
# W&B's settings for every segment: no console capture (Ray streams it already), no system-stats
# sampler (it probes cloud metadata addresses, never to be contacted from a cluster without network).
QUIET_SETTINGS = {"console": "off", "silent": True, "x_disable_stats": True, "x_disable_machine_info": True}

# logger.wandb's keys. raydra's own: decided or merged by raydra (resolve decides mode, group,
# name and job_type; tags join the run's), or acted on by it (log_model, checkpoint_name,
# add_file_policy, prefix).
OWN_KEYS = ("project", "entity", "name", "group", "mode", "job_type", "tags", "log_model", "checkpoint_name", "add_file_policy", "prefix")
# wandb.init's arguments that reach it as they are.
INIT_KEYS = ("notes", "save_code", "force", "allow_val_change", "monitor_gym")
# What raydra sets itself, or what would break the run's W&B record, and what to do instead.
REFUSED_KEYS = {
    "id": "raydra gives each run, trial and job its run id as its W&B id",
    "version": "raydra gives each run, trial and job its run id as its W&B id",
    "resume": "raydra continues the same W&B run whenever the run continues (resume=, a restarted worker group)",
    "resume_from": "raydra continues the same W&B run whenever the run continues (resume=, a restarted worker group)",
    "fork_from": "start a new run from a checkpoint with ckpt_path= instead",
    "reinit": "raydra starts and finishes one W&B run per run, trial and job",
    "dir": "W&B's files live in the run directory's wandb/",
    "save_dir": "W&B's files live in the run directory's wandb/",
    "settings": "raydra sets W&B's settings itself",
    "experiment": "raydra starts the W&B run itself",
    "config": "the run's whole config is logged already (secrets masked)",
    "config_exclude_keys": "the run's whole config is logged already (secrets masked)",
    "config_include_keys": "the run's whole config is logged already (secrets masked)",
    "offline": "use logger.wandb.mode=offline",
    "anonymous": "log in with `wandb login` or WANDB_API_KEY, or run with logger.wandb.mode=offline",
    "api_key": "set the WANDB_API_KEY environment variable (or run `wandb login`) instead, so the key stays out of the run's files",
    "sync_tensorboard": "it would make W&B's x-axis TensorBoard's; add tensorboard to the loggers instead (logger=[csv,wandb,tensorboard])",
    "tensorboard": "it would make W&B's x-axis TensorBoard's; add tensorboard to the loggers instead (logger=[csv,wandb,tensorboard])",
}
LOG_MODEL_VALUES = (False, True, "all")


def problems(settings: Any) -> Iterator[str]:
    """A sentence for each key of logger.wandb that W&B's logger would not take as raydra passes it."""
    for key in settings or {}:
        if key in OWN_KEYS or key in INIT_KEYS:
            continue
        if key in REFUSED_KEYS:
            yield f"logger.wandb.{key} cannot be set: {REFUSED_KEYS[key]}."
        else:
            yield (
                f"logger.wandb.{key} is not an argument of W&B's logger; use one of {', '.join(sorted(OWN_KEYS + INIT_KEYS))} "
                "(docs/configuration.md, W&B)."
            )
    log_model = (settings or {}).get("log_model", False)
    if log_model not in LOG_MODEL_VALUES or isinstance(log_model, (int, float)) and not isinstance(log_model, bool):
        yield f"logger.wandb.log_model={log_model} must be false, true (the best and last checkpoints at the end) or all (every checkpoint as it is saved)."
    if (settings or {}).get("add_file_policy", "mutable") not in ("mutable", "immutable"):
        yield f"logger.wandb.add_file_policy={settings['add_file_policy']} must be mutable or immutable."


@dataclass(frozen=True)
class RunSettings:
    """What every segment of the run's W&B run is started with, and what raydra does with it."""

    init: Dict[str, Any]  # wandb.init's arguments but id, resume, dir, settings and config
    config: Dict[str, Any] = field(default_factory=dict)  # the run's config as logged (masked)
    prefix: str = ""
    monitor: Optional[str] = None
    monitor_mode: str = "max"
    log_model: Any = False
    checkpoint_name: Optional[str] = None
    add_file_policy: Literal["mutable", "immutable"] = "mutable"  # as problems() holds it

    @staticmethod
    def of(
        settings: Dict[str, Any], run_tags: List[str], config: Dict[str, Any], monitor: Optional[str], monitor_mode: str
    ) -> "RunSettings":
        """From logger.wandb as resolve decided it (raydra.run.resolve: mode, group, name, job_type)."""
        init = {key: settings.get(key) for key in ("project", "entity", "name", "group", "job_type", "mode")}
        init["tags"] = list(dict.fromkeys([*(str(t) for t in run_tags or []), *(str(t) for t in settings.get("tags") or [])]))
        init.update({key: settings[key] for key in INIT_KEYS if settings.get(key) is not None})
        return RunSettings(
            init=init,
            config=config,
            prefix=settings.get("prefix") or "",
            monitor=monitor,
            monitor_mode=monitor_mode,
            log_model=settings.get("log_model", False),
            checkpoint_name=settings.get("checkpoint_name"),
            add_file_policy=settings.get("add_file_policy") or "mutable",
        )

    def key(self, metric: str) -> str:
        """The name W&B holds `metric` under (Lightning's WandbLogger puts the prefix before it)."""
        return f"{self.prefix}{PREFIX_JOIN}{metric}" if self.prefix else metric

    def save(self, run_dir: Path) -> None:
        path = Path(run_dir, WANDB_RUN_FILE)
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:
            Path(tmp).write_text(json.dumps(self.__dict__, default=str))

    @staticmethod
    def read(run_dir: Path) -> Optional["RunSettings"]:
        """The settings a worker started the run's W&B run with; None where it never started one."""
        try:
            data = json.loads(Path(run_dir, WANDB_RUN_FILE).read_text())
            return RunSettings(**data)
        except (OSError, ValueError, TypeError):
            return None


def started(settings: RunSettings, run_id: str, run_dir: Path, held: "Held", config: bool = True) -> Any:
    """A new segment of the run's W&B run, in this process (wandb.init), with W&B's x-axis defined as
    Lightning's WandbLogger defines it."""
    import wandb

    run = wandb.init(
        **settings.init,
        id=run_id,
        resume="allow",
        dir=str(run_dir),
        config=settings.config if config else None,
        settings=wandb.Settings(**QUIET_SETTINGS),
    )
    run.define_metric(STEP_KEY)
    run.define_metric("*", step_metric=STEP_KEY, step_sync=True)
    return run


def finish(run: Any, exit_code: int, wait_s: float = 10.0) -> None:
    """Finish a segment with `exit_code`, and wait (up to `wait_s`) until its file holds the exit:
    W&B's service writes the file after wandb.finish returns (seen here: a file read at once held
    none of the rows just logged), and whoever completes the run next reads it."""
    path = Path(run.dir).parent / f"run-{run.id}.wandb"
    run.finish(exit_code=exit_code)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if any(item.WhichOneof("record_type") == "exit" for item in _records(path)):
                return
        time.sleep(0.05)


def _records(path: Path) -> Iterator[Any]:
    from raydra.private_apis.wandb import wandb_records

    return wandb_records(path)


# -- what the run's W&B files hold -------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """What the run's W&B segments hold, read from their `.wandb` files."""

    logged: FrozenSet[Tuple[int, str]] = frozenset()  # (trainer/global_step, W&B key) of every metric
    last_step: int = -1  # W&B's `_step` of the last history row
    exit_code: Optional[int] = None  # the last segment's exit, None where it never said one
    status: Optional[str] = None  # raydra/status in the last segment's summary
    has_config: bool = False  # some segment holds the run's config

    def holds(self, step: int, key: str) -> bool:
        return (step, key) in self.logged


def segments(run_dir: Path) -> List[Path]:
    """The run's `.wandb` files (offline and online segments), once each (wandb/latest-run is a link)."""
    found = {p.resolve() for pattern in ("*run-*/run-*.wandb",) for p in Path(run_dir, WANDB).glob(pattern) if p.is_file()}
    return sorted(found)


def held(run_dir: Path) -> Held:
    """What every W&B segment of the run holds. A file W&B cannot read is passed over with a warning."""
    from raydra.private_apis.wandb import wandb_records

    logged, last_step, has_config = set(), -1, False
    ends: List[Tuple[float, Optional[int], Optional[str]]] = []
    for path in segments(run_dir):
        start, exit_code, status = 0.0, None, None
        try:
            for item in wandb_records(path):
                kind = item.WhichOneof("record_type")
                if kind == "run":
                    start = item.run.start_time.seconds + item.run.start_time.nanos / 1e9
                    has_config = has_config or any(u.key != "_wandb" for u in item.run.config.update)
                elif kind == "config":
                    has_config = has_config or any(u.key != "_wandb" for u in item.config.update)
                elif kind == "history":
                    row = {_key(i): i.value_json for i in item.history.item}
                    with contextlib.suppress(KeyError, ValueError, TypeError):
                        last_step = max(last_step, int(json.loads(row["_step"])))
                    step = _int(row.get(STEP_KEY))
                    if step is not None:
                        logged.update((step, key) for key in row if not key.startswith("_") and key not in (STEP_KEY, EPOCH))
                elif kind == "summary":
                    for update in item.summary.update:
                        if _key(update) == STATUS_KEY:
                            status = json.loads(update.value_json)
                elif kind == "exit":
                    exit_code = item.exit.exit_code
        except Exception as error:  # a damaged file: what it holds is not counted
            log.warning(f"could not read W&B's file {path}: {error}")
        ends.append((start, exit_code, status))
    last = max(ends, default=(0.0, None, None), key=lambda end: end[0])
    return Held(logged=frozenset(logged), last_step=last_step, exit_code=last[1], status=last[2], has_config=has_config)


def _key(item: Any) -> str:
    return item.key or ".".join(item.nested_key)


def _int(value_json: Optional[str]) -> Optional[int]:
    try:
        return int(float(json.loads(value_json))) if value_json is not None else None
    except (ValueError, TypeError):
        return None


# -- what metrics.csv holds ----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One row of metrics.csv: the step it was logged at and its values (the epoch among them)."""

    step: int
    values: Dict[str, float]


def rows(run_dir: Path) -> List[Row]:
    """metrics.csv's rows with a step, in file order (raydra.records.metrics_csv reads it); [] where it is
    missing or damaged (W&B then keeps what it holds: the run's record says why elsewhere)."""
    path = Path(run_dir, METRICS)
    try:
        _, found = metrics_csv.read(path)
    except FileNotFoundError:
        return []
    except (OSError, RaydraError) as error:
        log.warning(f"W&B keeps what it holds: {error}")
        return []
    out = []
    for raw in found:
        step = _number(raw.get(CSV_STEP))
        if step is None:
            continue
        values = {k: v for k, v in ((k, _number(v)) for k, v in raw.items() if k and k != CSV_STEP) if v is not None}
        out.append(Row(step=int(step), values=values))
    return out


def _number(text: Optional[str]) -> Optional[float]:
    if text in (None, ""):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def missing(found: List[Row], what: Held, settings: RunSettings) -> List[Row]:
    """The rows (or the part of each) that no W&B segment holds, in metrics.csv's order; each keeps its epoch."""
    out = []
    for row in found:
        values = {k: v for k, v in row.values.items() if k != EPOCH and not what.holds(row.step, settings.key(k))}
        if values:
            if EPOCH in row.values:
                values[EPOCH] = row.values[EPOCH]
            out.append(Row(step=row.step, values=values))
    return out


def best(found: List[Row], settings: RunSettings) -> Dict[str, Any]:
    """The summary's best: the monitored metric's best value in metrics.csv, with its step and epoch."""
    monitor = settings.monitor
    if not monitor:
        return {}
    candidates = [r for r in found if isinstance(r.values.get(monitor), (int, float)) and not math.isnan(r.values[monitor])]
    if not candidates:
        return {}
    pick = max if settings.monitor_mode == "max" else min
    top = pick(candidates, key=lambda r: r.values[monitor])
    return best_summary(monitor, top.values[monitor], top.step, top.values.get(EPOCH))


def best_summary(monitor: str, value: float, step: int, epoch: Any) -> Dict[str, Any]:
    """The W&B summary keys of the monitored metric's best, beside W&B's own last value of it."""
    return {f"{BEST_PREFIX}{monitor}": value, f"{BEST_PREFIX}step": step, f"{BEST_PREFIX}epoch": epoch}


def log_row(run: Any, row: Row, settings: RunSettings, step: int) -> None:
    """One metrics.csv row as W&B's history row number `step` (`_step`), committed at once."""
    values = {(k if k == EPOCH else settings.key(k)): v for k, v in row.values.items()}
    run.log({**values, STEP_KEY: row.step}, step=step, commit=True)


# -- the run's end -------------------------------------------------------------------------------


def complete(run_dir: Path) -> bool:
    """Bring the run's W&B run up to its record, once the run has ended: log the rows of metrics.csv
    no segment holds, the summary and the exit code of how it ended (see the module's docstring), in
    a closing segment, copied to the run's storage too; nothing where the last segment already says
    all of it. Returns whether it wrote one.

    Never raises: the run's own record is what matters, and it is written already."""
    try:
        return _complete(Path(run_dir))
    except Exception as error:
        log.warning(f"could not complete the W&B run of {run_dir}: {error}")
        return False


def _complete(run_dir: Path) -> bool:
    settings = RunSettings.read(run_dir)
    run = summary_record.try_read(run_dir)
    # A record with no id (the W&B run's) names no W&B run; `status is None` tells the type checker what
    # `not in EXIT_CODES` already does (it does not narrow a StrEnum through `in`).
    if settings is None or run is None or run.run_id is None or run.status is None or run.status not in EXIT_CODES:
        return False
    if settings.init.get("mode") == "disabled":
        return False
    what = held(run_dir)
    found = rows(run_dir)
    todo = missing(found, what, settings)
    exit_code = EXIT_CODES[run.status]
    artifacts = _checkpoints_to_log(run, settings)
    if not todo and what.exit_code == exit_code and what.status == run.status and not artifacts:
        return False
    import wandb

    before = set(segments(run_dir))
    # A process that ran the worker too (local mode) may still hold its segment open.
    if wandb.run is not None:
        finish(wandb.run, exit_code)
    segment = started(settings, run.run_id, run_dir, what, config=not what.has_config)
    try:
        for number, row in enumerate(todo, start=what.last_step + 1):
            log_row(segment, row, settings, number)
        summary = {STATUS_KEY: str(run.status), **best(found, settings)}
        if run.error:
            summary[ERROR_KEY] = run.error
        segment.summary.update(summary)
        _log_checkpoints(segment, run, settings, artifacts)
    finally:
        finish(segment, exit_code)
    if run.storage:
        _push(run_dir, run.storage, set(segments(run_dir)) - before)
    log.info(f"W&B: {len(todo)} row(s) of metrics.csv that no W&B segment held logged, and the run's end ({run.status})")
    return True


def _checkpoints_to_log(run: summary_record.RunRecord, settings: RunSettings) -> List[Tuple[str, List[str]]]:
    """log_model=true: the best and last checkpoints of a run that completed or was stopped, with
    their aliases; [] where the run asked for none (log_model=all logs each as it is saved)."""
    if settings.log_model is not True or run.status not in (Status.COMPLETED, Status.STOPPED, Status.PRUNED):
        return []
    best_path, last_path = run.checkpoint("best"), run.checkpoint("last")
    chosen: Dict[str, List[str]] = {}
    if best_path:
        chosen.setdefault(best_path, []).append("best")
    if last_path:
        chosen.setdefault(last_path, []).append("latest")
    return list(chosen.items())


def _log_checkpoints(segment: Any, run: summary_record.RunRecord, settings: RunSettings, artifacts: List[Tuple[str, List[str]]]) -> None:
    from raydra.records.checkpoints import fetch

    for path, aliases in artifacts:
        with tempfile.TemporaryDirectory(prefix="raydra-wandb-model-") as scratch:
            log_checkpoint(segment, fetch(path, scratch), settings, aliases, {"checkpoint": path, "run_id": run.run_id})


def log_checkpoint(segment: Any, path: Path, settings: RunSettings, aliases: List[str], metadata: Dict[str, Any]) -> None:
    """A checkpoint (a file, or a sharded checkpoint's folder) as a version of the run's model
    artifact (`model-<run id>`, or logger.wandb.checkpoint_name), as Lightning's WandbLogger names it."""
    import wandb

    artifact = wandb.Artifact(name=settings.checkpoint_name or f"model-{segment.id}", type="model", metadata=metadata)
    if Path(path).is_dir():
        artifact.add_dir(str(path), policy=settings.add_file_policy)
    else:
        artifact.add_file(str(path), name="model.ckpt", policy=settings.add_file_policy)
    segment.log_artifact(artifact, aliases=aliases)


def _push(run_dir: Path, location: str, written: set) -> None:
    from raydra import storage

    for path in written:
        folder = path.parent
        storage.copy_tree(str(folder), storage.join(location, str(folder.relative_to(run_dir))))


def finish_in_process(exit_code: int, status: Optional[str] = None) -> None:
    """End this process's W&B run, if one is open, with `exit_code` (a worker whose fit raised:
    what it logged is flushed, and the run says it failed until a later segment says otherwise)."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is None or getattr(wandb, "run", None) is None:
        return
    with contextlib.suppress(Exception):
        if status:
            wandb.run.summary[STATUS_KEY] = str(status)
        finish(wandb.run, exit_code)


def copy_segments(source: str, destination: Path) -> None:
    """Bring the run's W&B files from storage (`source`: the run's storage location) into a worker's
    scratch directory on another node, so that the segment it starts knows what the earlier ones hold."""
    from raydra import storage

    for relative in storage.list_files(storage.join(source, WANDB)):
        if relative.endswith(".wandb") or relative == Path(WANDB_RUN_FILE).name:
            target = destination / WANDB / relative
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                storage.write_bytes(str(target), storage.read_bytes(storage.join(source, WANDB, relative)))
