"""Learning curves as PNGs (`--plot DIR`), drawn with matplotlib, imported only to draw."""

import io
import re
from pathlib import Path
from typing import Dict, List, Tuple

from raydra.compare.runs import Run, config_text, read_curves
from raydra.compare.table import clip

MAX_LEGEND = 20


def run_title(run: Run, keys: List[str]) -> str:
    """A legend entry: the run, and what it set when that is short enough to read (a sweep's axes)."""
    settings = ", ".join(f"{k.rsplit('.', 1)[-1]}={config_text(run.flat[k])}" for k in keys if k in run.flat)
    return f"{clip(run.label, 40)}  {clip(settings, 50, keep_end=False)}" if settings and len(keys) <= 3 else clip(run.label, 60)


def curve_points(run: Run, metric: str, x: str, notes: List[str]) -> Tuple[List[float], List[float]]:
    points = read_curves(run, notes).get(metric, [])
    if x == "step":
        pairs = [(step, value) for step, _, value in points if step is not None]
    else:
        # Per-step metrics are logged many times an epoch: one point per epoch, their mean.
        by_epoch: Dict[float, List[float]] = {}
        for _, epoch, value in points:
            if epoch is not None:
                by_epoch.setdefault(epoch, []).append(value)
        pairs = sorted((epoch, sum(v) / len(v)) for epoch, v in by_epoch.items())
    return [p[0] for p in pairs], [p[1] for p in pairs]


def render_curves(runs: List[Run], metrics: List[str], keys: List[str], x: str, notes: List[str]) -> Dict[str, bytes]:
    """{metric: PNG bytes}, one figure per metric with every run that logged it in metrics.csv."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state to leak

    for run in runs:
        if not (run.dir / "metrics.csv").is_file():
            notes.append(f"{run.source} has no metrics.csv (no csv logger, or it stopped before logging); its curves are left out.")
    pngs = {}
    for metric in metrics:
        fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
        ax = fig.subplots()
        drawn = 0
        for run in runs:
            xs, ys = curve_points(run, metric, x, notes)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 3 else None, linewidth=1.5, label=run_title(run, keys))
                drawn += 1
        if not drawn:
            notes.append(f"no run logged {metric!r} against {x} in metrics.csv; no curve is drawn for it.")
            continue
        ax.set(title=metric, xlabel=x, ylabel=metric)
        ax.grid(alpha=0.3)
        if drawn <= MAX_LEGEND:
            ax.legend(fontsize=7)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        pngs[metric] = buf.getvalue()
    return pngs


def write_plots(pngs: Dict[str, bytes], out_dir: str) -> List[Path]:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    written = []
    for metric, png in pngs.items():
        path = Path(out_dir) / (re.sub(r"[^\w.-]+", "_", metric).strip("_") + ".png")
        path.write_bytes(png)
        written.append(path)
    return written
