"""summary.json as a typed value: what a run asked for, how it ended and what it achieved.

    RunRecord        the record, one attribute per field, its format version in `format`
    read / write     summary.json in a run directory, read into a RunRecord and written atomically
    transitions      started -> running (with_start) -> completed | failed | hung | interrupted |
                     stopped, and resumed_from: each returns a new record; `_ended` alone sets how a run ended

Every module that writes or reads summary.json goes through here; the rest read attributes. Only the
standard library is imported (and raydra.storage's path joining), so `raydra compare` and `show` read
records without torch, Ray, Hydra or OmegaConf, on any machine the runs were copied to.

Format 2 (this one): paths the record names inside the run (its checkpoints) are relative to the
run's home: its storage location when it has one (`storage`), else its run directory. So a copied or
moved run finds its own checkpoints. Format 1 (records before `format` was written) named them
absolute; `from_dict` reads such records as format 2, relative wherever they lay below the recorded
run directory or storage location.

A record is data from wherever the run came from: a field of the wrong type reads as unset and is
named in `problems`, a key this version does not know is kept in `extra` (and written back), so a
newer raydra's or a damaged record still reads. sweep.json's and jobs.json's typed records
(raydra.sweep_record, raydra.jobs_record) are read and written by the same rules, from here
(from_json_object, to_json_object, read_record, write_json).

Record files are strict JSON, which has no NaN or infinity: a number that is not finite (a diverged
loss) is written as the string "NaN", "Infinity" or "-Infinity" (what Python's float() reads back),
and read back as that number where the record holds one (a float field, a metric, a job's return
value: from_json_number).
"""

import dataclasses
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from raydra import storage
from raydra.records.envelope import (
    COMPLETED,
    FAILED,
    INTERRUPTED,
    PRUNED,
    STOPPED,
    Envelope,
    RecordError,
    Resumption,
    Status,
    from_json_number,
    now,
    parse_record,
    read_record,
    write_json,
)
from raydra.records.layout import SUMMARY
from raydra.records.ledger import Ledger

FORMAT = 2


# How a run can end; "running" is the record of a run under way, or of a driver that died.
ENDED: Tuple[Status, ...] = (COMPLETED, FAILED, INTERRUPTED, STOPPED, PRUNED)


@dataclass(frozen=True)
class Monitor:
    """The metric the run's checkpoints were ranked by, and whether higher is better."""

    metric: Optional[str] = None
    mode: Optional[str] = None


@dataclass(frozen=True)
class Metrics:
    """The last report's metrics with the test's, and the report where the monitor was best."""

    final: Dict[str, Any] = field(default_factory=dict)
    best: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Checkpoints:
    """The run's checkpoints, relative to its home (RunRecord.checkpoint makes them whole), and what
    saving them cost."""

    best: Optional[str] = None
    last: Optional[str] = None
    dir: Optional[str] = None
    # Mean time training stood still per checkpoint (write, and a waited-for upload), rank 0's view.
    save_s_mean: Optional[float] = None
    # Mean time an upload to storage took (in the background with checkpoint.upload=background).
    upload_s_mean: Optional[float] = None
    upload: Optional[str] = None


@dataclass(frozen=True)
class Trial:
    """A Tune trial's place in its sweep, and the values it sampled."""

    sweep: Optional[str] = None
    id: Optional[str] = None
    sampled: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StoppedRank:
    """A worker that stopped making progress: where it was, and how long it had been still."""

    rank: Optional[int] = None
    node: Optional[str] = None
    pid: Optional[int] = None
    phase: Optional[str] = None
    # The last global step it completed.
    step: Optional[int] = None
    still_s: Optional[float] = None


