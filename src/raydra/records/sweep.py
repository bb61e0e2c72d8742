"""sweep.json as a typed value: what a Tune sweep (tune=) searched, how it ended and its best trial.

    SweepRecord      the record, one attribute per field, its format version in `format`
    read / write     sweep.json in a sweep directory, read into a SweepRecord and written whole
    transitions      started -> (resumed) -> completed | failed | interrupted: each returns a new
                     record, and `_ended` alone sets how a sweep ended. continued_in(): the record
                     an invocation with tune.resume= leaves in its own directory, naming the sweep
                     it continued

A sibling of raydra.records.summary (summary.json's module), whose reading rules it shares: a field of the
wrong type reads as unset and is named in `problems`, a key this version does not know is kept in
`extra` and written back. Only the standard library and raydra.records.summary are imported, so `raydra
compare` can read a sweep without torch, Ray, Hydra or OmegaConf.

Format 2 (this one) holds the fields sweep.json held before it had `format` (format 1, read as is),
and `format`.
"""

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from raydra.records.envelope import (
    COMPLETED,
    FAILED,
    INTERRUPTED,
    RUNNING,
    Resumption,
    from_json_object,
    now,
    read_record,
    to_json_object,
    write_json,
)
from raydra.records.layout import SWEEP

FORMAT = 2

# A sweep's record; and the record of an invocation that continued another sweep (tune.resume=),
# left in its own Hydra directory so that it never reads as a sweep of its own.
SWEEP_KIND, RESUME_KIND = "tune sweep", "tune sweep resume"
RESUMED_ELSEWHERE = "resumed elsewhere"
ENDED = (COMPLETED, FAILED, INTERRUPTED)


@dataclass(frozen=True)
class Best:
    """The completed trial with the best final metric, and where its config and checkpoint are."""

    trial: Optional[str] = None
    metric: Optional[float] = None
    sampled: Dict[str, Any] = field(default_factory=dict)
    run_dir: Optional[str] = None
    # Its best checkpoint's path, or URI in object storage (best_checkpoint.ckpt links to a path).
    checkpoint: Optional[str] = None
    # best_config.yaml: the composed config with the best trial's values, a primary config to rerun.
    config: Optional[str] = None


@dataclass(frozen=True)
class TrialCounts:
    """How the sweep's trials ended."""

    completed: int = 0
    stopped: int = 0
    failed: int = 0


@dataclass(frozen=True)
class SweepRecord:
    """sweep.json. Written as the sweep starts ("running") and rewritten whole when it ends."""

    format: int = FORMAT
    kind: str = SWEEP_KIND
    name: Optional[str] = None
    # <date>_<time>_<name>: the trials' W&B group, and the prefix of their run ids.
    id: Optional[str] = None
    sweep_dir: Optional[str] = None
    status: str = RUNNING
    # One line saying why the sweep failed or was interrupted (with the command that continues it).
    error: Optional[str] = None
    started_at: Optional[str] = None
    # The command line's overrides, as typed (secrets masked).
    overrides: List[str] = field(default_factory=list)
    search: Optional[str] = None
    scheduler: Optional[str] = None
    metric: Optional[str] = None
    mode: Optional[str] = None
    num_samples: Optional[int] = None
    # tune.space as parsed: {key: {distribution: arguments}}.
    space: Dict[str, Any] = field(default_factory=dict)
    # The sweep's share of paths.storage (secrets masked), or None: the sweep directory holds it all.
    storage: Optional[str] = None
    resumed: List[Resumption] = field(default_factory=list)
    max_concurrent: Optional[int] = None
    best: Optional[Best] = None
    trials: Optional[TrialCounts] = None
    finished_at: Optional[str] = None
    wall_time_s: Optional[float] = None
    # Keys this version does not know (a newer raydra's), kept as they were.
    extra: Dict[str, Any] = field(default_factory=dict)
    # What did not read (a field of the wrong type): never written.
    problems: Tuple[str, ...] = ()

    # -- transitions ------------------------------------------------------------------------------

    @classmethod
    def started(cls, **fields: Any) -> "SweepRecord":
        """A sweep's first record: status running, started now."""
        return cls(status=RUNNING, started_at=now(), **fields)

    @classmethod
    def continued_in(cls, sweep_dir: str) -> "SweepRecord":
        """The record of an invocation that continued the sweep in `sweep_dir` (tune.resume=)."""
        return cls(kind=RESUME_KIND, status=RESUMED_ELSEWHERE, sweep_dir=sweep_dir)

    def with_settings(self, **fields: Any) -> "SweepRecord":
        """What the sweep runs with, known as it is prepared (metric, space, storage, ...): still running."""
        return dataclasses.replace(self, **fields)

    def resumed_from_here(self, log: Optional[str] = None) -> "SweepRecord":
        """This record's sweep continues (tune.resume=): running again, the resumption (from the
        status it had, with that invocation's driver.log) added to its history."""
        resumption = Resumption(at=now(), from_status=self.status, log=log)
        return dataclasses.replace(self, status=RUNNING, error=None, finished_at=None, resumed=[*self.resumed, resumption])

    def completed(self, started: float, best: Best, trials: TrialCounts) -> "SweepRecord":
        return self._ended(COMPLETED, None, started, best=best, trials=trials)

    def failed(self, reason: str, started: Optional[float] = None) -> "SweepRecord":
        return self._ended(FAILED, reason, started)

    def interrupted(self, reason: str, started: Optional[float] = None) -> "SweepRecord":
        """Ctrl-C, SIGTERM, a time limit: `reason` names the command that continues the sweep."""
        return self._ended(INTERRUPTED, reason, started)

    def _ended(self, status: str, error: Optional[str], started: Optional[float], **fields: Any) -> "SweepRecord":
        """The one place a sweep's status changes from running."""
        wall = round(time.time() - started, 2) if started is not None else self.wall_time_s
        return dataclasses.replace(self, status=status, error=error, finished_at=now(), wall_time_s=wall, **fields)

    # -- reading ----------------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    @property
    def continues_another(self) -> bool:
        """This is an invocation's pointer to the sweep it continued (sweep_dir), not a sweep."""
        return self.kind == RESUME_KIND

    def to_dict(self) -> Dict[str, Any]:
        return to_json_object(self)

    @classmethod
    def from_dict(cls, data: Any) -> "SweepRecord":
        """A record as read from sweep.json (any format so far). Raises RecordError for what is no
        record at all (not a JSON object)."""
        return from_json_object(cls, data, FORMAT)


def read(sweep_dir: Any) -> SweepRecord:
    """The sweep record in `sweep_dir`. A missing, truncated or non-object file is refused in one
    sentence naming it (RecordError); a field of the wrong type reads as unset (record.problems)."""
    return read_record(SweepRecord, Path(sweep_dir) / SWEEP, "sweep record", "a sweep directory a tune= run printed")


def write(sweep_dir: Any, record: SweepRecord) -> None:
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(sweep_dir) / SWEEP, record.to_dict())
