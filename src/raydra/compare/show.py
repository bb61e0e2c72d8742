"""`raydra show RUN_DIR`: one run as text."""

from typing import List

from raydra.compare.cost import sound_ledger
from raydra.compare.cost_text import ledger_lines
from raydra.compare.recorded_run import RecordedRun, config_source, number
from raydra.compare.run_text import run_files, status_text, watchdog_lines
from raydra.compare.table import cell_text
from raydra.records.layout import WANDB


def show_text(run: RecordedRun, notes: List[str]) -> str:
    s = run.recorded
    lines = [f"run       {run.source}", f"status    {status_text(run)}"]
    for label, value in (("name", s.name), ("run id", s.run_id), ("started", s.started_at), ("finished", s.finished_at)):
        if value:
            lines.append(f"{label:<10}{value}")
    if run.tags:
        lines.append(f"tags      {', '.join(run.tags)}")
    if number(s.wall_time_s) is not None:
        lines.append(f"wall time {s.wall_time_s:.1f} s")
    if number(s.throughput.get("samples_per_s")) is not None:
        lines.append(f"samples/s {s.throughput['samples_per_s']:.1f}")
    if s.world_size or s.strategy:
        # summary.json records the strategy's settings; older runs only its name.
        name = s.strategy.get("name", "?") if isinstance(s.strategy, dict) else s.strategy or "?"
        lines.append(f"workers   {s.world_size or '?'} ({name})")
    if s.git_commit:
        lines.append(f"commit    {s.git_commit}")

    if s.monitor.metric:
        lines.append(f"monitor   {s.monitor.metric} ({s.monitor.mode or '?'})")
    final, best = s.metrics.final, s.metrics.best
    names = [n for n in dict.fromkeys([*final, *best]) if n not in ("epoch", "step")]
    if names:
        width = max(len(n) for n in names)
        lines += ["", "metrics".ljust(width + 2) + f"{'final':>12}  {'best':>12}"]
        for n in names:
            f_, b_ = (cell_text("", number(d.get(n)), []) for d in (final, best))
            lines.append(f"  {n:<{width}}{f_:>12}  {b_:>12}")
        where = [f"{k} {final[k]}" for k in ("epoch", "step") if k in final]
        if where:
            lines.append(f"  (final at {', '.join(where)})")
    elif run.record:
        lines += ["", "metrics   none recorded in summary.json"]

    if s.hangs or s.stragglers:
        lines += ["", "watchdog"] + watchdog_lines(s)
    if s.ledger is not None:
        lines += ["", *ledger_lines(sound_ledger(run, notes))]

    lines += ["", "overrides"] + [f"  {o}" for o in run.overrides or ["(none)"]]
    lines += ["", "files"]
    for what, location, exists in run_files(run):
        lines.append(f"  {what:<16}{location}{'  (missing)' if exists is False else ''}")
    if run.listing is None:
        if sorted((run.dir / WANDB).glob("offline-run-*")):
            lines.append(f"  upload W&B with: wandb sync {run.dir / WANDB}/offline-run-*")
    elif any(f.startswith(f"{WANDB}/offline-run-") for f in run.listing):
        lines.append(f"  upload W&B: copy {run.where(WANDB)} to a disk, then run wandb sync on its offline-run-* folders")
    config = config_source(run)
    lines += ["", "config (.hydra/config.yaml)"] + ([f"  {line}" for line in config.rstrip().splitlines()] or ["  (none)"])
    return "\n".join(lines)
