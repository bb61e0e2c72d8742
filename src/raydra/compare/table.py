"""The comparison table: which metrics, which config keys, one row per run, and its text formats."""

import csv
import io
import json
import re
from typing import Any, Dict, List, Optional, Tuple

from raydra.compare.cost import Figure
from raydra.compare.recorded_run import TAGS_KEY, RecordedRun, number, read_curves
from raydra.compare.run_text import config_text, status_text
from raydra.config.keys import ABSENT

FIXED_COLUMNS = ("status", "wall_s", "samples/s")
TAGS_COLUMN = "tags"
MAX_CELL = 48


def metric_mode(metric: str, runs: List[RecordedRun]) -> str:
    """max or min: the monitor mode of a run that monitored this metric, else a guess from its name."""
    for run in runs:
        mode = run.recorded.monitor.mode
        if run.recorded.monitor.metric == metric and mode in ("max", "min"):
            return mode
    return "min" if re.search(r"loss|err|perplexity|time", metric) else "max"


def metric_values(run: RecordedRun, metric: str, mode: str, notes: List[str]) -> Tuple[Optional[float], Optional[float]]:
    """(final, best) from summary.json; from metrics.csv when the summary lacks the metric (a run that
    is still running, failed, or predates the summary)."""
    final = number(run.recorded.metrics.final.get(metric))
    best = number(run.recorded.metrics.best.get(metric))
    if final is None and best is None:
        values = [p[2] for p in read_curves(run, notes).get(metric, [])]
        if values:
            final, best = values[-1], (max if mode == "max" else min)(values)
    return final, best


def choose_metrics(runs: List[RecordedRun], asked: Optional[List[str]], notes: List[str]) -> List[str]:
    if not asked:
        monitors = [r.recorded.monitor.metric for r in runs]
        chosen = list(dict.fromkeys(m for m in monitors if isinstance(m, str) and m))
        if not chosen and runs:
            notes.append("no run's summary.json names a monitor metric; choose metrics with --metric NAME.")
        return chosen
    chosen = []
    for metric in dict.fromkeys(asked):
        in_summary = any(metric in part for r in runs for part in (r.recorded.metrics.final, r.recorded.metrics.best))
        if in_summary or any(metric in read_curves(r, notes) for r in runs):
            chosen.append(metric)
        else:
            known = ", ".join(known_metrics(runs, notes)) or "none"
            notes.append(f"no run has metric {metric!r} in summary.json or metrics.csv (known: {known}); its columns are left out.")
    return chosen


def known_metrics(runs: List[RecordedRun], notes: List[str]) -> List[str]:
    names = {}
    for run in runs:
        for part in ("final", "best"):
            names.update(dict.fromkeys(k for k in getattr(run.recorded.metrics, part) if k not in ("epoch", "step")))
        names.update(dict.fromkeys(read_curves(run, notes)))
    return sorted(names)


# ---------------------------------------------------------------------------------------------
# The table


def differing_keys(runs: List[RecordedRun]) -> List[str]:
    """The columns that tell the runs apart: config group choices that differ (`model`, `logger`),
    then config keys whose value is not the same in every run that has a config (a key some lack
    differs). A key under a differing group is left out when the choice explains it: runs with the
    same choice agree on it. A group is a column only when every run with a hydra.yaml records it.
    The root `tags` are not a key here: they have their own column, and never split seed groups."""
    flats = [r for r in runs if r.config is not None]
    if len(flats) < 2:
        return []
    # Compare canonical text, so 1 and true and 1.0 differ as they do in YAML.
    canon = lambda v: "\0absent" if v is ABSENT else json.dumps(v, sort_keys=True, default=str)  # noqa: E731
    chosen = [r for r in flats if r.choices]
    groups = []
    if len(chosen) >= 2:
        names = dict.fromkeys(g for r in chosen for g in r.choices)
        groups = [g for g in names if all(g in r.choices for r in chosen) and len({canon(r.choices[g]) for r in chosen}) > 1]
    keys = dict.fromkeys(k for r in flats for k in r.flat if k != TAGS_KEY)
    differing = [k for k in keys if len({canon(r.flat.get(k, ABSENT)) for r in flats}) > 1]

    def explained(key: str) -> bool:
        for group in groups:
            if key.startswith(group.replace("/", ".") + "."):
                by_choice: Dict[str, set] = {}
                for r in chosen:
                    by_choice.setdefault(canon(r.choices[group]), set()).add(canon(r.flat.get(key, ABSENT)))
                if all(len(values) == 1 for values in by_choice.values()):
                    return True
        return False

    return groups + [k for k in differing if not explained(k)]


def has_tags(runs: List[RecordedRun]) -> bool:
    return any(run.tags for run in runs)


def table_columns(keys: List[str], metrics: List[str], tags: bool = False) -> List[str]:
    """The run and its tags (when any run has tags: what the researcher called it); the metrics, what
    a reader looks for; then what set the runs apart; then how they ran."""
    named = ["run", TAGS_COLUMN] if tags else ["run"]
    return [*named, *(f"{part} {m}" for m in metrics for part in ("final", "best")), *keys, *FIXED_COLUMNS]


