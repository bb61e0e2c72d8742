"""race.json as a typed value: a seed race's (hydra/sweeper=race) configurations, the jobs it ran,
each look it took and its verdict. Written whole beside jobs.json as each job is asked for and as
each ends, so that `hydra.launcher.resume=true` continues the race from it and `raydra compare
<sweep dir>` shows its verdict.

    RaceRecord       the record, its format version in `format`
    RaceJob          one job: which configuration, which seed, how it ended and its result
    Configuration    one configuration: its overrides and, once decided, how it stands
    Comparison       a configuration against the leader at its last look
    read / write     race.json in a sweep directory

A sibling of raydra.records.jobs, whose reading rules it shares (raydra.records.envelope). Only the
standard library and raydra.records are imported.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Dict, List, Optional

from raydra.records.envelope import Envelope, Status, read_record, write_json
from raydra.records.layout import RACE_RECORD

FORMAT = 1


@dataclass(frozen=True)
class RaceJob:
    """One job of the race: configuration `config` (an index into the record's configurations) at
    seed index `seed` (its seed value: the record's seeds[seed]); `status` as the launcher told it,
    `value` its result (a completed job's best metric) or None."""

    config: int = 0
    seed: int = 0
    status: Optional[Status] = Status.RUNNING
    value: Optional[float] = None


@dataclass(frozen=True)
class Comparison:
    """A configuration against the leader, at the look that decided it or its last: the leader's
    advantage in the metric's units (its mean minus this one's, or the reverse when minimizing), its
    (1 - alpha) interval, and p adjusted for the look's pairs and the looks (comparable with alpha:
    dropped iff p <= alpha)."""

    leader: int = 0
    advantage: Optional[float] = None
    ci: List[float] = field(default_factory=list)
    p: Optional[float] = None
    # How many seeds of each the look used.
    seeds: int = 0
    # Its predictive chance, at that look, of ending max_seeds ahead of the leader (None at max_seeds).
    overtake: Optional[float] = None


@dataclass(frozen=True)
class Configuration:
    """One configuration raced: its overrides (those that set it apart), and how it stands: racing,
    winner, dropped (beaten beyond noise), out of reach (less than the race's futility chance of
    ending max_seeds ahead of the leader; no difference claimed) or undecided (in contention when
    the race reached max_seeds)."""

    overrides: List[str] = field(default_factory=list)
    standing: str = "racing"
    # Its results by seed value, and their mean.
    results: Dict[str, float] = field(default_factory=dict)
    mean: Optional[float] = None
    against_leader: Optional[Comparison] = None


@dataclass(frozen=True)
class Look:
    """One look: at `level` seeds each, which configurations were in contention, the leader, those
    dropped beyond noise and those out of reach."""

    level: int = 0
    contenders: List[int] = field(default_factory=list)
    leader: int = 0
    dropped: List[int] = field(default_factory=list)
    out_of_reach: List[int] = field(default_factory=list)


@dataclass(frozen=True)
class RaceRecord(Envelope):
    FORMAT: ClassVar[int] = FORMAT
    format: int = FORMAT
    metric: Optional[str] = None
    mode: Optional[str] = None
    # The race's settings as hydra/sweeper=race ran it (their defaults live in its RaceSweeperConf);
    # None where a damaged record does not say, as a SweepRecord's.
    min_seeds: Optional[int] = None
    max_seeds: Optional[int] = None
    alpha: Optional[float] = None
    # Below this chance of ending max_seeds ahead of the leader a configuration is out of reach
    # (None: a record from before out-of-reach drops, or a damaged one).
    futility: Optional[float] = None
    # The config key each job's seed goes to, and the seed values in order (the same for every configuration).
    seed_name: Optional[str] = None
    seeds: List[int] = field(default_factory=list)
    # The overrides every job shares.
    fixed: List[str] = field(default_factory=list)
    configurations: List[Configuration] = field(default_factory=list)
    jobs: Dict[str, RaceJob] = field(default_factory=dict)
    looks: List[Look] = field(default_factory=list)
    # The verdict: the winner's index once the race is done; decided: it beat every other beyond
    # noise (none out of reach or undecided).
    winner: Optional[int] = None
    decided: bool = False
    # Why the race stopped asking for jobs before its verdict (a job that failed), if it did.
    stopped: Optional[str] = None
    # Jobs started (pruned ones included) against the full grid's (configurations x max_seeds), and
    # the worker-seconds the race's runs used, with what the full grid would have (each
    # configuration's mean per job, times max_seeds), where the runs' ledgers say.
    jobs_started: int = 0
    grid_jobs: int = 0
    worker_s: Optional[float] = None
    grid_worker_s: Optional[float] = None

    def completed(self, started: Optional[float] = None) -> "RaceRecord":
        """The race has its verdict (`started`: this invocation's time.time() at its start)."""
        return self._ended(Status.COMPLETED, None, started)


def read(sweep_dir: str | os.PathLike[str]) -> RaceRecord:
    """The race's record in `sweep_dir`; refused in one sentence (RecordError) when missing or unreadable."""
    return read_record(RaceRecord, Path(sweep_dir) / RACE_RECORD, "race record", "the directory of a race (hydra/sweeper=race)")


def write(sweep_dir: str | os.PathLike[str], record: RaceRecord) -> None:
    write_json(Path(sweep_dir) / RACE_RECORD, record.to_dict())
