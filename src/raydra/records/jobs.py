"""jobs.json as a typed value: a multirun's jobs (raydra's launcher), each one's overrides, directory
and outcome, and how the multirun itself ended.

    JobsRecord       the record, its format version in `format`; `jobs` by number ("0", "1", ...)
    JobEntry         one job's entry
    read / write     jobs.json in a multirun's sweep directory
    transitions      started | resumed_from_here | next_batch -> completed | failed | interrupted:
                     each returns a new record, and `_ended` alone sets how the multirun ended

What a resumed multirun (hydra.launcher.resume=true) reads: its jobs' overrides and directories are
checked against the command's, and a completed job is kept with its return value. A Hydra sweeper
launches a multirun in batches: each batch's jobs are added to the record, and the record's status
is that of the latest batch.

A sibling of raydra.records.summary (summary.json's module), whose reading rules it shares: a field of the
wrong type reads as unset and is named in `problems`, a key this version does not know is kept in
`extra` and written back. Only the standard library and raydra.records.summary are imported.

Format 2 (this one) adds the multirun's own status, error, times and resumptions to the jobs that
jobs.json held before it had `format` (format 1: `jobs` alone, read with no status).
"""

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from raydra.records.envelope import COMPLETED, Envelope, Status, from_json_number, read_record, write_json
from raydra.records.layout import JOBS_RECORD
from raydra.records.ledger import GroupLedger

FORMAT = 2
ENDED: Tuple[Status, ...] = Envelope.ENDS


@dataclass(frozen=True)
class JobEntry:
    """One job's entry: its overrides as the sweeper made them (secrets masked), its directory, and
    its status: queued, running, completed, failed, interrupted, pruned or not started."""

    overrides: List[str] = field(default_factory=list)
    dir: Optional[str] = None
    status: Optional[Status] = None
    # A completed job's return value (a raydra run's best monitored metric), or null when it was
    # not JSON: what a resumed multirun hands back to Hydra's sweeper for a job it keeps.
    return_value: Any = None
    error: Optional[str] = None
    # When its process started, and when it let its slot go (a raydra run: its outcome recorded, its
    # workers gone; any job: its end): the gaps between one job's release and the next one's start
    # are the slot time the launcher left idle. ISO times to the millisecond; None where unknown.
    started_at: Optional[str] = None
    released_at: Optional[str] = None


@dataclass(frozen=True)
class JobsRecord(Envelope):
    """jobs.json. Rewritten whole as the multirun starts, as each job ends, and as the multirun ends.
    Its envelope's status is None in a record written before format 2, which kept none of its own;
    its error says why the multirun failed (it started no job), or was interrupted, with the command
    that continues it."""

    FORMAT: ClassVar[int] = FORMAT
    format: int = FORMAT
    status: Optional[Status] = None
    jobs: Dict[str, JobEntry] = field(default_factory=dict)
    # Its runs' compute ledgers added up, with its idle slots (raydra.records.ledger); None before it had one.
    ledger: Optional[GroupLedger] = None

    # -- transitions (Envelope's, and a multirun's own) -----------------------------------------

    def next_batch(self) -> "JobsRecord":
        """A sweeper's next batch of the same multirun: running again, the earlier batches' jobs kept."""
        return dataclasses.replace(self, status=Status.RUNNING, error=None, finished_at=None)

    def with_jobs(self, jobs: Dict[int, JobEntry]) -> "JobsRecord":
        """The jobs' entries as they stand now, added to (or replacing) those recorded, in number order."""
        merged = {**self.jobs, **{str(num): job for num, job in jobs.items()}}
        return dataclasses.replace(self, jobs=dict(sorted(merged.items(), key=lambda item: _number(item[0]))))

    def with_ledger(self, ledger: Optional[GroupLedger]) -> "JobsRecord":
        """Its runs' compute ledger as the multirun ends."""
        return dataclasses.replace(self, ledger=ledger)

    def completed(self, started: Optional[float] = None) -> "JobsRecord":
        """Every job ended (each entry says how: a failed job does not fail the multirun, as under
        Hydra's own launchers)."""
        return self._ended(COMPLETED, None, started)

    # -- reading ----------------------------------------------------------------------------------

    def job(self, num: int) -> Optional[JobEntry]:
        return self.jobs.get(str(num))

    @classmethod
    def from_dict(cls, data: Any) -> "JobsRecord":
        """A record as read from jobs.json (any format so far). Raises RecordError for what is no
        record at all (not a JSON object)."""
        record = super().from_dict(data)
        jobs = {num: dataclasses.replace(job, return_value=from_json_number(job.return_value)) for num, job in record.jobs.items()}
        return dataclasses.replace(record, jobs=jobs)


def read(sweep_dir: str | os.PathLike[str]) -> JobsRecord:
    """The multirun's record in `sweep_dir`. A missing, truncated or non-object file is refused in
    one sentence naming it (RecordError); a field of the wrong type reads as unset (record.problems)."""
    return read_record(JobsRecord, Path(sweep_dir) / JOBS_RECORD, "multirun record", "the directory of a multirun raydra's launcher ran")


def write(sweep_dir: str | os.PathLike[str], record: JobsRecord) -> None:
    write_json(Path(sweep_dir) / JOBS_RECORD, record.to_dict())


def _number(key: str) -> Tuple[int, str]:
    # Jobs are numbered; a key that is no number (a hand-edited record) goes last rather than failing.
    return (int(key), "") if key.isdigit() else (1 << 62, key)
