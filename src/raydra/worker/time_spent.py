"""Where this worker's time goes once it trains, for the run's compute ledger (raydra.records.ledger).

From the start of its first training step, each moment of the worker's wall clock is in exactly
one of raydra.records.ledger.WORKER_BUCKETS: a step (batch start to its last batch-end hook), the
wait for the next batch, validation, the test, a checkpoint save, or other (epoch ends, the end of
training). The hang watchdog's Heartbeat switches buckets at the hooks it already marks, and the
watchdog's thread sends `report()` to the run's Watch with its heartbeats (once a second, and at
once after a checkpoint save), which is how the figures of a worker that is later killed still
reach the driver. Before the first step is start-up, which the run's start-up phases measure
(raydra.run.startup).

A killed worker's last second is not lost either: at the end of every step it writes its figures
into a small file in shared memory (LastStep: /dev/shm, a memory write, no system call), which
outlives the process on its node. The next worker group's workers, and the driver, read what the
workers before them left on their nodes (last_words) and hand it to the Watch: the lost work of a
restart is exact to the last step the killed worker finished, at no cost per step but the write.
Sending a heartbeat after every step did the same at 0.88x the samples/s of a run without the
watchdog (2 CPU workers: the calls' CPU on a busy node).

Each switch costs a time.time() and a small tuple: the training thread writes one attribute, the
watchdog's thread reads it, so no lock is taken.
"""

import contextlib
import glob
import mmap
import os
import struct
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from raydra.records.ledger import WORKER_BUCKETS

# The checkpoints whose figures a report still carries, newest kept: a restart goes back to one of
# the last few saves (checkpoint.num_to_keep), never further.
SAVES_KEPT = 8
# LastStep's file: a sequence number, then two slots of (step, when, the buckets' seconds); the
# sequence names the slot written last, so a write cut short by a kill leaves the one before whole.
_HEADER = struct.Struct("<q")
_SLOT = struct.Struct("<qd" + "d" * len(WORKER_BUCKETS))
_SIZE = _HEADER.size + 2 * _SLOT.size


class TimeSpent:
    """This worker's seconds by bucket since its first step (see the module's doc)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        # The wall clock (a test's own, stood in).
        self.clock = clock
        # (totals before the current stretch, the current bucket, since when): one tuple, one write.
        self._state: Tuple[Tuple[float, ...], Optional[str], float] = (tuple(0.0 for _ in WORKER_BUCKETS), None, 0.0)
        self.from_step = 0
        self.first_step_at: Optional[float] = None
        self.restore_s = 0.0
        # (step, when, totals) at the end of the last step, and at the end of each save.
        self.last_step: Optional[Tuple[int, float, Tuple[float, ...]]] = None
        self.saves: List[Tuple[int, Tuple[float, ...]]] = []
        self.kept: Optional["LastStep"] = None

    @property
    def started(self) -> bool:
        return self.first_step_at is not None

    def first_step(self, step: int) -> None:
        """The first training step starts, at global step `step` (a restored checkpoint's, or 0)."""
        now = self.clock()
        self.from_step, self.first_step_at = step, now
        self._state = (self._state[0], "productive", now)

    def switch(self, bucket: str) -> None:
        """From now on the worker is doing `bucket` (nothing is counted before the first step)."""
        totals, doing, since = self._state
        if doing is None:
            return
        now = self.clock()
        self._state = (_added(totals, doing, now - since), bucket, now)

    @property
    def doing(self) -> Optional[str]:
        return self._state[1]

    def step_ended(self, step: int) -> None:
        """A step's last batch-end hook ran: what follows is the wait for the next batch."""
        self.switch("data_wait")
        totals, _, now = self._state
        self.last_step = (step, now, totals)
        if self.kept is not None:
            self.kept.write(step, now, totals)

    def saved(self, step: int, resume_to: Optional[str]) -> None:
        """A checkpoint at `step` is saved and handed to Ray; the worker goes back to `resume_to`."""
        self.switch(resume_to or "other")
        self.saves = [*self.saves[-(SAVES_KEPT - 1) :], (step, self._state[0])]

    def totals(self) -> Tuple[float, ...]:
        """The totals now, the current stretch included."""
        totals, doing, since = self._state
        return _added(totals, doing, self.clock() - since) if doing is not None else totals

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


class LastStep:
    """This worker's figures at the end of its last step, in shared memory on its node, for
    whoever comes after it if it is killed (see the module's doc). `close` removes it: a worker
    that ended well has told the Watch itself."""

    def __init__(self, run_id: str, attempt: int, rank: int) -> None:
        self.path = _path(run_id, attempt, rank)
        self.sequence = 0
        with open(self.path, "wb+") as file:
            file.truncate(_SIZE)
            self.map = mmap.mmap(file.fileno(), _SIZE)

    def write(self, step: int, at: float, totals: Tuple[float, ...]) -> None:
        self.sequence += 1
        _SLOT.pack_into(self.map, _HEADER.size + (self.sequence % 2) * _SLOT.size, step, at, *totals)
        _HEADER.pack_into(self.map, 0, self.sequence)

    def close(self) -> None:
        self.map.close()
        with contextlib.suppress(OSError):
            os.remove(self.path)


def last_words(run_id: str, before: Optional[int] = None) -> List[Dict[str, Any]]:
    """What the run's workers that did not end well left on this node (LastStep), each file read
    once and removed: [{"attempt", "rank", "last_step": [step, when, totals]}]. `before`: only
    those of the worker groups before this one (a worker starting must not take its own group's)."""
    found = []
    for path in glob.glob(_path(glob.escape(run_id), "*", "*")):
        try:
            attempt, rank = (int(part[1:]) for part in path.rsplit("-", 2)[1:])
            if before is not None and attempt >= before:
                continue
            with open(path, "rb") as file:
                data = file.read()
            os.remove(path)
        except (OSError, ValueError):
            continue
        if len(data) != _SIZE:
            continue
        (sequence,) = _HEADER.unpack_from(data, 0)
        if sequence < 1:
            continue
        step, at, *totals = _SLOT.unpack_from(data, _HEADER.size + (sequence % 2) * _SLOT.size)
        found.append({"attempt": attempt, "rank": rank, "last_step": [step, at, _named(tuple(totals))]})
    return found


def _path(run_id: str, attempt: Any, rank: Any) -> str:
    # Shared memory where there is some (Linux), else the temporary directory: a file the process's
    # death leaves whole, in memory already written.
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(folder, f"raydra-ledger-{run_id}-a{attempt}-r{rank}")


def _added(totals: Tuple[float, ...], bucket: str, seconds: float) -> Tuple[float, ...]:
    index = WORKER_BUCKETS.index(bucket)
    return (*totals[:index], totals[index] + max(0.0, seconds), *totals[index + 1 :])


def _named(totals: Tuple[float, ...]) -> Dict[str, float]:
    return {bucket: round(seconds, 4) for bucket, seconds in zip(WORKER_BUCKETS, totals, strict=True)}
