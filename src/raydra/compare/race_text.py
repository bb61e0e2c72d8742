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
        f"(min_seeds {said(record.min_seeds)}, max_seeds {said(record.max_seeds)}), alpha {said(record.alpha)}, "
        f"futility {said(record.futility)}"
    ]
    if record.winner is not None:
        standing = lambda which: [name(c) for c, config in enumerate(configs) if config.standing == which]  # noqa: E731
        how = []
        if standing("out of reach"):
            how.append(f"{', '.join(standing('out of reach'))} out of reach (not beaten beyond noise)")
        if standing("undecided"):
            how.append(f"undecided within max_seeds against {', '.join(standing('undecided'))}")
        lines.append(f"  winner  {name(record.winner)}: {'; '.join(how) if how else 'it beat every other beyond noise'}")
    elif record.stopped:
        lines.append(f"  no verdict: {record.stopped}")
    else:
        lines.append(f"  no verdict yet ({record.status}): continue it with hydra.launcher.resume=true")
    advantage = f"leader's advantage [{level}CI]"
    rows = [("configuration", "standing", "seeds", "mean ± sd", advantage, "p (adjusted)", "chance to overtake")]
    order = sorted(range(len(configs)), key=lambda c: (configs[c].standing != "winner", _rank(configs[c], record.mode)))
    for c in order:
        config = configs[c]
        values = list(config.results.values())
        spread = f"{config.mean:.4g} ± {statistics.stdev(values):.2g}" if len(values) > 1 and config.mean is not None else "-"
        standing = config.standing
        against = config.against_leader
        if standing in ("dropped", "out of reach") and against is not None:
            standing = f"{standing} at {against.seeds}"
        versus = p = overtake = ""
        if against is not None and against.advantage is not None and len(against.ci) == 2:
            versus = f"{against.advantage:.4g} [{against.ci[0]:.3g}, {against.ci[1]:.3g}]"
            p = f"{against.p:.2g}" if against.p is not None else "-"
            overtake = _chance(against.overtake)
        rows.append((name(c), standing, str(len(values)), spread, versus, p, overtake))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.rjust(widths[i]) if i == 2 else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append(("  " + "  ".join(cells)).rstrip())
    if record.grid_jobs:
        spent = (
            f"  jobs    {record.jobs_started} started of the full grid's {record.grid_jobs} ({record.jobs_started / record.grid_jobs:.0%})"
        )
        if record.worker_s is not None and record.grid_worker_s:
            spent += f"; {hours(record.worker_s)} worker-h against the grid's {hours(record.grid_worker_s)} (estimated: each configuration's mean job x max_seeds)"
        lines.append(spent)
    return lines


def _chance(overtake: object) -> str:
    if not isinstance(overtake, (int, float)):
        return ""
    return "<0.1%" if overtake < 0.0005 else f"{overtake:.1%}"


def _rank(config: race_record.Configuration, mode: object) -> float:
    if config.mean is None:
        return float("inf")
    return -config.mean if mode == "max" else config.mean
