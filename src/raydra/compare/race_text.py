"""A seed race's verdict in words (race.json, hydra/sweeper=race): the lines the race closes with
and `raydra compare <race dir>` prints after its table.

    race_lines    one race's verdict: the winner, each configuration's standing, seeds, mean and
                  sd, the leader's advantage with its CI and adjusted p; the jobs and worker-hours
                  spent against the full max_seeds grid
    race_blocks   race_lines for each race directory among compare's paths

Nothing but the standard library and raydra's record readers: no torch, Ray or Hydra.
"""

import os
import statistics
from typing import List, Sequence

from raydra.compare.cost_text import group_dirs
from raydra.records import layout
from raydra.records import race as race_record
from raydra.records.envelope import RecordError
from raydra.records.ledger import hours


def race_blocks(paths: Sequence[str], notes: List[str]) -> List[str]:
    lines: List[str] = []
    for where, _ in group_dirs(paths):
        if not os.path.isfile(os.path.join(where, layout.RACE_RECORD)):
            continue
        try:
            record = race_record.read(where)
        except (RecordError, OSError) as error:
            notes.append(f"{error}".rstrip(".") + "; its verdict is not shown.")
            continue
        lines += ["", *race_lines(record, where)]
    return lines


def race_lines(record: race_record.RaceRecord, where: str) -> List[str]:
    configs = record.configurations
    name = lambda c: " ".join(configs[c].overrides) if 0 <= c < len(configs) else f"#{c}"  # noqa: E731
    seeds = f"{record.seeds[0]}-{record.seeds[-1]}" if record.seeds else "?"
    # A setting a damaged record does not say shows as "?" (RaceRecord leaves it None).
    said = lambda value: "?" if value is None else f"{value:g}" if isinstance(value, float) else str(value)  # noqa: E731
    level = "" if record.alpha is None else f"{1 - record.alpha:.0%} "
    lines = [
        f"race of {where}: {record.metric} ({record.mode}), {len(configs)} configurations, {said(record.seed_name)} {seeds} "
        f"(min_seeds {said(record.min_seeds)}, max_seeds {said(record.max_seeds)}), alpha {said(record.alpha)}"
    ]
    if record.winner is not None:
        undecided = [c for c, config in enumerate(configs) if config.standing == "undecided"]
        how = (
            "it beat every other beyond noise"
            if record.decided
            else f"undecided within max_seeds against {', '.join(name(c) for c in undecided)}"
        )
        lines.append(f"  winner  {name(record.winner)}: {how}")
    elif record.stopped:
        lines.append(f"  no verdict: {record.stopped}")
    else:
        lines.append(f"  no verdict yet ({record.status}): continue it with hydra.launcher.resume=true")
    width = max([len(name(c)) for c in range(len(configs))] + [13])
    lines.append(f"  {'configuration':<{width}}  {'standing':<13} seeds  {'mean ± sd':<19}  leader's advantage [{level}CI] p (adjusted)")
    order = sorted(range(len(configs)), key=lambda c: (configs[c].standing != "winner", _rank(configs[c], record.mode)))
    for c in order:
        config = configs[c]
        values = list(config.results.values())
        spread = f"{config.mean:.4g} ± {statistics.stdev(values):.2g}" if len(values) > 1 and config.mean is not None else "-"
        standing = config.standing
        against = config.against_leader
        if standing == "dropped" and against is not None:
            standing = f"dropped at {against.seeds}"
        if against is not None and against.advantage is not None and len(against.ci) == 2:
            versus = f"{against.advantage:.4g} [{against.ci[0]:.3g}, {against.ci[1]:.3g}]"
            p = f"{against.p:.2g}" if against.p is not None else "-"
        else:
            versus, p = "", ""
        lines.append(f"  {name(c):<{width}}  {standing:<13} {len(values):>5}  {spread:<19}  {versus:<25} {p}".rstrip())
    if record.grid_jobs:
        spent = (
            f"  jobs    {record.jobs_started} started of the full grid's {record.grid_jobs} ({record.jobs_started / record.grid_jobs:.0%})"
        )
        if record.worker_s is not None and record.grid_worker_s:
            spent += f"; {hours(record.worker_s)} worker-h against the grid's {hours(record.grid_worker_s)} (estimated: each configuration's mean job x max_seeds)"
        lines.append(spent)
    return lines


def _rank(config: race_record.Configuration, mode: object) -> float:
    if config.mean is None:
        return float("inf")
    return -config.mean if mode == "max" else config.mean
