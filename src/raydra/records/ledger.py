"""The compute ledger: where a run's worker-seconds went, and what a sweep or multirun spent in all.

    Ledger          one run's: its allocated worker-seconds (workers x wall, from the run's process
                    start to its end) split into BUCKETS that add up to it; goodput = productive / allocated
    RankTime        what one worker of one attempt reported (raydra.worker.time_spent, by way of the
                    hang watchdog's Watch): its time since its first step by what it was doing, and
                    the same figures where each checkpoint was saved and where its last step ended
    run_ledger      a run's Ledger from its start-up marks and its attempts' RankTimes (pure: tested
                    with hand-made figures)
    GroupLedger     a sweep's or multirun's: the sum of its runs' ledgers, the slots idle between
                    them, what the runs that did not complete cost, and the best run's cost
    group_ledger    a GroupLedger from its runs' costs and the slots it held

Lost work is measured, not estimated: a restarted worker group resumes from a checkpoint at step S,
and every second each worker of the group before it spent after saving S (to the last step it
completed) was spent again. Each worker keeps its figures at the end of every checkpoint save and
of every step where they outlive it (raydra.worker.time_spent), so the split is exact to the last
step it finished. What followed a failed group's last step (the step in flight, the failure's
detection, a hang's wait, the new group's start-up) is `restart`.

Only the standard library is imported: `raydra compare` and `show` read ledgers anywhere.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

# The buckets a run's allocated worker-seconds are split into, in the order they are shown. The
# worker's own (raydra.worker.time_spent) are WORKER_BUCKETS; the rest are the ledger's.
WORKER_BUCKETS: Tuple[str, ...] = ("productive", "validation", "test", "data_wait", "checkpoint_save", "other")
BUCKETS: Tuple[str, ...] = (
    "startup",
    "productive",
    "validation",
    "test",
    "data_wait",
    "checkpoint_save",
    "checkpoint_restore",
    "rank_wait",
    "lost",
    "restart",
    "other",
)
# What each bucket counts, for `raydra show`, compare's legend and docs/ledger.md.
MEANING = {
    "startup": "process start to the first step: imports, Ray, Ray Train's start, the worker's set-up (summary.json's startup)",
    "productive": "training steps whose result was kept, less the time a rank waited for the others",
    "validation": "validation after the first step",
    "test": "the test after training",
    "data_wait": "between steps: the loader getting the next batch (less a wait for a slower rank)",
    "checkpoint_save": "training standing still while a checkpoint is written and handed to Ray",
    "checkpoint_restore": "fetching and loading the checkpoint a run or restarted group continues from",
    "rank_wait": "a rank waiting for a slower rank, between its steps or inside them (the straggler watch's lags)",
    "lost": "work done after the checkpoint a restarted group went back to: done again",
    "restart": "a failed group's last step to the new group's first: the failure found, the new group started",
    "other": "what is left: epoch ends, the end of the run, time no worker reported",
}


@dataclass(frozen=True)
class Restart:
    """One worker group that ended and was started again: from which checkpoint, how far the group
    before had got, and what that cost."""

    attempt: Optional[int] = None
    from_step: Optional[int] = None
    reached_step: Optional[int] = None
    lost_s: Optional[float] = None
    restart_s: Optional[float] = None


@dataclass(frozen=True)
class Ledger:
    """summary.json's `ledger`: worker-seconds (GPU-seconds where the run used GPUs)."""

    workers: Optional[int] = None
    gpu: Optional[bool] = None
    wall_s: Optional[float] = None
    allocated_s: Optional[float] = None
    buckets: Dict[str, float] = field(default_factory=dict)
    restarts: List[Restart] = field(default_factory=list)
    # Why some of the time is not split (failure.watchdog=false: no worker reported its time).
    unseen: Optional[str] = None
    # What an hour of it costs (ledger.price_per_*, the one that applies to the run), if set.
    price_per_hour: Optional[float] = None

    @property
    def goodput(self) -> Optional[float]:
        return goodput(self.buckets, self.allocated_s)

    def sentence(self) -> str:
        """The ledger in one line, for the closing summary."""
        unit = "GPU" if self.gpu else "worker"
        goodput = self.goodput
        top = sorted(((s, b) for b, s in self.buckets.items() if b != "productive" and s > 0), reverse=True)[:3]
        lost = ", ".join(f"{b} {share(s, self.allocated_s)}" for s, b in top)
        head = f"goodput {goodput:.0%}" if goodput is not None else "goodput unknown"
        return f"{head} of {duration(self.allocated_s)} {unit} time" + (f" (the rest: {lost})" if lost else "")