@dataclass(frozen=True)
class Hang:
    """One hang the watchdog found (raydra.run.hang_watch): the phase and step it happened at, how long it
    waited, the rank(s) that stopped (the others waited on them), where their stacks are, and what
    came of it: the worker group restarted from the last checkpoint, or the run ended."""

    at: Optional[str] = None
    phase: Optional[str] = None
    step: Optional[int] = None
    waited_s: Optional[float] = None
    deadline_s: Optional[float] = None
    stopped: List[StoppedRank] = field(default_factory=list)
    # The directory with every worker's stacks (and torch's flight record), relative to the run directory.
    diagnostics: Optional[str] = None
    outcome: Optional[str] = None

    @property
    def where(self) -> str:
        """Where the run stood: "start-up", or the phase and the last step ("train after step 25")."""
        return "start-up" if self.phase == "startup" else f"{self.phase or 'an unknown phase'} after step {self.step}"

    def sentence(self) -> str:
        """The hang in one line, for the record's error and the console."""
        ranks = ", ".join(f"rank {r.rank} ({r.node})" for r in self.stopped) or "no rank named"
        seconds = lambda value: f"{value:.0f}" if isinstance(value, (int, float)) else "?"  # noqa: E731  (a damaged record's blank)
        return (
            f"hung: {ranks} made no progress in {self.where} for {seconds(self.waited_s)} s (deadline {seconds(self.deadline_s)} s); "
            f"every worker's stacks are in {self.diagnostics}"
        )


@dataclass(frozen=True)
class Straggler:
    """A rank the others waited for, step after step (raydra.run.hang_watch): by how much, and from when."""

    rank: Optional[int] = None
    node: Optional[str] = None
    # Median time by which its steps started after the first rank's, and the step time of the run.
    lag_s: Optional[float] = None
    step_time_s: Optional[float] = None
    # Its lag as a share of a step, at its worst window.
    share: Optional[float] = None
    first_step: Optional[int] = None
    last_step: Optional[int] = None
    windows: Optional[int] = None