def build_table(
    runs: List[RecordedRun], metrics: List[str], keys: List[str], notes: List[str], sort: bool = False, descending: Optional[bool] = None
) -> List[Tuple[RecordedRun, Dict[str, Any]]]:
    """One (run, {column: raw value}) per run, in discovery order or sorted by the first metric."""
    rows = []
    modes = {m: metric_mode(m, runs) for m in metrics}
    for run in runs:
        row: Dict[str, Any] = {"run": run.label, TAGS_COLUMN: run.tags}
        row.update((k, run.value(k)) for k in keys)
        for metric in metrics:
            row[f"final {metric}"], row[f"best {metric}"] = metric_values(run, metric, modes[metric], notes)
        row["status"] = status_text(run)
        row["wall_s"] = number(run.recorded.wall_time_s)
        row["samples/s"] = number(run.recorded.throughput.get("samples_per_s"))
        rows.append((run, row))
    if (sort or descending is not None) and metrics:
        metric = metrics[0]
        reverse = descending if descending is not None else modes[metric] == "max"
        value = lambda row: row[f"best {metric}"] if row[f"best {metric}"] is not None else row[f"final {metric}"]  # noqa: E731
        # Runs without the value go last whichever way the rest is sorted.
        ranked = sorted((r for r in rows if value(r[1]) is not None), key=lambda r: value(r[1]), reverse=reverse)
        rows = ranked + [r for r in rows if value(r[1]) is None]
    elif sort or descending is not None:
        notes.append("--sort needs a metric and none was found; the runs are left in directory order.")
    return rows


def cell_text(column: str, value: Any, keys: List[str]) -> str:
    if value is ABSENT:
        return "absent"
    if value is None:
        return ""
    if column in keys:
        return config_text(value)
    if column == TAGS_COLUMN:
        return ", ".join(value)
    if isinstance(value, Figure):  # --cost's hours, shares and money
        return value.text()
    if isinstance(value, float):
        return f"{value:.1f}" if column in ("wall_s", "samples/s") else f"{value:.4g}"
    return str(value)


def export_text(column: str, value: Any, keys: List[str]) -> str:
    """Exports keep every digit, so they parse back to the same numbers; an absent key is an empty
    cell; tags are a JSON list, as a tag may hold a comma."""
    if value is None or value is ABSENT:
        return ""
    if column == TAGS_COLUMN:
        return json.dumps(value)
    return config_text(value) if column in keys else repr(value) if isinstance(value, float) else str(value)


def clip(text: str, width: int = MAX_CELL, keep_end: bool = True) -> str:
    """Shorten from the middle: run names and paths differ at their ends."""
    if len(text) <= width:
        return text
    if not keep_end:
        return text[: width - 3] + "..."
    head = (width - 3) // 2
    return text[:head] + "..." + text[len(text) - (width - 3 - head) :]


def is_numeric(column: str, rows: List[Tuple[RecordedRun, dict]]) -> bool:
    values = [row[column] for _, row in rows if row[column] is not None and row[column] is not ABSENT]
    return bool(values) and all(number(v) is not None for v in values)


def render_table(columns: List[str], rows: List[Tuple[RecordedRun, dict]], keys: List[str]) -> str:
    # A failure reason reads from its start; names and paths differ at their ends.
    shorten = lambda c, text: clip(text, 64, keep_end=False) if c in ("status", "vs baseline") else clip(text)  # noqa: E731
    cells = [[shorten(c, cell_text(c, row[c], keys)) for c in columns] for _, row in rows]
    widths = [max([len(c)] + [len(line[i]) for line in cells]) for i, c in enumerate(columns)]
    right = [is_numeric(c, rows) for c in columns]

    def fmt(line: List[str]) -> str:
        return "  ".join(t.rjust(w) if r else t.ljust(w) for t, w, r in zip(line, widths, right, strict=True)).rstrip()

    return "\n".join([fmt(columns), "  ".join("-" * w for w in widths), *(fmt(line) for line in cells)])


def render_markdown(columns: List[str], rows: List[Tuple[RecordedRun, dict]], keys: List[str]) -> str:
    escape = lambda text: text.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(escape(c) for c in columns) + " |"]
    lines.append("|" + "|".join("---:" if is_numeric(c, rows) else "---" for c in columns) + "|")
    lines += ["| " + " | ".join(escape(cell_text(c, row[c], keys)) for c in columns) + " |" for _, row in rows]
    return "\n".join(lines)


def render_csv(columns: List[str], rows: List[Tuple[RecordedRun, dict]], keys: List[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*columns, "run_dir"])
    writer.writerows([*(export_text(c, row[c], keys) for c in columns), run.source] for run, row in rows)
    return out.getvalue().rstrip("\n")


def render_json(columns: List[str], rows: List[Tuple[RecordedRun, dict]], keys: List[str]) -> str:
    # A key the run does not have is not in its record (null is a value).
    records = [
        {**{c: row[c] for c in columns if row[c] is not ABSENT}, "run_dir": run.source, "overrides": run.overrides} for run, row in rows
    ]
    return json.dumps(records, indent=2, default=str)


RENDERERS = {"table": render_table, "markdown": render_markdown, "csv": render_csv, "json": render_json}
