"""After (and during) the search: every trial's final record, the trials table, the best trial's
config and checkpoint, the sweep's own record, and one console line per trial event."""

import csv
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import ray.tune
import yaml
from omegaconf import DictConfig, OmegaConf

from raydra import storage
from raydra.errors import one_line
from raydra.records import layout, summary, sweep, wandb_run
from raydra.records.checkpoints import last_checkpoint
from raydra.records.envelope import Status
from raydra.records.ledger import GroupLedger, duration, group_ledger, run_cost, share
from raydra.records.summary import Checkpoints, Metrics, RunRecord
from raydra.records.sweep import Best, Exploit, SweepRecord
from raydra.run import recording
from raydra.run.prepare import writable
from raydra.sweep import pbt

log = logging.getLogger("raydra")


@dataclass(frozen=True)
class TrialRow:
    """One trial's line of trials.csv and trials.md, as the sweep settles: from its final record
    (`record`), or only Tune's status for a trial that never started (`record` None)."""

    trial: str
    status: str
    sampled: Dict[str, Any] = field(default_factory=dict)
    final: Optional[float] = None
    best: Optional[float] = None
    epochs: Optional[int] = None
    wall_s: Optional[float] = None
    error: Optional[str] = None
    # The trial's directory, relative to the sweep's.
    run_dir: Optional[str] = None
    record: Optional[RunRecord] = None


