"""Where a run's time before its first training step goes, for summary.json's `startup`.

The driver and rank 0 each note the wall-clock time (time.time(), one clock on one machine; across
machines as good as their clock sync) as they pass a mark; `phases` turns the marks into seconds per
phase, in order. A mark that comes before the one preceding it (a local-mode run imports the worker
code on the driver, before its fit starts) makes its phase 0 s rather than negative.
"""

import os
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional

# (mark that ends the phase, what the phase is), in order; the first phase starts at run_began().
PHASES = (
    ("run_entered", "Python start, imports, Hydra composes the config"),
    ("prepared", "the config checked (but a Ray run's `_target_` arguments), the run's directory claimed"),
    ("ray_ready", "Ray started or joined (a Ray run's `_target_` arguments checked and the training code imported alongside)"),
    ("resolved", "config resolved, the data described, the cluster checked"),
    ("fit_started", "Ray Train imported, the run's storage prepared"),
    ("worker_imports_started", "Ray Train starts: controller, placement group, worker processes"),
    # The worker imports from its process's start (raydra.worker.preload) while Ray Train still
    # sets up the group: this phase is whichever of the two ends later.
    ("train_entered", "Ray Train sets up the worker group; the worker imports torch, Lightning, the model's libraries"),
    ("built", "worker set-up: its logs, the data module, the model, Lightning's Trainer"),
    ("first_step", "Lightning's fit to the first batch: process group, data set-up, loaders"),
)


# When the last run trained in this process ended. Hydra's basic launcher runs a multirun's jobs one
# after another in one process: a later job's start-up starts there, not at the process's launch.
_previous_run_ended: Optional[float] = None


def run_began() -> float:
    """Where this run's start-up starts: this process's launch (before the interpreter loaded
    anything), or the end of the run this process trained before it."""
    if _previous_run_ended is not None:
        return _previous_run_ended
    return _launched()


def _launched() -> float:
    """This process's launch, on the wall clock. Linux gives it in clock ticks since boot
    (/proc/self/stat's starttime, field 22); psutil adds /proc/stat's boot time, which is whole
    seconds, so its answer came up to 1 s early (0.73 s on this project's machine: every start-up
    read that much longer than the run took). Here the time since boot comes from the boot clock
    itself. Elsewhere (macOS), psutil's."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - since_boot
    except (OSError, ValueError, IndexError, AttributeError):
        import psutil  # a dependency of ray[default]

        return psutil.Process(os.getpid()).create_time()


def run_ended() -> None:
    """Note that this process's run is over, however it ended (see run_began)."""
    global _previous_run_ended
    _previous_run_ended = time.time()


def phases(marks: Mapping[str, Optional[float]]) -> Dict[str, object]:
    """{"to_first_step_s": ..., "phases": [{"phase", "s"}, ...]} from the marks present."""
    start = marks.get("run_began")
    if start is None:
        return {}
    out: List[Dict[str, object]] = []
    previous = start
    for mark, label in PHASES:
        at = marks.get(mark)
        if at is None:
            continue
        out.append({"phase": label, "s": round(max(0.0, at - previous), 2)})
        previous = max(previous, at)
    first_step = marks.get("first_step")
    outcome: Dict[str, object] = {"to_first_step_s": round(first_step - start, 2) if first_step else None, "phases": out}
    began, imported = marks.get("worker_imports_started"), marks.get("worker_imported")
    if began and imported:
        # How long the worker's imports took, wherever they fell among the phases above.
        outcome["worker_imports_s"] = round(imported - began, 2)
    return outcome
