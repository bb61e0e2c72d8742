"""Which curves, in which order and drawn how; and learning curves as PNGs (`--plot DIR`), drawn
with matplotlib, imported only to draw."""

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from raydra.compare.recorded_run import RecordedRun, read_curves
from raydra.compare.run_text import config_text
from raydra.compare.table import clip
from raydra.records.layout import METRICS

MAX_LEGEND = 20

# raydra's own diagnostics, logged into metrics.csv beside the user's metrics: worker/throughput.py
# per epoch (samples/s of all workers, step time, data wait, TFLOP/s per worker, MFU) and
# worker/resumable.py for an elastic run (its world size, and each resize). Their curves come after
# the user's: they say how the run ran, not what it learnt. (Memory and checkpoint save times go to
# summary.json, not metrics.csv.)
DIAGNOSTIC_METRICS = frozenset(
    {
        "train/samples_per_s",
        "train/step_time_s",
        "train/data_wait_s",
        "train/tflops_per_s_per_worker",
        "train/mfu",
        "train/world_size",
        "resize/from_workers",
        "resize/to_workers",
        "resize/time",
    }
)
# The user's metrics by split (the name's part before its first /): validation first, what a run
# is judged on, then training; other splits alphabetically after them, then names without a split.
SPLIT_ORDER = ("val", "valid", "validation", "train")


@dataclass(frozen=True)
class Plot:
    metric: str
    bar: bool  # at most one point in every run (a test metric): one bar per run, not a one-point line
    diagnostic: bool  # one of raydra's DIAGNOSTIC_METRICS


def monitored(runs: Sequence[RecordedRun]) -> List[str]:
    """The metrics the runs' checkpointing monitored (summary.json's monitor, else the config's
    checkpoint.monitor), each once, in the runs' order."""
    names = [run.recorded.monitor.metric or run.flat.get("checkpoint.monitor") for run in runs]
    return list(dict.fromkeys(n for n in names if isinstance(n, str) and n))


def split_key(metric: str) -> Tuple[int, str, str]:
    split, sep, _ = metric.partition("/")
    if not sep:
        return (len(SPLIT_ORDER) + 1, "", metric)
    return (SPLIT_ORDER.index(split) if split in SPLIT_ORDER else len(SPLIT_ORDER), split, metric)


def plot_order(points: Dict[str, List[int]], first: Sequence[str] = ()) -> List[Plot]:
    """One Plot per metric of `points` ({metric: its number of points in each run that logged it}):
    `first` (the monitored metric, then the table's) in that order; then the user's curves by split;
    then the user's one-point metrics as bars; raydra's diagnostics last."""
    plots = {m: Plot(m, bar=max(counts, default=0) <= 1, diagnostic=m in DIAGNOSTIC_METRICS) for m, counts in points.items()}
    head = [plots[m] for m in dict.fromkeys(first) if m in plots]
    rest = sorted((p for p in plots.values() if p not in head), key=lambda p: (p.diagnostic, p.bar, split_key(p.metric)))
    return head + rest


def run_title(run: RecordedRun, keys: List[str]) -> str:
    """A legend entry: the run, and what it set when that is short enough to read (a sweep's axes)."""
    settings = ", ".join(f"{k.rsplit('.', 1)[-1]}={config_text(run.flat[k])}" for k in keys if k in run.flat)
    return f"{clip(run.label, 40)}  {clip(settings, 50, keep_end=False)}" if settings and len(keys) <= 3 else clip(run.label, 60)


def curve_points(run: RecordedRun, metric: str, x: str, notes: List[str]) -> Tuple[List[float], List[float]]:
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


def render_curves(runs: List[RecordedRun], metrics: List[str], keys: List[str], x: str, notes: List[str]) -> Dict[str, bytes]:
    """{metric: PNG bytes}, one figure per metric with every run that logged it in metrics.csv; a
    metric with one point per run (a test metric) as one bar per run."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state to leak

    for run in runs:
        if not (run.dir / METRICS).is_file():
            notes.append(f"{run.source} has no metrics.csv (no csv logger, or it stopped before logging); its curves are left out.")
    pngs = {}
    for metric in metrics:
        fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
        ax = fig.subplots()
        drawn = [(run, *curve_points(run, metric, x, notes)) for run in runs]
        drawn = [(run, xs, ys) for run, xs, ys in drawn if xs]
        if not drawn:
            notes.append(f"no run logged {metric!r} against {x} in metrics.csv; no curve is drawn for it.")
            continue
        if all(len(xs) == 1 for _, xs, _ in drawn):
            labels = [clip(run.label, 24) for run, _, _ in drawn]
            ax.bar(labels, [ys[0] for _, _, ys in drawn], color=[f"C{i % 10}" for i in range(len(drawn))])
            ax.tick_params(axis="x", labelrotation=30 if len(drawn) > 6 else 0, labelsize=7)
            ax.set(title=metric, xlabel="run", ylabel=metric)
        else:
            for run, xs, ys in drawn:
                ax.plot(xs, ys, marker="o" if len(xs) < 3 else None, linewidth=1.5, label=run_title(run, keys))
            ax.set(title=metric, xlabel=x, ylabel=metric)
            if len(drawn) <= MAX_LEGEND:
                ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
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