@dataclass(frozen=True)
class RunRecord(Envelope):
    """summary.json. Written when the run starts ("running") and rewritten whole when it ends."""

    FORMAT: ClassVar[int] = FORMAT
    format: int = FORMAT
    name: Optional[str] = None
    run_id: Optional[str] = None
    # Where the run was written, as that machine named it: what `resume=` continues in, and what
    # format 1's absolute paths are relative to.
    run_dir: Optional[str] = None
    # The command line's overrides, as typed (secrets masked).
    overrides: List[str] = field(default_factory=list)
    monitor: Monitor = field(default_factory=Monitor)
    # The user's words for the run (root key tags), and the seed every worker started from.
    tags: List[str] = field(default_factory=list)
    seed: Optional[int] = None
    # The strategy's settings, not only its name: sharding and layout decide memory and checkpoints.
    strategy: Any = None
    # An elastic group's starts as its max; the outcome replaces it with the last size.
    world_size: Optional[int] = None
    use_gpu: Optional[bool] = None
    git_commit: Optional[str] = None
    versions: Dict[str, str] = field(default_factory=dict)
    # The SLURM job it ran in (its logs, its accounting, how a requeued job finds the run).
    slurm: Optional[Dict[str, Any]] = None
    # Set once the config validated: resume=latest's mark of a run that got as far as training.
    config_hash: Optional[str] = None
    precision: Optional[str] = None
    # The run's share of paths.storage (secrets masked), or None: the run directory holds it all.
    storage: Optional[str] = None
    # Where to find the run in W&B (project, entity, group, mode).
    wandb: Optional[Dict[str, Any]] = None
    # ckpt_path=: the checkpoint whose weights the run started from (outside the run: absolute).
    ckpt_path: Optional[str] = None
    # What the data turned out to be: classes found in it and, under ray_data, rows per split.
    data: Dict[str, Any] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)
    throughput: Dict[str, Any] = field(default_factory=dict)
    peak_memory_bytes: Optional[int] = None
    memory_per_worker: List[Dict[str, Any]] = field(default_factory=list)
    epochs_completed: Optional[int] = None
    # Why final metrics hold no test/* (no test split, trainer.test=false); None when tested.
    test_skipped: Optional[str] = None
    global_step: Optional[int] = None
    # Why training ended before trainer.max_epochs, when a callback (EarlyStopping) stopped it.
    stopped_early: Optional[Dict[str, Any]] = None
    # An elastic group's bounds ({"min", "max"}) and its resizes (when, from, to, at which step).
    num_workers: Optional[Dict[str, Any]] = None
    resizes: List[Dict[str, Any]] = field(default_factory=list)
    checkpoints: Checkpoints = field(default_factory=Checkpoints)
    # raydra.run.startup's phases: how long the run took to reach its first step, and where that went.
    startup: Dict[str, Any] = field(default_factory=dict)
    trial: Optional[Trial] = None
    # The watchdog's finds: each hang (and whether the group restarted), the stragglers named, and
    # the deadlines it held the run to at the end (docs/reliability.md: what to tune them to).
    hangs: List[Hang] = field(default_factory=list)
    stragglers: List[Straggler] = field(default_factory=list)
    watchdog: Dict[str, Any] = field(default_factory=dict)
    # A trial the sweep's scheduler ended early, or a multirun job its sweeper pruned: which
    # scheduler or pruner, after how many epochs.
    stopped_by: Optional[str] = None
    # raydra rerun: the run this one reproduces.
    reproduces: Optional[str] = None
    # Where its worker-seconds went (raydra.records.ledger); None in a record written before it had one.
    ledger: Optional[Ledger] = None

    # How a run can end; "running" is the record of a run under way, or of a driver that died.
    ENDS: ClassVar[Tuple[Status, ...]] = ENDED

    # -- transitions (Envelope's, and a run's own) ----------------------------------------------

    def with_start(self, **fields: Any) -> "RunRecord":
        """What the run will train with, known once its config resolved (config_hash, precision,
        storage, ...): still running."""
        return dataclasses.replace(self, **fields)

    def resumed_from(self, previous: "RunRecord", log: Optional[str] = None, **kept: Any) -> "RunRecord":
        """This invocation continues `previous`: its id, directory, start and history are kept, and
        the resumption is added to them. `kept`: fields to set as well (where the run is now)."""
        continued = {
            "run_id": previous.run_id,
            "run_dir": previous.run_dir or self.run_dir,
            "started_at": previous.started_at,
            # Kept, so that if this attempt fails too, resume=latest still finds the run.
            "config_hash": previous.config_hash,
            "resumed": [*previous.resumed, Resumption(at=now(), from_status=previous.status, log=log)],
        }
        return dataclasses.replace(self, **{**continued, **kept})

    def completed(self, started: float, **outcome: Any) -> "RunRecord":
        """The fit returned: its figures (metrics, throughput, checkpoints, ...)."""
        return self._ended(COMPLETED, None, started, **outcome)

    def hung(self, hangs: List[Hang], started: Optional[float] = None, **outcome: Any) -> "RunRecord":
        """The watchdog found the run hung and no restart was left: failed, saying where it stopped.
        `hangs`: every hang of the run, the last one the one that ended it."""
        return self._ended(FAILED, hangs[-1].sentence(), started, hangs=list(hangs), **outcome)

    def interrupted(
        self, reason: Optional[str], started: Optional[float] = None, last_checkpoint: Optional[str] = None, **fields: Any
    ) -> "RunRecord":
        """Ctrl-C, SIGTERM, a time limit: `reason` names the command that continues it, and the
        checkpoint it continues from (relative to the run's home) is recorded."""
        return super().interrupted(reason, started, checkpoints=Checkpoints(last=last_checkpoint), **fields)

    def stopped(self, by: str, wall_time_s: Optional[float], **outcome: Any) -> "RunRecord":
        """A trial a sweep's scheduler ended early: not a failure, its figures as far as it got."""
        return dataclasses.replace(self._ended(STOPPED, None, None, **outcome), stopped_by=by, wall_time_s=wall_time_s)

    def pruned(self, by: str) -> "RunRecord":
        """A multirun job its sweeper stopped early (raydra.multirun.feed): the record its run wrote
        as it stopped (interrupted, its last checkpoint kept), now saying why: not a failure, and not
        to be continued."""
        return dataclasses.replace(self._ended(PRUNED, None, None), stopped_by=by)

    # -- reading ----------------------------------------------------------------------------------

    def home(self, found: Any = None) -> Optional[str]:
        """Where the record's relative paths start, for the run found at `found` (a directory or a
        storage URI; None: where it was written): a URI itself (the run's storage, or a copy of the
        run there), else the run's storage location if it has one, else its run directory."""
        if found is not None and storage.is_uri(str(found)):
            return str(found)
        if self.storage:
            return self.storage
        found = found if found is not None else self.run_dir
        return str(found) if found is not None else None

    def checkpoint(self, which: str, found: Any = None) -> Optional[str]:
        """The best or last checkpoint's path or URI, for the run found at `found` (see home)."""
        return self.whole_path(getattr(self.checkpoints, which), found)

    def whole_path(self, recorded: Optional[str], found: Any = None) -> Optional[str]:
        """A path the record names, made whole: relative ones below the run's home."""
        if not recorded or storage.is_uri(recorded) or posixpath.isabs(recorded):
            return recorded
        home = self.home(found)
        return storage.join(home, *recorded.split("/")) if home else recorded

    def relative(self, path: Optional[str], home: Optional[str] = None) -> Optional[str]:
        """`path` as the record keeps it: relative to the run's home (`home`, where the caller knows
        it unmasked; else the record's) when below it."""
        return relative_to(path, home or self.home())

    def best_value(self) -> Any:
        """The monitored metric's best value, if it was reported."""
        return self.metrics.best.get(self.monitor.metric) if self.monitor.metric else None

    @classmethod
    def from_dict(cls, data: Any) -> "RunRecord":
        """A record as read from summary.json (any format so far). Raises RecordError for what is no
        record at all (not a JSON object)."""
        record = super().from_dict(data)
        if not isinstance(data.get("format"), int) or data.get("format", 1) < 2:
            record = _from_format_1(record)
        metrics = record.metrics
        figures = {key: from_json_number(value) for key, value in metrics.final.items()}
        best = {key: from_json_number(value) for key, value in metrics.best.items()}
        return dataclasses.replace(record, metrics=Metrics(final=figures, best=best))


