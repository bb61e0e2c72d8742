"""Runs that differ only by seed, aggregated: per group n, mean ± standard deviation and a 95%
confidence interval of each metric, and each group's difference to a baseline group with its
confidence interval and Welch's t-test p-value (scipy, imported only here and only when grouping).

A run's value of a metric is its best (final when no best is recorded: test metrics), the number a
results table reports. Seeds are independent samples of the same configuration, so a group's
spread is seed noise, and a difference whose interval holds 0 is within it.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from raydra.compare.recorded_run import RecordedRun
from raydra.compare.run_text import config_text
from raydra.compare.table import metric_mode, metric_values
from raydra.config.keys import ABSENT

SEED_KEY = "seed"
CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE


@dataclass
class Stats:
    n: int
    mean: Optional[float]
    std: Optional[float]  # sample standard deviation (n - 1); None for one run
    ci: Optional[Tuple[float, float]]


@dataclass
class Difference:
    diff: float
    ci: Optional[Tuple[float, float]]
    p: Optional[float]
    verdict: str


@dataclass
class Group:
    key: Tuple[Tuple[str, Any], ...]  # ((config key, value), ...) the group's runs share
    runs: List[RecordedRun] = field(default_factory=list)
    values: Dict[str, List[float]] = field(default_factory=dict)  # metric -> one value per run that has it
    stats: Dict[str, Stats] = field(default_factory=dict)
    vs_baseline: Dict[str, Difference] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return " ".join(f"{k}={'absent' if v is ABSENT else config_text(v)}" for k, v in self.key) or "all runs"


def default_group_by(keys: List[str]) -> Optional[List[str]]:
    """Group by every differing key except seed when the runs differ by seed; else no grouping."""
    return [k for k in keys if k != SEED_KEY] if SEED_KEY in keys else None


def run_value(run: RecordedRun, metric: str, mode: str, notes: List[str]) -> Optional[float]:
    final, best = metric_values(run, metric, mode, notes)
    return best if best is not None else final


def describe(values: Sequence[float]) -> Stats:
    n = len(values)
    if n == 0:
        return Stats(0, None, None, None)
    mean = sum(values) / n
    if n == 1:
        return Stats(1, mean, None, None)
    from scipy import stats

    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(1 - ALPHA / 2, n - 1) * std / math.sqrt(n)
    return Stats(n, mean, std, (mean - half, mean + half))


def welch(group: Sequence[float], baseline: Sequence[float], mode: str) -> Difference:
    """group - baseline, its Welch-Satterthwaite interval and Welch's t-test p-value, in words."""
    from scipy import stats

    diff = sum(group) / len(group) - sum(baseline) / len(baseline)
    if len(group) < 2 or len(baseline) < 2:
        return Difference(diff, None, None, "too few seeds to tell (needs 2+ runs in both groups)")
    v1, v2 = (describe(g).std ** 2 / len(g) for g in (group, baseline))
    se = math.sqrt(v1 + v2)
    if se == 0:
        same = diff == 0
        return Difference(diff, (diff, diff), 1.0 if same else 0.0, "identical to the baseline" if same else "differs with no seed noise")
    df = (v1 + v2) ** 2 / (v1**2 / (len(group) - 1) + v2**2 / (len(baseline) - 1))
    half = stats.t.ppf(1 - ALPHA / 2, df) * se
    p = float(stats.ttest_ind(group, baseline, equal_var=False).pvalue)
    if p >= ALPHA:
        verdict = f"within seed noise (p={p:.2g})"
    else:
        better = (diff > 0) == (mode == "max")
        verdict = f"{'better' if better else 'worse'} than the baseline beyond seed noise (p={p:.2g})"
    return Difference(diff, (diff - half, diff + half), p, verdict)


def build_groups(runs: List[RecordedRun], by: List[str], metrics: List[str], notes: List[str]) -> List[Group]:
    """Runs grouped by their values of `by` (a run without a key is in its own `absent` group), in
    order of first appearance, each with its metrics' statistics."""
    modes = {m: metric_mode(m, runs) for m in metrics}
    groups: Dict[Tuple, Group] = {}
    pruned = 0
    for run in runs:
        key = tuple((k, run.flat.get(k, ABSENT)) for k in by)
        # Hash by the value as typed, so lists and dicts group too.
        group = groups.setdefault(tuple((k, config_text(v) if v is not ABSENT else ABSENT) for k, v in key), Group(key))
        group.runs.append(run)
        if run.status == "pruned":
            # Stopped by its sweeper partway (a pruner, a seed race's dropped configuration): its
            # metrics are where it stopped, not a sample of what the configuration reaches.
            pruned += 1
            continue
        for metric in metrics:
            value = run_value(run, metric, modes[metric], notes)
            if value is not None:
                group.values.setdefault(metric, []).append(value)
    for group in groups.values():
        group.stats = {m: describe(group.values.get(m, [])) for m in metrics}
    if pruned:
        notes.append(f"{pruned} run(s) pruned by their sweeper are in the groups' runs but not in their statistics (stopped partway).")
    return list(groups.values())


def find_baseline(groups: List[Group], asked: str) -> Group:
    """The group `asked` names: KEY=VALUE[,KEY=VALUE...] matching its keys as the table shows
    them, or its number in the table (1-based)."""
    if asked.isdigit() and 1 <= int(asked) <= len(groups):
        return groups[int(asked) - 1]
    wanted = {}
    for part in asked.split(","):
        k, sep, v = part.partition("=")
        if not sep:
            raise ValueError(f"--baseline {asked!r} is not KEY=VALUE or a group number; write it like --baseline model.optimizer.lr=0.01.")
        wanted[k.strip()] = v.strip()
    found = [
        g for g in groups if all(k in dict(g.key) and v in (str(dict(g.key)[k]), config_text(dict(g.key)[k])) for k, v in wanted.items())
    ]
    if len(found) != 1:
        labels = "; ".join(g.label for g in groups)
        how = "matches no group" if not found else f"matches {len(found)} groups"
        raise ValueError(f"--baseline {asked!r} {how}; name one group by its keys (groups: {labels}).")
    return found[0]