@dataclass(frozen=True)
class Waited:
    """A rank's seconds waiting for the slowest rank, and how many of them fell between its steps:
    Lightning (2.6) broadcasts at each step's start, where a rank that ended its step first waits
    for the last (counted in its data_wait); the rest fell inside its steps (DDP's gradient
    reduction in backward: its productive time)."""

    total: float = 0.0
    between_steps: float = 0.0

    def carved(self, kept: Mapping[str, float]) -> Dict[str, float]:
        """What of this wait each bucket of `kept` held, never more than it holds."""
        between = min(self.between_steps, kept.get("data_wait", 0.0))
        within = min(max(0.0, self.total - between), kept.get("productive", 0.0))
        return {"data_wait": between, "productive": within}


@dataclass(frozen=True)
class RankTime:
    """One worker's time in one attempt, as its last report left it (all wall-clock seconds)."""

    rank: int = 0
    # The global step the attempt started from (a restored checkpoint's), and when this rank's first step began.
    from_step: int = 0
    first_step_at: Optional[float] = None
    # Fetching and loading the checkpoint it started from, before its first step.
    restore_s: float = 0.0
    # Since its first step, by WORKER_BUCKETS, at its last report.
    totals: Dict[str, float] = field(default_factory=dict)
    # The same at the end of its last completed step: (step, when, totals).
    last_step: Optional[int] = None
    last_step_at: Optional[float] = None
    at_last_step: Dict[str, float] = field(default_factory=dict)
    # The same at the end of each checkpoint save, by the step saved.
    at_saves: Dict[int, Dict[str, float]] = field(default_factory=dict)
    # Waiting for slower ranks (the Watch's lags): to its last report, and by step saved.
    waited: Waited = field(default_factory=Waited)
    waited_at_saves: Dict[int, Waited] = field(default_factory=dict)


def run_ledger(
    workers: int, gpu: bool, began: Optional[float], ended: float, first_step_at: Optional[float], attempts: List[List[RankTime]]
) -> Ledger:
    """A run's ledger. `began`: its process's start (raydra.run.startup.run_began); `ended`: now, as
    its record is written; `first_step_at`: rank 0's first step (summary.json's start-up ends there);
    `attempts`: each worker group's ranks, in order (a restart starts the next)."""
    if began is None:
        return Ledger(workers=workers, gpu=gpu, unseen="the run's start was not recorded")
    wall = max(0.0, ended - began)
    allocated = workers * wall
    buckets: Dict[str, float] = dict.fromkeys(BUCKETS, 0.0)
    if first_step_at is None:
        # No step was taken: all of it was start-up.
        buckets["startup"] = allocated
        return _ledger(workers, gpu, wall, allocated, buckets, [], None)
    buckets["startup"] = workers * max(0.0, first_step_at - began)
    restarts: List[Restart] = []
    for number, ranks in enumerate(attempts):
        restore = sum(r.restore_s for r in ranks)
        if number == 0:
            # Inside the start-up phases: a resumed run's restore is shown as its own.
            moved = min(restore, buckets["startup"])
            buckets["startup"] -= moved
            buckets["checkpoint_restore"] += moved
        following = attempts[number + 1] if number + 1 < len(attempts) else None
        resumed_at = following[0].from_step if following else None
        for rank in ranks:
            kept, lost, waited = _split(rank, resumed_at)
            for bucket, seconds in kept.items():
                buckets[bucket] += seconds
            for bucket, seconds in waited.carved(kept).items():
                buckets[bucket] -= seconds
                buckets["rank_wait"] += seconds
            buckets["lost"] += lost
        if following:
            restarts.append(_restart(number + 1, workers, ranks, following))
    for restart in restarts:
        buckets["restart"] += restart.restart_s or 0.0
        moved = min(sum(r.restore_s for r in attempts[restart.attempt or 0]), buckets["restart"])
        buckets["restart"] -= moved
        buckets["checkpoint_restore"] += moved
    return _ledger(workers, gpu, wall, allocated, buckets, restarts, None)


