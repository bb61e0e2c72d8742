"""What every record (summary.json, sweep.json, jobs.json) is: one envelope, one way to read and write.

    Status          how a piece of work stands: a run, a sweep, a multirun, each of its jobs
    Envelope        the fields every record shares (status, error, times, resumptions, format) and
                    its transitions: `_ended` alone sets how the work ended; `settled` maps how a
                    raydra.run.lifecycle ending left it
    read / write    a record file read into its type and written whole

A record is data from wherever it came from: a field of the wrong type reads as unset and is named
in `problems`, a key this version does not know is kept in `extra` (and written back), so a newer
raydra's or a damaged record still reads; a file is written whole, secrets masked, as strict JSON.
Only the standard library and raydra.storage are imported.
"""

import dataclasses
import enum
import json
import math
import time
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Tuple, TypeVar

from raydra.errors import RaydraError, out_of_space
from raydra.storage import replacing


class Status(enum.StrEnum):
    """How a piece of work stands, as its record says it (a string in the file, as before the enum)."""

    RUNNING = "running"  # under way, or its driver died
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # Ctrl-C, SIGTERM, a time limit: it can be continued
    STOPPED = "stopped"  # a trial its sweep's scheduler ended early
    PRUNED = "pruned"  # a multirun job its sweeper stopped early (an Optuna pruner's decision)
    QUEUED = "queued"  # a multirun's job waiting for room on the cluster
    NOT_STARTED = "not started"  # a multirun's job that the multirun's end came before
    KEPT = "kept"  # a resumed multirun's job that had completed: not run again
    RESUMED_ELSEWHERE = "resumed elsewhere"  # an invocation that continued another sweep (tune.resume=)


RUNNING, COMPLETED, FAILED, INTERRUPTED, STOPPED = Status.RUNNING, Status.COMPLETED, Status.FAILED, Status.INTERRUPTED, Status.STOPPED
PRUNED = Status.PRUNED


def now() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


@dataclass(frozen=True)
class Resumption:
    """One resume= (or resumed sweep or multirun) of the work: when, from what, and that invocation's log."""

    at: Optional[str] = None
    from_status: Optional[str] = None
    log: Optional[str] = None


E = TypeVar("E", bound="Envelope")


@dataclass(frozen=True)
class Envelope:
    """What every record says of its work: how it stands and why, when it started and ended, and its
    resumptions. Each record (raydra.records.summary.RunRecord, .sweep.SweepRecord, .jobs.JobsRecord)
    adds its own fields after these; the file format is each record's own (FORMAT)."""

    format: int = 2
    status: Optional[Status] = Status.RUNNING
    # One line saying why the work failed or was interrupted (with the command that continues it).
    error: Optional[str] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    wall_time_s: Optional[float] = None
    resumed: List[Resumption] = field(default_factory=list)
    # Keys this version does not know (a newer raydra's), kept as they were.
    extra: Dict[str, Any] = field(default_factory=dict)
    # What did not read (a field of the wrong type): never written.
    problems: Tuple[str, ...] = ()

    # The record file's format, and how the work can end.
    FORMAT: ClassVar[int] = 2
    ENDS: ClassVar[Tuple[Status, ...]] = (Status.COMPLETED, Status.FAILED, Status.INTERRUPTED)

    @classmethod
    def started(cls: typing.Type[E], **fields: Any) -> E:
        """The work's first record: running, started now."""
        return cls(status=Status.RUNNING, started_at=now(), **fields)

    @property
    def ended(self) -> bool:
        return self.status in self.ENDS

    def failed(self: E, reason: Optional[str], started: Optional[float] = None) -> E:
        return self._ended(Status.FAILED, reason, started)

    def interrupted(self: E, reason: Optional[str], started: Optional[float] = None, **fields: Any) -> E:
        """Ctrl-C, SIGTERM, a time limit: `reason` names the command that continues the work."""
        return self._ended(Status.INTERRUPTED, reason, started, **fields)

    def settled(self: E, ending: Any, started: Optional[float] = None, **fields: Any) -> E:
        """The record as a raydra.run.lifecycle Ending that is no completion left the work: failed
        or interrupted, with the ending's sentence (`fields`: what the record adds to that)."""
        if ending.status == Status.INTERRUPTED:
            return self.interrupted(ending.reason, started, **fields)
        if ending.status == Status.FAILED:
            return self._ended(Status.FAILED, ending.reason, started, **fields)
        raise ValueError(f"a {ending.status} ending is recorded with the work's outcome, not settled")

    def resumed_from_here(self: E, log: Optional[str] = None) -> E:
        """The work continues (a resumed sweep or multirun): running again, the resumption (from the
        status it had, with the log of the invocation) added to its history."""
        resumption = Resumption(at=now(), from_status=self.status, log=log)
        return dataclasses.replace(self, status=Status.RUNNING, error=None, finished_at=None, resumed=[*self.resumed, resumption])

    def _ended(self: E, status: Status, error: Optional[str], started: Optional[float], **fields: Any) -> E:
        """The one place a record's status changes from running: the wall time from `started` (a
        time.time()), or the one recorded."""
        wall = round(time.time() - started, 2) if started is not None else self.wall_time_s
        return dataclasses.replace(self, status=status, error=error, finished_at=now(), wall_time_s=wall, **fields)

    def to_dict(self) -> Dict[str, Any]:
        return to_json_object(self)

    @classmethod
    def from_dict(cls: typing.Type[E], data: Any) -> E:
        """A record as read from its file (any format so far). Raises RecordError for what is no
        record at all (not a JSON object)."""
        return from_json_object(cls, data, cls.FORMAT)


