"""The HTML report: one self-contained file, interactive and offline.

The runs table (sortable, with the runs' tags), every logged metric's curves in the order
curves.plot_order gives (the monitored metric first, raydra's diagnostics last; a metric with one
point per run as bars; x as step, epoch or wall time; smoothing; log scale; runs toggled from the
legend; values on hover; seed groups as their mean with a ±sd band),
for a sweep a parallel-coordinates view and one scatter per sampled key with stopped and failed runs
marked, and a side-by-side diff of any two runs' configs. plotly.js is embedded in the page, so it
opens with no network and no server, years later; the page's own script (report.js, beside this
module) only reshapes the data it hands to plotly.
"""

import html
import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from raydra.compare.cost import CostView
from raydra.compare.curves import monitored, plot_order
from raydra.compare.groups import Grouped
from raydra.compare.recorded_run import RecordedRun, config_source, number, read_curves
from raydra.compare.run_text import config_text, run_files, status_text
from raydra.compare.table import cell_text, is_numeric
from raydra.config.keys import ABSENT
from raydra.records.layout import METRICS
from raydra.records.ledger import BUCKETS, MEANING, Ledger, share
from raydra.storage import is_uri

HERE = Path(__file__).parent
CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #1d1d1f; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; } h3 { font-size: 15px; margin: 24px 0 4px; color: #444; }
.meta { color: #666; margin: 0 0 12px; }
table { border-collapse: collapse; font-size: 13px; }
.scroll { overflow: auto; max-width: 100%; max-height: 70vh; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; white-space: nowrap; }
th { background: #f3f3f5; position: sticky; top: 0; cursor: pointer; user-select: none; }
th.asc::after { content: " ▲"; } th.desc::after { content: " ▼"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
.completed { color: #1a7f37; } .failed { color: #cf222e; } .running, .interrupted, .stopped, .pruned { color: #9a6700; } .unknown { color: #666; }
.controls { display: flex; gap: 16px; align-items: center; flex-wrap: wrap; margin: 8px 0; }
.plot { width: 100%; height: 420px; } .scatters { display: flex; flex-wrap: wrap; } .scatters .plot { width: 420px; height: 320px; }
details { border: 1px solid #ddd; border-radius: 6px; padding: 6px 10px; margin: 6px 0; }
summary { cursor: pointer; font-weight: 600; } pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 12px; }
#diff td.differs { background: #fff5d6; } ul.notes li { color: #9a6700; }
svg.buckets { display: block; } .legend span { margin-right: 12px; white-space: nowrap; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: middle; }
"""
# Each ledger bucket's colour in the cost bars: productive green, the waits warm, lost red, the rest grey.
BUCKET_COLOURS = {
    "startup": "#8c8c8c",
    "productive": "#2ca02c",
    "validation": "#1f77b4",
    "test": "#17becf",
    "data_wait": "#ff7f0e",
    "checkpoint_save": "#9467bd",
    "checkpoint_restore": "#c5b0d5",
    "rank_wait": "#bcbd22",
    "lost": "#d62728",
    "restart": "#e377c2",
    "other": "#d9d9d9",
}
BAR_WIDTH = 360


def status_class(run: RecordedRun) -> str:
    word = run.status.split()[0] if run.status else "unknown"
    return word if word in ("completed", "failed", "running", "interrupted", "stopped", "pruned") else "unknown"


def file_link(location: str, exists: Optional[bool]) -> str:
    text = html.escape(str(location))
    if exists is False:
        return f"{text} (missing)"
    if exists is None or is_uri(location):  # no browser opens s3://; the URI is shown to copy
        return text
    return f'<a href="{html.escape(Path(location).resolve().as_uri())}">{text}</a>'


def run_curves(run: RecordedRun, notes: List[str]) -> Dict[str, Dict[str, list]]:
    """{metric: {"step": [...], "epoch": [...], "time": [...], "y": [...]}} from metrics.csv. metrics.csv
    has no clock, so wall time is estimated as step x (the run's wall time / its last step): labelled so."""
    curves = read_curves(run, notes)
    steps = [s for points in curves.values() for s, _, _ in points if s is not None]
    wall = number(run.recorded.wall_time_s)
    per_step = wall / max(steps) if wall and steps and max(steps) > 0 else None
    out = {}
    for metric, points in curves.items():
        if points:
            out[metric] = {
                "step": [p[0] for p in points],
                "epoch": [p[1] for p in points],
                "time": [None if per_step is None or p[0] is None else round(p[0] * per_step, 3) for p in points],
                "y": [p[2] for p in points],
            }
    return out


def json_value(value: Any) -> Any:
    """A config value for the page: numbers stay numbers (axes), the rest as typed on a command line."""
    if value is ABSENT:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return config_text(value)


def page_data(
    rows: List[Tuple[RecordedRun, dict]],
    columns: List[str],
    keys: List[str],
    metrics: List[str],
    grouped: Optional[Grouped],
    notes: List[str],
) -> Dict[str, Any]:
    runs = [run for run, _ in rows]
    numeric = {c: is_numeric(c, rows) for c in columns}
    table = [[[cell_text(c, row[c], keys), row[c] if numeric[c] and row[c] is not ABSENT else None] for c in columns] for _, row in rows]
    data: Dict[str, Any] = {
        "columns": columns,
        "numeric": [numeric[c] for c in columns],
        "table": table,
        "runs": [
            {
                "label": run.label,
                "tags": run.tags,
                "status": status_text(run),
                "cls": status_class(run),
                "config": {k: config_text(v) for k, v in run.flat.items()},
                "settings": {k: json_value(run.value(k)) for k in keys},
            }
            for run in runs
        ],
        "curves": {},
        "plots": [],
        "keys": keys,
        "metrics": metrics,
        "monitor": [],
        "groups": [],
    }
    for i, run in enumerate(runs):
        if not (run.dir / METRICS).is_file():
            notes.append(f"{run.source} has no metrics.csv (no csv logger, or it stopped before logging); its curves are left out.")
        for metric, curve in run_curves(run, notes).items():
            data["curves"].setdefault(metric, []).append({"run": i, **curve})
    points = {metric: [len(c["y"]) for c in curves] for metric, curves in data["curves"].items()}
    data["plots"] = [asdict(plot) for plot in plot_order(points, monitored(runs) + metrics)]
    for metric in metrics:
        values = [row[f"best {metric}"] if row[f"best {metric}"] is not None else row[f"final {metric}"] for _, row in rows]
        data["monitor"].append({"metric": metric, "values": values})
    if grouped is not None:
        index = {id(run): i for i, run in enumerate(runs)}
        data["groups"] = [{"label": g.label, "runs": [index[id(r)] for r in g.runs if id(r) in index]} for g in grouped.groups]
    return data


def group_table(grouped: Grouped) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in grouped.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{e(cell_text(c, row.get(c), []))}</td>" for c in grouped.columns) + "</tr>" for row in grouped.rows
    )
    return f'<h2>Groups</h2><p class="meta">{e(grouped.heading)}</p><div class="scroll"><table id="groups"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def bucket_bar(ledger: Optional[Ledger]) -> str:
    """A run's allocated seconds as one stacked horizontal bar, a rectangle per bucket with seconds
    in it (its name, seconds and share on hover); empty for a record without a ledger."""
    allocated = ledger.allocated_s if ledger is not None else None
    if not allocated:
        return ""
    rects, x = [], 0.0
    for bucket in BUCKETS:
        seconds = ledger.buckets.get(bucket, 0.0)
        if seconds > 0:
            width = BAR_WIDTH * seconds / allocated
            tip = html.escape(f"{bucket}: {seconds:.1f} s ({share(seconds, allocated)})")
            rects.append(
                f'<rect data-bucket="{bucket}" x="{x:.2f}" width="{width:.2f}" height="14" fill="{BUCKET_COLOURS[bucket]}"><title>{tip}</title></rect>'
            )
            x += width
    return (
        f'<svg class="buckets" width="{BAR_WIDTH}" height="14" role="img" aria-label="where its worker-seconds went">{"".join(rects)}</svg>'
    )


def cost_section(cost: CostView, rows: List[Tuple[RecordedRun, dict]], grouped: bool) -> str:
    """--cost: the legend, one bar per run of where its hours went, and the sweep's own figures."""
    e = html.escape
    legend = "".join(f'<span title="{e(MEANING[b])}"><i style="background:{BUCKET_COLOURS[b]}"></i>{b}</span>' for b in BUCKETS)
    body = "".join(
        f'<tr><td>{e(run.label)}</td><td class="num">{e(cell_text(cost.unit, row.get(cost.unit), []))}</td>'
        f'<td class="num">{e(cell_text("goodput", row.get("goodput"), []))}</td><td>{bucket_bar(cost.figures[id(run)].ledger)}</td></tr>'
        for run, row in rows
    )
    out = [
        "<h2>Cost</h2>",
        '<p class="meta">' + "<br>".join(e(line) for line in cost.legend(grouped)) + "</p>",
        f'<p class="legend">{legend}</p>',
        f'<div class="scroll"><table id="cost"><thead><tr><th>run</th><th>{e(cost.unit)}</th><th>goodput</th>'
        f"<th>where the time went</th></tr></thead><tbody>{body}</tbody></table></div>",
    ]
    if cost.blocks:
        out.append(f'<pre id="cost-groups">{e(chr(10).join(cost.blocks).strip())}</pre>')
    return "".join(out)


def render_html(
    rows: List[Tuple[RecordedRun, dict]],
    columns: List[str],
    keys: List[str],
    metrics: List[str],
    notes: List[str],
    title: str,
    grouped: Optional[Grouped] = None,
    cost: Optional[CostView] = None,
) -> str:
    """The page: plotly.js and the data inline, nothing fetched. `cost`: --cost's section."""
    from plotly.offline import get_plotlyjs

    e = html.escape
    data = page_data(rows, columns, keys, metrics, grouped, notes)
    # Inside a script, "</script" would end it early and "<!--" followed by "<script" would keep the
    # next "</script>" from ending it (the page went blank): no "<", ">" or "&" reaches the HTML
    # parser, JSON's escaped forms of them reach JSON.parse.
    payload = json.dumps(data, default=str, separators=(",", ":"))
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f'<p class="meta">{len(rows)} run(s), written {datetime.now().isoformat(timespec="seconds")} by raydra compare</p>',
    ]
    if notes:
        out.append('<h2>Notes</h2><ul class="notes">' + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    if grouped is not None:
        out.append(group_table(grouped))
    out += [
        '<h2>Runs</h2><p class="meta">click a column to sort</p><div class="scroll"><table id="runs"></table></div>',
        cost_section(cost, rows, grouped is not None) if cost is not None else "",
        "<h2>Curves</h2>",
        '<div class="controls"><label>x <select id="x"><option value="step">step</option><option value="epoch">epoch</option>'
        '<option value="time">wall time (s, estimated)</option></select></label>'
        '<label>smoothing <input id="smooth" type="range" min="0" max="0.99" step="0.01" value="0"> <span id="smooth-value">0</span></label>'
        '<label><input id="logy" type="checkbox"> log y</label>'
        + ('<label><input id="by-group" type="checkbox" checked> seed groups: mean ± sd</label>' if grouped is not None else "")
        + "</div>",
        '<div id="curves"></div>',
        '<div id="sweep-section"><h2>Sweep</h2><div class="controls"><label>metric <select id="sweep-metric"></select></label></div>'
        '<div id="parcoords" class="plot"></div><div id="scatters" class="scatters"></div></div>',
        '<h2>Config diff</h2><div class="controls"><select id="diff-a"></select> vs <select id="diff-b"></select>'
        '<label><input id="diff-only" type="checkbox" checked> only keys that differ</label></div>'
        '<div class="scroll"><table id="diff"></table></div>',
        "<h2>Run details</h2>",
    ]
    for i, (run, _) in enumerate(rows):
        out.append(
            f'<details id="run-{i}"><summary>{e(run.label)} &mdash; <span class="{status_class(run)}">{e(status_text(run))}</span></summary>'
        )
        out.append(f"<p>directory: {file_link(run.source, True)}</p>")
        if run.tags:
            out.append(f"<p>tags: {e(', '.join(run.tags))}</p>")
        if run.recorded.reproduces:
            out.append(f"<p>reproduces: {e(run.recorded.reproduces)}</p>")
        out.append("<p>overrides:</p><pre>" + (e("\n".join(run.overrides)) or "(none)") + "</pre>")
        out.append("<ul>" + "".join(f"<li>{e(what)}: {file_link(p, ok)}</li>" for what, p, ok in run_files(run)) + "</ul>")
        config = config_source(run)
        out.append(f"<details><summary>config</summary><pre>{e(config) if config else '(no .hydra/config.yaml)'}</pre></details></details>")
    out += [
        f'<script type="text/javascript">{get_plotlyjs()}</script>',
        f'<script id="data" type="application/json">{payload}</script>',
        f"<script>{(HERE / 'report.js').read_text()}</script>",
        "</body></html>",
    ]
    return "\n".join(out)
