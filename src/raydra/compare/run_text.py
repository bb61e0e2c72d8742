"""A run's record in words, as show, the table and the HTML report put it: a config value as typed
in an override, the status with its reason, the hangs and stragglers the watchdog recorded, the
files a person looks for."""

import json
from typing import Any, List, Optional, Tuple

from raydra.compare.recorded_run import RecordedRun, number
from raydra.records import layout
from raydra.records.summary import Checkpoints, RunRecord


def config_text(value: Any) -> str:
    """A config value as it would be typed in an override: null, true, 0.001, [1, 2]."""
    if value is None or isinstance(value, (bool, list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def status_text(run: RecordedRun) -> str:
    """The status with its reason: "failed: CUDA out of memory", "interrupted by the user"; and
    what the watchdog found on the way: "completed (hung 1x, restarted; straggler: rank 3)"."""
    if not run.error or run.status == "completed":
        return run.status + watchdog_note(run.recorded)
    error = " ".join(str(run.error).split())
    return error if error.lower().startswith(run.status.lower()) else f"{run.status}: {error}"


def watchdog_note(recorded: RunRecord) -> str:
    """The hangs a run restarted from and the stragglers named in it, in a few words (or nothing)."""
    said = []
    restarted = [h for h in recorded.hangs if h.outcome == "restarted"]
    if restarted:
        said.append(f"hung {len(restarted)}x, restarted")
    if recorded.stragglers:
        said.append("straggler: " + ", ".join(f"rank {s.rank}" for s in recorded.stragglers))
    return f" ({'; '.join(said)})" if said else ""


def watchdog_lines(recorded: RunRecord) -> List[str]:
    """`raydra show`'s account of each hang (where, which rank, how long, what came of it) and straggler."""
    lines = []
    for count, hang in enumerate(recorded.hangs, 1):
        ranks = ", ".join(f"rank {r.rank} on {r.node} (pid {r.pid}, still {number_text(r.still_s)} s)" for r in hang.stopped)
        lines.append(
            f"  hang {count}  {hang.at}: {hang.where}, waited {number_text(hang.waited_s)} s of a {number_text(hang.deadline_s)} s deadline"
        )
        lines.append(f"          stopped: {ranks or 'no rank named'}; {hang.outcome or '?'}; stacks in {hang.diagnostics}")
    for s in recorded.stragglers:
        lines.append(
            f"  straggler rank {s.rank} on {s.node}: {number_text(s.lag_s)} s late to each step of {number_text(s.step_time_s)} s "
            f"(at worst {number_text((s.share or 0) * 100)}%), steps {s.first_step}-{s.last_step}"
        )
    return lines


def number_text(value: Any) -> str:
    """A recorded number as a person reads it ("?" for one that is missing or not a number)."""
    found = number(value)
    return "?" if found is None else f"{found:.3g}"


def run_files(run: RecordedRun) -> List[Tuple[str, str, Optional[bool]]]:
    """(what, location, exists) for the files a person looks for; paths summary.json names are kept
    even when gone (the run dir was moved), others only when present. exists is None for a URI
    outside the run's own listing: not checked."""
    checkpoints = run.record.checkpoints if run.record else Checkpoints()
    named = [(f"{which} checkpoint", getattr(checkpoints, which)) for which in ("best", "last")]
    files = [(what, *run.locate(p)) for what, p in named if p]
    recorded_dir = checkpoints.dir
    if isinstance(recorded_dir, str) and recorded_dir:
        location, exists = run.locate(recorded_dir)
        if exists is not False:
            files.append(("checkpoints", location, exists))
    elif run.has(layout.CHECKPOINTS):
        files.append(("checkpoints", run.where(layout.CHECKPOINTS), True))
    own = [
        ("metrics.csv", layout.METRICS),
        ("samples", layout.SAMPLES),
        ("wandb", layout.WANDB),
        ("driver log", layout.DRIVER_LOG),
        ("logs", layout.LOGS),
        ("diagnostics", layout.DIAGNOSTICS),
        ("config", layout.CONFIG),
        ("summary", layout.SUMMARY),
    ]
    return files + [(what, run.where(relative), True) for what, relative in own if run.has(relative)]