def _split(rank: RankTime, resumed_at: Optional[int]) -> "tuple[Dict[str, float], float, Waited]":
    """One rank's attempt: (its buckets kept, its seconds lost, its rank wait kept). The last attempt
    (`resumed_at` None) keeps everything; one the run went back from keeps what it did up to the
    save of `resumed_at` and loses what it did after it, to its last completed step."""
    totals = {b: max(0.0, float(rank.totals.get(b, 0.0))) for b in WORKER_BUCKETS}
    if resumed_at is None:
        return totals, 0.0, rank.waited
    if resumed_at in rank.at_saves:
        kept = rank.at_saves[resumed_at]
        waited = rank.waited_at_saves.get(resumed_at, Waited())
    elif resumed_at <= rank.from_step:
        # The checkpoint was older than this attempt's start: all of this attempt is done again.
        kept, waited = {}, Waited()
    else:
        # A checkpoint this rank never reported saving (its report was lost with it): kept up to its
        # last step, none counted lost.
        kept, waited = rank.at_last_step, rank.waited
    kept = {b: min(max(0.0, float(kept.get(b, 0.0))), totals[b]) for b in WORKER_BUCKETS}
    through = rank.at_last_step or totals
    lost = sum(max(0.0, float(through.get(b, 0.0)) - kept[b]) for b in WORKER_BUCKETS)
    # What came after the last step is the restart's, not this attempt's.
    return kept, lost, waited


def _restart(attempt: int, workers: int, before: List[RankTime], after: List[RankTime]) -> Restart:
    """The gap from the failed group's last steps to the new group's first: each slot's, in all."""
    starts = [r.first_step_at for r in after if r.first_step_at is not None]
    ends = [r.last_step_at if r.last_step_at is not None else r.first_step_at for r in before]
    ends = [e for e in ends if e is not None]
    gap = workers * max(0.0, min(starts) - sum(ends) / len(ends)) if starts and ends else 0.0
    resumed_at = after[0].from_step
    lost = sum(_split(r, resumed_at)[1] for r in before)
    reached = max((r.last_step for r in before if r.last_step is not None), default=None)
    return Restart(attempt=attempt, from_step=resumed_at, reached_step=reached, lost_s=round(lost, 3), restart_s=round(gap, 3))


def _ledger(
    workers: int, gpu: bool, wall: float, allocated: float, buckets: Dict[str, float], restarts: List[Restart], unseen: Optional[str]
) -> Ledger:
    counted = sum(s for b, s in buckets.items() if b != "other")
    buckets["other"] = max(0.0, allocated - counted)
    return Ledger(
        workers=workers,
        gpu=gpu,
        wall_s=round(wall, 3),
        allocated_s=round(allocated, 3),
        buckets={b: round(max(0.0, s), 3) for b, s in buckets.items()},
        restarts=restarts,
        unseen=unseen,
    )


def unseen_ledger(workers: int, gpu: bool, began: Optional[float], ended: float, first_step_at: Optional[float], why: str) -> Ledger:
    """A run whose workers' time was not followed (`why`): start-up from its marks, the rest other."""
    ledger = run_ledger(workers, gpu, began, ended, first_step_at, [])
    return dataclasses.replace(ledger, unseen=why)


