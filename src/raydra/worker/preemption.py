"""A preemption notice: SIGTERM to a Ray Train worker's process saves a checkpoint within ~0.2 s of
training and reports it before the worker stops, so the restart trains nothing twice.

SIGTERM is what a spot node's shutdown and a Kubernetes pod eviction send, with a grace period
before SIGKILL. Without this, Ray's own handler in the worker ends the process at once and the
restart goes back to the last periodic checkpoint (measured: benchmarks/faults.py --only preemption).

    signal (main thread)        -> `_on_sigterm` notes it; training goes on
    a batch end, every rank     -> the ranks agree (a small all-reduce, about every 0.2 s of
                                   training) that one of them was told
    every rank                  -> TimedReport saves a mid-epoch checkpoint and reports it; once Ray's
                                   controller has taken the report and Lightning has logged the
                                   step's row, each rank raises `Preempted` at its next hook, and
                                   failure.max_failures restarts the group from that checkpoint

A grace period too short to finish is harmless: a checkpoint counts once Ray has registered it, so
the previous one stays the run's latest. A second SIGTERM, or one outside training (setup, test),
gets Ray's own handling (the process exits).

The handler's state is module-level on purpose: the handler is installed by a function sent to the
worker actor's main thread, which must find the same state the training thread reads.
"""

import logging
import os
import signal
import threading
import time
from typing import Any, Dict, Optional

import torch

from raydra.errors import RaydraError
from raydra.lightning import pl
from raydra.private_apis.ray_train import run_on_train_worker_main_thread, wait_until_reports_taken
from raydra.worker.checkpoint_report import TimedReport

log = logging.getLogger("raydra")

# How long a preempted worker waits for Ray's controller to take its last report (one poll,
# RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 0.5 s as raydra sets it) before it stops regardless.
REPORT_TAKEN_TIMEOUT_S = 30.0
# How often, in training time, the ranks exchange whether one was told; never more than this many
# batches apart (a run of very short steps).
CHECK_EVERY_S = 0.2
MAX_CHECK_EVERY = 64

# Written on signal, read by the callback on the training thread.
_notice: Dict[str, Any] = {"armed": False, "at": None, "step": 0, "step_at_signal": None, "count": 0, "previous": None, "watching": False}


class Preempted(RaydraError):
    """A worker stopped on a preemption notice, after its checkpoint was registered."""


def _noted() -> None:
    """The first SIGTERM while training: when, and the last global step completed by then."""
    _notice["count"] += 1
    if _notice["armed"] and _notice["at"] is None:
        _notice["at"], _notice["step_at_signal"] = time.time(), _notice["step"]


def _on_sigterm(signum: int, frame: Any) -> None:
    """Python's handler, on the main thread. That thread runs Python only between the actor's tasks
    (the controller polls every 0.5 s), so the watcher thread usually noted the signal already."""
    if not _notice["watching"]:
        _noted()
    if not _notice["armed"] or _notice["count"] > 1:
        _previous(signum, frame)


def _watch(read_fd: int) -> None:
    """Note each SIGTERM the moment it arrives: Python's C-level handler writes the signal number to
    the wakeup fd at once, while the Python-level handler waits for the main thread's next task."""
    while True:
        for number in os.read(read_fd, 64):
            if number == signal.SIGTERM:
                _noted()


def _previous(signum: int, frame: Any) -> None:
    """What SIGTERM did before raydra's handler (Ray's: raise SystemExit, ending the worker)."""
    previous = _notice["previous"]
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install() -> None:
    """On the worker process's main thread: raydra's SIGTERM handler, keeping the one it replaces,
    and a wakeup fd with a thread watching it (unless something else already uses one)."""
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm:
        return
    _notice["previous"] = current
    signal.signal(signal.SIGTERM, _on_sigterm)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    theirs = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if theirs != -1:
        signal.set_wakeup_fd(theirs)  # in use already: keep it, and rely on the handler alone
        os.close(read_fd)
        os.close(write_fd)
        return
    _notice["watching"] = True
    threading.Thread(target=_watch, args=(read_fd,), name="raydra-sigterm-watch", daemon=True).start()