def read(run_dir: str | os.PathLike[str], name: str = SUMMARY) -> RunRecord:
    """The run record in `run_dir`. A missing, truncated or non-object file is refused in one
    sentence naming it (RecordError); a field of the wrong type reads as unset (record.problems)."""
    return read_record(RunRecord, Path(run_dir) / name, "run record", "a run directory a raydra run wrote")


def parse(text: str, where: str) -> RunRecord:
    """A run record from summary.json's text, read from `where` (a path or a storage URI, for the
    one sentence that refuses a truncated or non-object record)."""
    return parse_record(RunRecord, text, where, "run record")


def try_read(run_dir: str | os.PathLike[str], name: str = SUMMARY) -> Optional[RunRecord]:
    """The run record, or None where there is none to read (not written yet, cut short, not an object)."""
    try:
        return read(run_dir, name)
    except (RecordError, OSError):
        return None


def write(run_dir: str | os.PathLike[str], record: RunRecord, name: str = SUMMARY) -> None:
    write_json(Path(run_dir) / name, record.to_dict())


def _from_format_1(record: RunRecord) -> RunRecord:
    """A record written before `format`: its checkpoints were named absolute, below the run
    directory (or the storage location) it was written in."""
    c = record.checkpoints
    home = record.home()
    return dataclasses.replace(
        record,
        checkpoints=dataclasses.replace(c, best=relative_to(c.best, home), last=relative_to(c.last, home), dir=relative_to(c.dir, home)),
    )


def relative_to(path: Optional[str], home: Optional[str]) -> Optional[str]:
    """`path` relative to `home` when it lies below it (a URI's query left aside), else as given."""
    if not path or not home:
        return path
    base, query = _split_query(home)
    inner, inner_query = _split_query(path)
    base = base.rstrip("/") + "/"
    if inner.startswith(base) and (not storage.is_uri(path) or query == inner_query):
        return inner[len(base) :] or None
    return path


def _split_query(location: str) -> Tuple[str, str]:
    head, _, query = location.partition("?")
    return head, query