# -- sweeps and multiruns -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunCost:
    """One run of a sweep or multirun, as its group's ledger counts it."""

    name: str = ""
    status: Optional[str] = None
    # Its allocated worker-seconds: its ledger's, else workers x its wall time (a trial Tune ended).
    allocated_s: float = 0.0
    buckets: Dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupLedger:
    """sweep.json's and jobs.json's `ledger`: its runs' ledgers added up, and what belongs to the
    group alone."""

    runs: Optional[int] = None
    # The worker slots the group could use at once, its wall, and slots x wall.
    slots: Optional[int] = None
    wall_s: Optional[float] = None
    allocated_s: Optional[float] = None
    # The sum over its runs' ledgers (runs without one: their allocated time as `other`).
    runs_s: Optional[float] = None
    buckets: Dict[str, float] = field(default_factory=dict)
    # Slots no run held: slots x wall less the runs' time (never negative).
    idle_s: Optional[float] = None
    # What the runs that did not complete (pruned, stopped, failed, interrupted) cost, by status.
    not_completed_s: Dict[str, float] = field(default_factory=dict)
    # The best run (the sweep's best trial, the multirun's best return value) and what it cost alone.
    best: Optional[str] = None
    best_s: Optional[float] = None
    gpu: Optional[bool] = None

    @property
    def goodput(self) -> Optional[float]:
        return goodput(self.buckets, self.allocated_s)


def run_cost(name: str, record: Any) -> RunCost:
    """A run record's cost (a raydra.records.summary.RunRecord): its ledger's, or where it has none
    (a trial Tune stopped in its process, an older record) its workers x its wall time."""
    ledger = record.ledger
    status = str(record.status) if record.status is not None else None
    if ledger is not None and ledger.allocated_s is not None:
        return RunCost(name, status, ledger.allocated_s, dict(ledger.buckets))
    allocated = (record.world_size or 1) * max(0.0, record.wall_time_s or 0.0)
    return RunCost(name, status, allocated, {"other": allocated})


def group_ledger(costs: Iterable[RunCost], slots: int, wall_s: float, best: Optional[str], gpu: bool = False) -> GroupLedger:
    """The group's ledger from its runs' costs, the worker slots it held (`slots`) for `wall_s`."""
    costs = list(costs)
    buckets: Dict[str, float] = dict.fromkeys(BUCKETS, 0.0)
    for cost in costs:
        for bucket, seconds in cost.buckets.items():
            if bucket in buckets:
                buckets[bucket] += seconds
    runs_s = sum(c.allocated_s for c in costs)
    allocated = slots * max(0.0, wall_s)
    idle = max(0.0, allocated - runs_s)
    not_completed: Dict[str, float] = {}
    for cost in costs:
        if cost.status != "completed":
            status = cost.status or "unknown"
            not_completed[status] = round(not_completed.get(status, 0.0) + cost.allocated_s, 3)
    best_cost = next((c.allocated_s for c in costs if c.name == best), None)
    return GroupLedger(
        runs=len(costs),
        slots=slots,
        wall_s=round(wall_s, 3),
        allocated_s=round(allocated, 3),
        runs_s=round(runs_s, 3),
        buckets={b: round(s, 3) for b, s in buckets.items()},
        idle_s=round(idle, 3),
        not_completed_s=not_completed,
        best=best,
        best_s=round(best_cost, 3) if best_cost is not None else None,
        gpu=gpu,
    )


def goodput(buckets: Mapping[str, float], allocated_s: Optional[float]) -> Optional[float]:
    """Productive over allocated time (None where either is unknown)."""
    productive = buckets.get("productive")
    if not allocated_s or productive is None:
        return None
    return productive / allocated_s


# -- words --------------------------------------------------------------------------------------


def duration(seconds: Optional[float]) -> str:
    """Worker-seconds in the unit a person reads them in: seconds, minutes or hours."""
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def hours(seconds: Optional[float]) -> str:
    return "?" if seconds is None else f"{seconds / 3600:.3g}" if seconds >= 36 else f"{seconds / 3600:.2g}"


def share(seconds: float, of: Optional[float]) -> str:
    return f"{seconds / of:.0%}" if of else "?"


def read_buckets(values: Mapping[str, Any]) -> Dict[str, float]:
    """A report's bucket figures as floats (a damaged one left out)."""
    return {k: float(v) for k, v in values.items() if k in WORKER_BUCKETS and isinstance(v, (int, float)) and not isinstance(v, bool)}
