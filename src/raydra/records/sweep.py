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
and `format`; a PBT sweep's `mutations` and `lineage` are optional fields of it (a record without
them reads with none).
"""

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from raydra.records.envelope import COMPLETED, Envelope, Status, read_record, write_json
from raydra.records.layout import SWEEP
from raydra.records.ledger import GroupLedger

FORMAT = 2

# A sweep's record; and the record of an invocation that continued another sweep (tune.resume=),
# left in its own Hydra directory so that it never reads as a sweep of its own.
SWEEP_KIND, RESUME_KIND = "tune sweep", "tune sweep resume"
ENDED: Tuple[Status, ...] = Envelope.ENDS


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
class Exploit:
    """One copy PBT made (tune.scheduler=pbt): `trial` continued from `copied`'s checkpoint at the end
    of epoch `epoch` (optimizer step `step`), with `values` for the perturbed keys where `copied` had
    `copied_values`; `at`: when the trial started again from it."""

    trial: Optional[str] = None
    copied: Optional[str] = None
    epoch: Optional[int] = None
    step: Optional[int] = None
    values: Dict[str, Any] = field(default_factory=dict)
    copied_values: Dict[str, Any] = field(default_factory=dict)
    at: Optional[str] = None


@dataclass(frozen=True)
class TrialCounts:
    """How the sweep's trials ended."""

    completed: int = 0
    stopped: int = 0
    failed: int = 0


@dataclass(frozen=True)
class SweepRecord(Envelope):
    """sweep.json. Written as the sweep starts ("running") and rewritten whole when it ends."""

    FORMAT: ClassVar[int] = FORMAT
    format: int = FORMAT
    kind: str = SWEEP_KIND
    name: Optional[str] = None
    # <date>_<time>_<name>: the trials' W&B group, and the prefix of their run ids.
    id: Optional[str] = None
    sweep_dir: Optional[str] = None
    # The command line's overrides, as typed (secrets masked).
    overrides: List[str] = field(default_factory=list)
    search: Optional[str] = None
    scheduler: Optional[str] = None
    metric: Optional[str] = None
    mode: Optional[str] = None
    num_samples: Optional[int] = None
    # tune.space as parsed: {key: {distribution: arguments}}.
    space: Dict[str, Any] = field(default_factory=dict)
    # tune.scheduler=pbt: the keys it perturbs, parsed as `space`; and every copy it made, in order.
    mutations: Dict[str, Any] = field(default_factory=dict)
    lineage: List[Exploit] = field(default_factory=list)
    # The sweep's share of paths.storage (secrets masked), or None: the sweep directory holds it all.
    storage: Optional[str] = None
    max_concurrent: Optional[int] = None
    best: Optional[Best] = None
    trials: Optional[TrialCounts] = None
    # Its runs' compute ledgers added up, with its idle slots (raydra.records.ledger); None before it had one.
    ledger: Optional[GroupLedger] = None

    # -- transitions (Envelope's, and a sweep's own) --------------------------------------------

    @classmethod
    def continued_in(cls, sweep_dir: str) -> "SweepRecord":
        """The record of an invocation that continued the sweep in `sweep_dir` (tune.resume=)."""
        return cls(kind=RESUME_KIND, status=Status.RESUMED_ELSEWHERE, sweep_dir=sweep_dir)

    def with_settings(self, **fields: Any) -> "SweepRecord":
        """What the sweep runs with, known as it is prepared (metric, space, storage, ...): still running."""
        return dataclasses.replace(self, **fields)

    def completed(self, started: float, best: Best, trials: TrialCounts, ledger: Optional[GroupLedger] = None) -> "SweepRecord":
        return self._ended(COMPLETED, None, started, best=best, trials=trials, ledger=ledger)

    # -- reading ----------------------------------------------------------------------------------

    @property
    def continues_another(self) -> bool:
        """This is an invocation's pointer to the sweep it continued (sweep_dir), not a sweep."""
        return self.kind == RESUME_KIND


def read(sweep_dir: str | os.PathLike[str]) -> SweepRecord:
    """The sweep record in `sweep_dir`. A missing, truncated or non-object file is refused in one
    sentence naming it (RecordError); a field of the wrong type reads as unset (record.problems)."""
    return read_record(SweepRecord, Path(sweep_dir) / SWEEP, "sweep record", "a sweep directory a tune= run printed")


def write(sweep_dir: str | os.PathLike[str], record: SweepRecord) -> None:
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(sweep_dir) / SWEEP, record.to_dict())
