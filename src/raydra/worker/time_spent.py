"""Where this worker's time goes once it trains, for the run's compute ledger (raydra.records.ledger).

From the start of its first training step, each moment of the worker's wall clock is in exactly
one of raydra.records.ledger.WORKER_BUCKETS: a step (batch start to its last batch-end hook), the
wait for the next batch, validation, the test, a checkpoint save, or other (epoch ends, the end of
training). The hang watchdog's Heartbeat switches buckets at the hooks it already marks, and the
watchdog's thread sends `report()` to the run's Watch with its heartbeats, which is how the figures
of a worker that is later killed still reach the driver. Before the first step is start-up, which
the run's start-up phases measure (raydra.run.startup).

Each switch costs a time.time() and a small tuple: the training thread writes one attribute, the
watchdog's thread reads it, so no lock is taken.
"""

import time
from typing import Any, Dict, List, Optional, Tuple

from raydra.records.ledger import WORKER_BUCKETS

# The checkpoints whose figures a report still carries, newest kept: a restart goes back to one of
# the last few saves (checkpoint.num_to_keep), never further.
SAVES_KEPT = 8


class TimeSpent:
    """This worker's seconds by bucket since its first step (see the module's doc)."""

    def __init__(self) -> None:
        # (totals before the current stretch, the current bucket, since when): one tuple, one write.
        self._state: Tuple[Tuple[float, ...], Optional[str], float] = (tuple(0.0 for _ in WORKER_BUCKETS), None, 0.0)
        self.from_step = 0
        self.first_step_at: Optional[float] = None
        self.restore_s = 0.0
        # (step, when, totals) at the end of the last step, and at the end of each save.
        self.last_step: Optional[Tuple[int, float, Tuple[float, ...]]] = None
        self.saves: List[Tuple[int, Tuple[float, ...]]] = []

    @property
    def started(self) -> bool:
        return self.first_step_at is not None

    def first_step(self, step: int) -> None:
        """The first training step starts, at global step `step` (a restored checkpoint's, or 0)."""
        now = time.time()
        self.from_step, self.first_step_at = step, now
        self._state = (self._state[0], "productive", now)

    def switch(self, bucket: str) -> None:
        """From now on the worker is doing `bucket` (nothing is counted before the first step)."""
        totals, doing, since = self._state
        if doing is None:
            return
        now = time.time()
        self._state = (_added(totals, doing, now - since), bucket, now)

    @property
    def doing(self) -> Optional[str]:
        return self._state[1]

    def step_ended(self, step: int) -> None:
        """A step's last batch-end hook ran: what follows is the wait for the next batch."""
        self.switch("data_wait")
        totals, _, now = self._state
        self.last_step = (step, now, totals)

    def saved(self, step: int, resume_to: Optional[str]) -> None:
        """A checkpoint at `step` is saved and handed to Ray; the worker goes back to `resume_to`."""
        self.switch(resume_to or "other")
        self.saves = [*self.saves[-(SAVES_KEPT - 1) :], (step, self._state[0])]

    def totals(self) -> Tuple[float, ...]:
        """The totals now, the current stretch included."""
        totals, doing, since = self._state
        return _added(totals, doing, time.time() - since) if doing is not None else totals

    def report(self) -> Optional[Dict[str, Any]]:
        """What the Watch keeps of this worker (raydra.run.hang_watch), None before its first step."""
        if not self.started:
            return None
        last = self.last_step
        return {
            "from_step": self.from_step,
            "first_step_at": self.first_step_at,
            "restore_s": self.restore_s,
            "totals": _named(self.totals()),
            "last_step": [last[0], last[1], _named(last[2])] if last else None,
            "saves": [[step, _named(totals)] for step, totals in self.saves],
        }


def _added(totals: Tuple[float, ...], bucket: str, seconds: float) -> Tuple[float, ...]:
    index = WORKER_BUCKETS.index(bucket)
    return (*totals[:index], totals[index] + max(0.0, seconds), *totals[index + 1 :])


def _named(totals: Tuple[float, ...]) -> Dict[str, float]:
    return {bucket: round(seconds, 4) for bucket, seconds in zip(WORKER_BUCKETS, totals, strict=True)}