class RecordError(RaydraError):
    """A summary.json that cannot be read as a run record."""


def read_record(kind: Any, path: Path, what: str, pass_instead: str) -> Any:
    """The record of type `kind` (RunRecord, SweepRecord, JobsRecord: a dataclass with from_dict)
    in the file `path`. A missing, truncated or non-object file is refused in one sentence naming it
    (RecordError): `what` names the record, `pass_instead` what to pass."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecordError(f"{path} does not exist; pass {pass_instead}.") from None
    except UnicodeDecodeError as error:
        raise RecordError(f"{path} is not a readable {what} ({error}); it was cut short or is not raydra's.") from None
    return parse_record(kind, text, str(path), what)


def parse_record(kind: Any, text: str, where: str, what: str) -> Any:
    """The record of type `kind` from a record file's text, read from `where` (for the sentence)."""
    try:
        return kind.from_dict(json.loads(text))
    except ValueError as error:
        raise RecordError(f"{where} is not a readable {what} ({error}); it was cut short or is not raydra's.") from None
    except RecordError as error:
        raise RecordError(f"{where} is not a readable {what} ({error}); it is not raydra's.") from None


def write_json(path: Path, content: Any) -> None:
    """A record file (summary.json, sweep.json, jobs.json) written whole: the previous one stays
    until the new one is, and a half-written one goes. Secrets are masked: overrides and errors can
    carry a key typed on the command line."""
    from raydra.redact import redact

    content = to_json_numbers(redact(content))
    try:
        with replacing(path) as tmp:
            # allow_nan=False: Python would write NaN and Infinity, which no other JSON reader takes.
            Path(tmp).write_text(json.dumps(content, indent=2, sort_keys=False, default=str, allow_nan=False) + "\n")
    except OSError as error:
        full = out_of_space(error, path, path.name)
        if full:
            raise full from None
        raise


# The strings a number that is not finite is written as (JSON has no such numbers), and back.
NOT_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def to_json_numbers(value: Any) -> Any:
    """`value` (a record file's JSON object) with every number that is not finite written as its
    string in NOT_FINITE."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {key: to_json_numbers(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_numbers(item) for item in value]
    return value


def from_json_number(value: Any) -> Any:
    """A value where a record holds a number: one of NOT_FINITE's strings as its number, anything
    else as it is."""
    return NOT_FINITE[value] if isinstance(value, str) and value in NOT_FINITE else value


def from_json_object(kind: Any, data: Any, format: int) -> Any:
    """A record of type `kind` (a frozen dataclass with `format`, `extra` and `problems` fields) from a
    record file's JSON object, as format `format` (the caller reads older formats on from there). A
    field of the wrong type reads as unset and is named in `problems`; a key `kind` does not know is
    kept in `extra`. Raises RecordError for what is no record at all (not a JSON object)."""
    if not isinstance(data, dict):
        raise RecordError(f"it holds a JSON {type(data).__name__}, not an object")
    problems: List[str] = []
    fields = {}
    hints = typing.get_type_hints(kind)
    for f in dataclasses.fields(kind):
        if f.name in ("extra", "problems") or f.name not in data:
            continue
        value, ok = _read(hints[f.name], data[f.name])
        if ok:
            fields[f.name] = value
        else:
            name = _type_name(hints[f.name])
            problems.append(f"{f.name} is not {name if name.startswith('one of') else 'a ' + name} ({data[f.name]!r:.60})")
    known = {f.name for f in dataclasses.fields(kind)}
    extra = {key: value for key, value in data.items() if key not in known}
    fields.pop("format", None)
    return kind(format=format, extra=extra, problems=tuple(problems), **fields)


def to_json_object(record: Any) -> Dict[str, Any]:
    """A record (see from_json_object) as its file's JSON object: its fields, then the keys it kept."""
    out: Dict[str, Any] = {}
    for f in dataclasses.fields(record):
        if f.name in ("extra", "problems"):
            continue
        out[f.name] = _plain(getattr(record, f.name))
    out.update({key: value for key, value in record.extra.items() if key not in out})
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    return value


def _read(kind: Any, value: Any) -> Tuple[Any, bool]:
    """`value` as `kind` (the field's annotation), and whether it was one."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value, True
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None, True
        return _read(next(a for a in args if a is not type(None)), value)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            return None, False
        hints = typing.get_type_hints(kind)
        known = {f.name for f in dataclasses.fields(kind)}
        parts = {}
        for key, item in value.items():
            if key in known:
                read_item, ok = _read(hints[key], item)
                if ok:
                    parts[key] = read_item
        return kind(**parts), True
    if origin in (list, List):
        if not isinstance(value, list):
            return None, False
        read_items = [_read(args[0], item) for item in value]
        return [item for item, ok in read_items if ok], True
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            return None, False
        if args and dataclasses.is_dataclass(args[1]):
            # A map of records (jobs.json's jobs by number): an entry that is no object is left out.
            read_items = {key: _read(args[1], item) for key, item in value.items()}
            return {key: item for key, (item, ok) in read_items.items() if ok}, True
        return value, True
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value), True
        except ValueError:
            return None, False
    if kind is float:
        value = from_json_number(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return (value, True) if ok else (None, False)
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return (value, True) if ok else (None, False)
    return (value, True) if isinstance(value, kind) else (None, False)


def _type_name(kind: Any) -> str:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    inner = args[0] if typing.get_origin(kind) is typing.Union and args else kind
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return "one of " + ", ".join(str(member.value) for member in inner)
    return {str: "string", int: "whole number", float: "number", bool: "true or false"}.get(
        inner, getattr(typing.get_origin(inner), "__name__", getattr(inner, "__name__", str(inner)))
    )