def compare_to(groups: List[Group], baseline: Group, metrics: List[str], runs: List[RecordedRun]) -> None:
    for metric in metrics:
        base = baseline.values.get(metric, [])
        mode = metric_mode(metric, runs)
        for group in groups:
            mine = group.values.get(metric, [])
            if group is not baseline and mine and base:
                group.vs_baseline[metric] = welch(mine, base, mode)


def fmt(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.4g}"


def group_columns(by: List[str], metrics: List[str], baseline: bool) -> List[str]:
    columns = ["group", "n"]
    for m in metrics:
        columns += [m, f"{m} 95% CI"]
        if baseline:
            columns += [f"Δ {m}", f"Δ {m} 95% CI", f"p {m}"]
    return columns + (["vs baseline"] if baseline else []) + list(by)


def group_rows(groups: List[Group], by: List[str], metrics: List[str], baseline: Optional[Group]) -> List[Dict[str, Any]]:
    """One row per group: display text for the table, numbers kept raw under `_raw` for exports."""
    rows = []
    for i, group in enumerate(groups, 1):
        counted = sum(r.status != "pruned" for r in group.runs)
        row: Dict[str, Any] = {"group": str(i), "n": str(counted)}
        raw: Dict[str, Any] = {"group": group.label, "n": counted, "runs": [r.source for r in group.runs]}
        raw["keys"] = {k: v for k, v in group.key if v is not ABSENT}
        for m in metrics:
            s = group.stats[m]
            row[m] = "" if s.mean is None else fmt(s.mean) + (f" ± {fmt(s.std)}" if s.std is not None else "")
            row[f"{m} 95% CI"] = f"[{fmt(s.ci[0])}, {fmt(s.ci[1])}]" if s.ci else ""
            raw[m] = {"n": s.n, "mean": s.mean, "std": s.std, "ci95": list(s.ci) if s.ci else None}
            if baseline is not None:
                d = group.vs_baseline.get(m)
                row[f"Δ {m}"] = "baseline" if group is baseline else f"{d.diff:+.4g}" if d else ""
                row[f"Δ {m} 95% CI"] = f"[{d.ci[0]:+.4g}, {d.ci[1]:+.4g}]" if d and d.ci else ""
                row[f"p {m}"] = f"{d.p:.2g}" if d and d.p is not None else ""
                if d:
                    raw[f"Δ {m}"] = {"diff": d.diff, "ci95": list(d.ci) if d.ci else None, "p": d.p, "verdict": d.verdict}
        if baseline is not None:
            first = group.vs_baseline.get(metrics[0]) if metrics else None
            row["vs baseline"] = "baseline" if group is baseline else first.verdict if first else ""
        for k, v in group.key:
            row[k] = "absent" if v is ABSENT else config_text(v)
        row["_raw"] = raw
        rows.append(row)
    return rows


def choose_group_by(asked: Optional[List[str]], keys: List[str], runs: List[RecordedRun], notes: List[str]) -> Optional[List[str]]:
    """The keys to group by: as asked (`none` turns grouping off), else the default."""
    if not asked:
        return default_group_by(keys)
    by = [k.strip() for item in asked for k in item.split(",") if k.strip()]
    if by == ["none"]:
        return None
    for k in by:
        if not any(k in r.flat or k in r.choices for r in runs):
            notes.append(f"no run has config key {k!r}, so --group-by {k} puts every run in one group; check its spelling.")
    return by


def render_groups(fmt_name: str, columns: List[str], rows: List[Dict[str, Any]]) -> str:
    from raydra.compare.table import RENDERERS

    if fmt_name == "json":
        import json

        return json.dumps([row["_raw"] for row in rows], indent=2, default=str)
    if fmt_name == "csv":
        import csv
        import io

        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([row[c] for c in columns] for row in rows)
        return out.getvalue().rstrip("\n")
    return RENDERERS[fmt_name](columns, [(None, row) for row in rows], [])


@dataclass
class Grouped:
    by: List[str]
    groups: List[Group]
    baseline: Optional[Group]
    columns: List[str]
    rows: List[Dict[str, Any]]
    heading: str


def aggregate(
    runs: List[RecordedRun], keys: List[str], metrics: List[str], asked: Optional[List[str]], baseline: Optional[str], notes: List[str]
) -> Optional[Grouped]:
    """The grouped view `raydra compare` shows, or None for one row per run. Raises ValueError for
    a --baseline that names no group."""
    by = choose_group_by(asked, keys, runs, notes)
    if by is None:
        if baseline:
            notes.append("--baseline needs groups (runs that differ by seed, or --group-by KEY); it is ignored.")
        return None
    groups = build_groups(runs, by, metrics, notes)
    base = find_baseline(groups, baseline) if baseline else None
    if base is not None:
        compare_to(groups, base, metrics, runs)
    columns = group_columns(by, metrics, base is not None)
    rows = group_rows(groups, by, metrics, base)
    how = "by " + ", ".join(by) if by else "into one group"
    heading = f"{len(runs)} runs in {len(groups)} groups {how}; each metric: mean ± sd over the group's runs (best, else final), 95% CI of the mean"
    return Grouped(by, groups, base, columns, rows, heading + ("" if asked else " (--group-by none: one row per run)"))