class PreemptionNotice(pl.Callback):
    """Acts on a SIGTERM to any worker's process at the next batch end: every rank checkpoints
    through `report` (TimedReport, so the checkpoint is timed, mirrored and resumable like any
    other) and stops. The callback goes after Resumable and TimedReport in the callback list: the
    batch is counted, and an epoch-end checkpoint already saved at this step is reused."""

    def __init__(self, report: TimedReport, rank: int) -> None:
        self.report, self.rank = report, rank
        self._group: Any = None
        # Batch ends between exchanges (agreed by the ranks), and the clock at the last exchange.
        self._every, self._since, self._checked_at = 1, 0, 0.0
        # The stop a notice's checkpoint decided, raised at the next hook (see _stop_if_saved).
        self._stopping: Optional[Preempted] = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        run_on_train_worker_main_thread(_install)
        _notice.update(armed=True, at=None, count=0, step=trainer.global_step, step_at_signal=None)
        if torch.distributed.is_initialized() and self._group is None:
            # The agreement is one CPU number per step, over a gloo group of its own: a GPU run does
            # not wait on its device to read it, and it never interleaves with DDP's own collectives
            # (every rank creates the group, in the same order).
            self._group = torch.distributed.new_group(backend="gloo")
        self._every, self._since, self._checked_at = 1, 0, 0.0

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        _notice["armed"] = False
        self._stop_if_saved(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        _notice["armed"] = False
        self._stopping = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        _notice["step"] = trainer.global_step
        if batch_idx + 1 >= trainer.num_training_batches:
            return  # the epoch's last batch: decided at the epoch's end, after its validation
        self._act_if_noticed(trainer, mid_epoch=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._act_if_noticed(trainer, mid_epoch=False)

    def _act_if_noticed(self, trainer: Any, mid_epoch: bool) -> None:
        noticed = self._noticed_by(trainer)
        if noticed is None:
            return
        step = trainer.global_step
        if noticed == self.rank:
            log.info(
                f"preemption notice (SIGTERM) after global step {_notice['step_at_signal']}; "
                f"saving a checkpoint at global step {step} and stopping"
            )
        saved = self.report.last_saved_step == step
        if not saved:
            self.report.checkpoint(trainer, mid_epoch=mid_epoch, wait_upload=True)
        # Part of the save: until Ray has taken it, the checkpoint is not one a restart goes back to.
        with self.report.saving(step):
            taken = wait_until_reports_taken(REPORT_TAKEN_TIMEOUT_S)
        _notice["armed"] = False
        # Stopped at the next hook, not here: Lightning logs this step's row (or this epoch's) after
        # the callbacks' batch end (epoch end), and the restart keeps the rows before its checkpoint
        # and trains on from there, so a row not logged now would be missing from the run for good.
        self._stopping = Preempted(
            f"worker {noticed} got SIGTERM (a preemption notice) and stopped after "
            + (f"its checkpoint at global step {step}" if taken else f"reporting a checkpoint at global step {step} that Ray had not taken")
            + "; failure.max_failures restarts the run from it, or continue it with resume=latest."
        )

    def _stop_if_saved(self, trainer: Any) -> None:
        """Stop once the notice's checkpoint is saved and the rows up to it are logged: at the first
        hook after the batch end (epoch end) that saved it, with those rows flushed to disk."""
        if self._stopping is None:
            return
        stopping, self._stopping = self._stopping, None
        for logger in trainer.loggers:
            logger.save()
        raise stopping

    # What can come after the batch end or epoch end that saved: the next batch, a validation
    # (val_check_interval), the next epoch, or the end of training.
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._stop_if_saved(trainer)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._stop_if_saved(trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._stop_if_saved(trainer)

    def _noticed_by(self, trainer: Any) -> Optional[int]:
        """The lowest rank whose process got SIGTERM, as every rank agrees; None if none did.

        The ranks exchange this every `self._every` batch ends, about every CHECK_EVERY_S of
        training: at every step, the exchange cost 18% of a 2-worker digits run's samples/s
        (~15 ms steps on 2 cores; measured, waited for or not), every ~0.2 s 4%. Each exchange also agrees on the
        next interval (the largest any rank proposes), so every rank exchanges at the same batch.
        Training goes on until the agreed batch, so nothing is lost: the checkpoint comes at most
        CHECK_EVERY_S of training after the signal."""
        mine = self.rank if _notice["at"] is not None else -1
        if not torch.distributed.is_initialized() or trainer.world_size == 1:
            return mine if mine >= 0 else None
        self._since += 1
        if self._since < self._every:
            return None
        now = time.monotonic()
        step_s = (now - self._checked_at) / self._since if self._checked_at else None
        self._since, self._checked_at = 0, now
        proposal = max(1, min(MAX_CHECK_EVERY, int(CHECK_EVERY_S / step_s))) if step_s else 1
        # MAX of (world_size - rank): the lowest noticed rank wins, 0 means none.
        flag = torch.tensor([trainer.world_size - mine if mine >= 0 else 0, proposal], dtype=torch.int64)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group)
        value, self._every = int(flag[0]), int(flag[1])
        return trainer.world_size - value if value else None
