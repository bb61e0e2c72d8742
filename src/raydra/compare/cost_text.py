"""The ledger in words: a sweep's or multirun's own figures, printed after `raydra compare --cost`'s
table (sweep.json's or jobs.json's `ledger`), and one run's ledger in `raydra show`.

    group_blocks    for each sweep or multirun directory compare was given: what the group held
                    (slots x wall), what its runs used, its idle slots, what the runs that did not
                    complete cost (by status) and its best run's cost alone
    ledger_lines    a run's allocated hours and goodput, each bucket with seconds in it, each restart

Nothing but the standard library and raydra's record readers: no torch, Ray or Hydra.
"""

import dataclasses
import glob
import os
from typing import Dict, List, Optional, Sequence, Tuple

from raydra.compare.cost import Money, Prices, finite
from raydra.records import jobs as jobs_record
from raydra.records import layout
from raydra.records import sweep as sweep_record
from raydra.records.envelope import RecordError
from raydra.records.ledger import BUCKETS, GroupLedger, Ledger, hours, share
from raydra.storage import is_uri


def group_dirs(paths: Sequence[str]) -> List[Tuple[str, str]]:
    """(directory, record file) for each path given (or a glob's match) that is a sweep directory
    (sweep.json) or a multirun's (jobs.json), on a disk; each once."""
    found: Dict[str, Tuple[str, str]] = {}
    for arg in paths:
        if is_uri(str(arg)):
            continue
        path = os.path.expanduser(str(arg))
        matches = sorted(glob.glob(path)) if any(c in path for c in "*?[") and not os.path.exists(path) else [path]
        for match in matches:
            for name in (layout.SWEEP, layout.JOBS_RECORD):
                if os.path.isfile(os.path.join(match, name)):
                    found.setdefault(os.path.realpath(match), (match, name))
                    break
    return list(found.values())


def group_blocks(paths: Sequence[str], prices: Prices, notes: List[str]) -> List[str]:
    """The lines each sweep or multirun directory among `paths` gets after the table: what it held,
    what its runs used, its idle slots, what the runs that did not complete cost, and its best run's."""
    lines: List[str] = []
    for where, name in group_dirs(paths):
        try:
            record = sweep_record.read(where) if name == layout.SWEEP else jobs_record.read(where)
        except (RecordError, OSError) as error:
            notes.append(f"{error}".rstrip(".") + "; its cost is not shown.")
            continue
        if getattr(record, "continues_another", False):
            continue
        lines += ["", *group_block(where, name, sound_group(record.ledger), prices)]
    return lines


def sound_group(ledger: Optional[GroupLedger]) -> Optional[GroupLedger]:
    """The group's ledger with a figure that is not a number (a damaged record's) unset."""
    if ledger is None:
        return None
    seconds = {k: finite(getattr(ledger, k)) for k in ("wall_s", "allocated_s", "runs_s", "idle_s", "best_s")}
    figures = lambda d: {str(k): float(v) for k, v in d.items() if finite(v) is not None} if isinstance(d, dict) else {}  # noqa: E731
    return dataclasses.replace(ledger, **seconds, buckets=figures(ledger.buckets), not_completed_s=figures(ledger.not_completed_s))


def group_block(where: str, name: str, ledger: Optional[GroupLedger], prices: Prices) -> List[str]:
    if ledger is None:
        return [f"{name} of {where}: no ledger (written before raydra kept one)"]
    unit = "GPU-h" if ledger.gpu else "worker-h"
    price = prices.of(ledger.gpu)

    def line(label: str, seconds: Optional[float], detail: str = "") -> str:
        money = f"; cost {Money(seconds / 3600 * price).text()}" if price is not None and seconds is not None else ""
        return f"  {label:<15}{hours(seconds)} {unit}{detail}{money}"

    slots = ledger.slots if ledger.slots is not None else "?"
    goodput = ledger.goodput
    failed = ledger.not_completed_s
    lines = [
        f"{name} of {where}: {ledger.runs if ledger.runs is not None else '?'} runs on {slots} slots, {_seconds(ledger.wall_s)} wall",
        line("held", ledger.allocated_s, f" ({slots} slots x {_seconds(ledger.wall_s)})"),
        line("runs", ledger.runs_s, f", goodput {goodput:.0%}" if goodput is not None else ""),
        line("idle slots", ledger.idle_s, f", {share(ledger.idle_s, ledger.allocated_s) if ledger.idle_s is not None else '?'} of held"),
        line("not completed", sum(failed.values()), " (" + ", ".join(f"{s} {hours(v)}" for s, v in failed.items()) + ")")
        if failed
        else "  not completed  none",
    ]
    if ledger.best is not None:
        lines.append(line("best run", ledger.best_s, f" ({ledger.best}, alone)"))
    return lines


def _seconds(value: Optional[float]) -> str:
    return "?" if value is None else f"{value:.0f} s"


# -- raydra show ----------------------------------------------------------------------------------


def ledger_lines(ledger: Optional[Ledger]) -> List[str]:
    """A run's ledger in a few lines: its allocated hours and goodput, each bucket with seconds in it
    and its share, each restart; nothing for a record without one."""
    if ledger is None:
        return []
    unit = "GPU-hours" if ledger.gpu else "worker-hours"
    goodput = ledger.goodput
    head = f"ledger    {hours(ledger.allocated_s)} {unit} ({ledger.workers or '?'} workers x {_seconds(ledger.wall_s)})"
    lines = [head + (f", goodput {goodput:.0%}" if goodput is not None else ", goodput unknown")]
    named = [b for b in BUCKETS if ledger.buckets.get(b, 0.0) > 0] + [
        b for b in ledger.buckets if b not in BUCKETS and ledger.buckets[b] > 0
    ]
    for bucket in named:
        seconds = ledger.buckets[bucket]
        lines.append(f"  {bucket:<20}{seconds:>12.1f} s  {share(seconds, ledger.allocated_s):>4}")
    for r in ledger.restarts:
        lines.append(
            f"  attempt {_step(r.attempt)} restarted from step {_step(r.from_step)} (the group before had reached step "
            f"{_step(r.reached_step)}): lost {_number(r.lost_s)} s, restart {_number(r.restart_s)} s"
        )
    if ledger.unseen:
        lines.append(f"  not split by bucket: {ledger.unseen}")
    return lines


def _step(value: Optional[int]) -> str:
    return "?" if value is None else str(value)


def _number(value: Optional[float]) -> str:
    return "?" if value is None else f"{value:.1f}"