class TrialEvents(ray.tune.Callback):
    """Tune's callback on a sweep's trial events: one console line per event, every trial's latest
    status for the sweep's record, and the scheduler's state saved after each result (a resumed
    sweep's scheduler starts from it)."""

    def __init__(self, metric: str, max_epochs: int) -> None:
        self.metric, self.max_epochs = metric, max_epochs
        # Trial id -> Tune status after Tune's last step: a snapshot, because stopping an
        # interrupted sweep changes the trials' own status afterwards.
        self.statuses: Dict[str, str] = {}
        self.scheduler: Any = None
        self.scheduler_state: Optional[Path] = None
        # tune.scheduler=pbt: the keys it perturbs, every copy it made, and what is told of a new one.
        self.mutations: List[str] = []
        self.lineage: List[Exploit] = []
        self.lineage_grew: Callable[[List[Exploit]], None] = lambda lineage: None

    def _save_scheduler(self) -> None:
        # Called after the scheduler has seen the result, so its rungs include it.
        if self.scheduler is None or self.scheduler_state is None or not self.scheduler_state.parent.is_dir():
            return
        with storage.replacing(self.scheduler_state) as tmp:
            self.scheduler.save(tmp)

    def on_step_end(self, iteration: int, trials: List[Any], **info: Any) -> None:
        self.statuses = {trial.trial_id: trial.status for trial in trials}

    def on_trial_start(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
        copy = pbt.exploit(trial, self.mutations) if self.mutations else None
        if copy is None:
            log.info(f"trial {trial.trial_id} started: {fmt_sampled(trial.config)}")
            return
        log.info(f"trial {trial.trial_id} continues from trial {copy.copied} at epoch {copy.epoch}: {fmt_sampled(copy.values)}")
        if not any(pbt.same(copy, known) for known in self.lineage):
            self.lineage.append(copy)
            self.lineage_grew(self.lineage)

    def on_trial_result(self, iteration: int, trials: List[Any], trial: Any, result: Dict[str, Any], **info: Any) -> None:
        value = result.get(self.metric)
        if isinstance(value, (int, float)):
            log.info(f"trial {trial.trial_id} epoch {result.get('epochs_done')}: {self.metric} {value:.4f}")
        self._save_scheduler()

    def on_trial_complete(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
        epochs = (trial.last_result or {}).get("epochs_done", 0)
        how = "done" if epochs >= self.max_epochs else "stopped early"
        log.info(f"trial {trial.trial_id} {how} after {epochs} epoch(s)")

    def on_trial_error(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
        log.info(f"trial {trial.trial_id} failed (its summary.json says why)")

    def __getstate__(self) -> Dict[str, Any]:
        # Tune pickles its RunConfig, callbacks included, into the sweep's tune/ directory.
        return {
            "metric": self.metric,
            "max_epochs": self.max_epochs,
            "statuses": {},
            "scheduler": None,
            "scheduler_state": None,
            "mutations": [],
            "lineage": [],
            "lineage_grew": lambda lineage: None,
        }


def settle_trials(
    sweep_dir: Path, grid: Any, trial_events: Any, metric: str, mode: str, scheduler: str, interrupted: bool = False
) -> List[TrialRow]:
    """Bring every trial's summary.json to its final state and return the table's rows.

    A trial writes its own summary.json, except when Tune ends its process: a trial ASHA stopped
    is recorded here from what it reported to Tune.
    """
    results = {}
    for result in grid or []:
        if result.metrics and "trial_id" in result.metrics:
            results[result.metrics["trial_id"]] = result
    statuses = trial_events.statuses
    rows = []
    seen = set()
    for run_dir in sorted(Path(sweep_dir, layout.TRIALS).glob("*/" + layout.SUMMARY)):
        run_dir = run_dir.parent
        run = summary.read(run_dir)
        trial_id = run.trial.id if run.trial and run.trial.id else run_dir.name
        seen.add(trial_id)
        status, result = statuses.get(trial_id), results.get(trial_id)
        # A trial Tune ended without error but that did not record its completion was stopped by
        # the scheduler (its process may have noted the stop as a failure on its way out).
        if status == "TERMINATED" and result is not None and run.status in (Status.RUNNING, Status.FAILED, Status.INTERRUPTED):
            run = _stopped(run, result, metric, mode, run_dir, scheduler)
            summary.write(run_dir, run)
        if run.status == Status.RUNNING:
            if status == "ERROR":
                run = run.failed(_one_line_error(result) or "the trial's process died")
            elif interrupted or status in ("RUNNING", "PENDING", "PAUSED"):
                run = run.interrupted("the sweep was interrupted; continue it with tune.resume=" + str(sweep_dir))
            if run.ended:
                summary.write(run_dir, run)
        if run.ended:
            # A trial Tune ended (ASHA's stop, the sweep's) never finished its W&B run: done here.
            wandb_run.complete(run_dir)
        rows.append(_row(run, run_dir, metric, sweep_dir))
    for trial_id, status in statuses.items():
        if trial_id not in seen:
            rows.append(TrialRow(trial=trial_id, status="pending" if status in ("PENDING", "PAUSED", "RUNNING") else status.lower()))
    return rows


def _stopped(run: RunRecord, result: Any, metric: str, mode: str, run_dir: Path, scheduler: str) -> RunRecord:
    """The record of a trial the scheduler stopped, from what it reported to Tune."""
    history = result.metrics_dataframe
    last = result.metrics
    final = {k: recording.json_number(v) for k, v in last.items() if "/" in k and recording.json_number(v) is not None}
    best: Dict[str, Any] = {}
    if history is not None and metric in history:
        row = history.loc[history[metric].idxmax() if mode == "max" else history[metric].idxmin()]
        best = {k: recording.json_number(v) for k, v in row.items() if "/" in str(k) and recording.json_number(v) is not None}
    epochs = last.get("epochs_done")
    last_kept = last_checkpoint(run_dir, run.run_id, run.storage)
    return run.stopped(
        f"the {scheduler} scheduler after {epochs} epoch(s)",
        round(float(last.get("time_total_s", 0.0)), 2),
        metrics=Metrics(final=final, best=best),
        epochs_completed=epochs,
        checkpoints=Checkpoints(last=run.relative(last_kept, run.storage or str(run_dir))),
    )


def _one_line_error(result: Any) -> Optional[str]:
    if result is None or result.error is None:
        return None
    return one_line(result.error)


def _row(run: RunRecord, run_dir: Path, metric: str, sweep_dir: Path) -> TrialRow:
    return TrialRow(
        trial=run.trial.id if run.trial and run.trial.id else run_dir.name,
        sampled=run.trial.sampled if run.trial else {},
        status=run.status,
        final=run.metrics.final.get(metric),
        best=run.metrics.best.get(metric),
        epochs=run.epochs_completed,
        wall_s=run.wall_time_s,
        error=run.error,
        run_dir=str(run_dir.relative_to(sweep_dir)),
        record=run,
    )


def ledger(rows: List[TrialRow], slots: int, wall_s: float, best: Optional[str]) -> GroupLedger:
    """The sweep's compute ledger (raydra.records.ledger): its trials' added up (a trial Tune stopped
    in its process has no ledger of its own: its workers x the time Tune gave it), and the worker
    slots (`slots`: trials at a time x a trial's workers) no trial held over the sweep's `wall_s`."""
    costs = [run_cost(row.trial, row.record) for row in rows if row.record is not None]
    gpu = any(row.record.ledger is not None and row.record.ledger.gpu for row in rows if row.record is not None)
    return group_ledger(costs, slots=slots, wall_s=wall_s, best=best, gpu=gpu)


def sweep_wall(record: SweepRecord, rows: List[TrialRow]) -> float:
    """How long the sweep held its slots, to now: from its start, and each resumption's, to the last
    trial event of that invocation (a killed driver's end is not recorded: its trials' last start or
    end stands for it), the time between an invocation and the next one's start left out."""
    starts = [at for at in (_epoch(record.started_at), *(_epoch(r.at) for r in record.resumed)) if at is not None]
    if not starts:
        return 0.0
    events = sorted(
        at for row in rows if row.record for at in (_epoch(row.record.started_at), _epoch(row.record.finished_at)) if at is not None
    )
    wall = time.time() - starts[-1]
    for begun, following in zip(starts, starts[1:]):
        wall += max([at for at in events if begun <= at <= following], default=begun) - begun
    return wall


def _epoch(stamp: Optional[str]) -> Optional[float]:
    try:
        return datetime.fromisoformat(stamp).timestamp() if stamp else None
    except ValueError:
        return None


def ledger_sentence(spent: GroupLedger) -> str:
    """The sweep's ledger in one line, for its closing lines."""
    allocated = spent.allocated_s or 0.0
    not_completed = sum(spent.not_completed_s.values())
    return (
        f"{duration(spent.runs_s)} in {spent.runs} trials of {spent.slots} worker slots' {duration(allocated)}: idle {share(spent.idle_s or 0.0, allocated)}, "
        f"trials that did not complete {share(not_completed, allocated)}, the best trial alone {duration(spent.best_s)}"
    )


def best(rows: List[TrialRow], mode: str) -> Optional[TrialRow]:
    """The completed trial with the best final metric (what Tune compares at each trial's end)."""
    done = [row for row in rows if row.status == "completed" and isinstance(row.final, (int, float))]
    if not done:
        return None
    return (max if mode == "max" else min)(done, key=lambda row: row.final)


def write_tables(sweep_dir: Path, rows: List[TrialRow], metric: str, lineage: Optional[List[Exploit]] = None) -> None:
    """trials.csv and trials.md; with PBT's `lineage`, each trial's copies too: `copied` lists them in
    order as <trial>@<epoch>, and the sampled columns hold the values the trial ended with."""
    keys = sorted({key for row in rows for key in row.sampled})
    header = ["trial", *keys, metric, f"best {metric}", "epochs", "status", "wall_s", "run_dir", "error"]
    if lineage is not None:
        header.append("copied")
    table = [
        [
            row.trial,
            *[row.sampled.get(key) for key in keys],
            row.final,
            row.best,
            row.epochs,
            row.status,
            row.wall_s,
            row.run_dir,
            row.error or "",
            *([" ".join(f"{copy.copied}@{copy.epoch}" for copy in lineage if copy.trial == row.trial)] if lineage is not None else []),
        ]
        for row in rows
    ]
    with (sweep_dir / layout.TRIALS_CSV).open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(table)

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "" if value is None else str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in line) + " |" for line in table]
    (sweep_dir / layout.TRIALS_MD).write_text("\n".join(lines) + "\n")


def write_best(cfg: DictConfig, sweep_dir: Path, best: TrialRow, metric: str, config_dir: Optional[str]) -> Best:
    """best_config.yaml: the whole composed config with the best trial's values, a primary config
    Hydra can run on its own; and a link to that trial's best checkpoint."""
    config = writable(cfg)
    config.tune = None
    config.resume = None
    for key, value in best.sampled.items():
        OmegaConf.update(config, key, value, merge=False)
    head = {"defaults": ["raydra_schema", "_self_", {"hydra": "default"}]}
    if config_dir:
        head["hydra"] = {"searchpath": [f"file://{config_dir}"]}
    text = (
        f"# The best trial ({best.trial}, {metric} {best.final}) of the sweep in {sweep_dir}.\n"
        f"# Rerun it exactly:  python train.py --config-path {sweep_dir} --config-name best_config\n"
        + yaml.safe_dump(head, sort_keys=False)
        + OmegaConf.to_yaml(config)
    )
    (sweep_dir / layout.BEST_CONFIG).write_text(text)
    checkpoint = best.record.checkpoint("best", sweep_dir / best.run_dir)
    link = sweep_dir / layout.BEST_CHECKPOINT
    if link.is_symlink() or link.exists():
        link.unlink()
    # A checkpoint in object storage has no path to link to; sweep.json names its URI.
    if checkpoint and not storage.is_uri(checkpoint):
        link.symlink_to(os.path.relpath(checkpoint, sweep_dir))
    return Best(
        trial=best.trial,
        metric=best.final,
        sampled=best.sampled,
        run_dir=str(sweep_dir / best.run_dir),
        checkpoint=checkpoint,
        config=str(sweep_dir / layout.BEST_CONFIG),
    )


def end(sweep_dir: Path, ended: SweepRecord, write: bool = True) -> None:
    """Write the record of a sweep that ended (not with `write=False`: the directory holds another
    sweep's), and say why when it did not complete."""
    if write and sweep_dir.exists():
        sweep.write(sweep_dir, ended)
    if ended.error:
        log.error(f"error: {ended.error}" if ended.status == Status.FAILED else ended.error)


def fmt_sampled(sampled: Dict[str, Any]) -> str:
    return "  ".join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}" for key, value in sampled.items())
