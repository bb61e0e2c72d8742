"""The HTML report."""

import base64
import html
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from raydra.compare.runs import Run, config_source, run_files, status_text
from raydra.compare.table import cell_text, is_numeric
from raydra.storage import is_uri

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #1d1d1f; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.meta { color: #666; margin: 0 0 12px; }
table { border-collapse: collapse; font-size: 13px; }
.scroll { overflow-x: auto; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; white-space: nowrap; }
td.status { white-space: normal; min-width: 24em; }
th { background: #f3f3f5; position: sticky; top: 0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
.completed { color: #1a7f37; } .failed { color: #cf222e; } .running, .interrupted { color: #9a6700; } .unknown { color: #666; }
figure { margin: 0 0 16px; } img { max-width: 100%; border: 1px solid #eee; }
details { border: 1px solid #ddd; border-radius: 6px; padding: 6px 10px; margin: 6px 0; }
summary { cursor: pointer; font-weight: 600; } pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 12px; }
ul.notes li { color: #9a6700; }
"""


def status_class(run: Run) -> str:
    word = run.status.split()[0] if run.status else "unknown"
    return word if word in ("completed", "failed", "running", "interrupted") else "unknown"


def file_link(location: str, exists: Optional[bool]) -> str:
    text = html.escape(str(location))
    if exists is False:
        return f"{text} (missing)"
    if exists is None or is_uri(location):  # no browser opens s3://; the URI is shown to copy
        return text
    return f'<a href="{html.escape(Path(location).resolve().as_uri())}">{text}</a>'


def render_html(
    rows: List[Tuple[Run, dict]], columns: List[str], keys: List[str], pngs: Dict[str, bytes], notes: List[str], title: str
) -> str:
    """One self-contained page: inline CSS, curves as data: URIs, no script, nothing fetched."""
    e = html.escape
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f'<p class="meta">{len(rows)} run(s), written {datetime.now().isoformat(timespec="seconds")} by raydra compare</p>',
        '<div class="scroll"><table><thead><tr>' + "".join(f"<th>{e(c)}</th>" for c in columns) + "</tr></thead><tbody>",
    ]
    numeric = {c: is_numeric(c, rows) for c in columns}
    for i, (run, row) in enumerate(rows):
        cells = []
        for c in columns:
            text = e(cell_text(c, row[c], keys))
            if c == "run":
                text = f'<a href="#run-{i}">{text}</a>'
            cls = f"status {status_class(run)}" if c == "status" else "num" if numeric[c] else ""
            cells.append(f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    if pngs:
        out.append("<h2>Learning curves</h2>")
        for metric, png in pngs.items():
            data = base64.b64encode(png).decode("ascii")
            out.append(f'<figure><img alt="{e(metric)}" src="data:image/png;base64,{data}"></figure>')
    out.append("<h2>Runs</h2>")
    for i, (run, _) in enumerate(rows):
        status = f'<span class="{status_class(run)}">{e(status_text(run))}</span>'
        out.append(f'<details id="run-{i}"><summary>{e(run.label)} &mdash; {status}</summary>')
        out.append(f"<p>directory: {file_link(run.source, True)}</p>")
        out.append("<p>overrides:</p><pre>" + (e("\n".join(run.overrides)) or "(none)") + "</pre>")
        out.append("<ul>" + "".join(f"<li>{e(what)}: {file_link(p, ok)}</li>" for what, p, ok in run_files(run)) + "</ul>")
        config = config_source(run)
        out.append(f"<details><summary>config</summary><pre>{e(config) if config else '(no .hydra/config.yaml)'}</pre></details>")
        out.append("</details>")
    if notes:
        out.append('<h2>Notes</h2><ul class="notes">' + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out)
