"""The workers' side of the hang watchdog (raydra.run.hang_watch has the run's side): where this rank is,
marked by the training thread, and a thread that tells the run's Watch, keeps this process's stacks
once a hang is declared, and then ends the process, so that failure.max_failures applies as after
any worker's death (a restart from the last checkpoint, or the run's end).

    Progress    where this rank is and since when: written by the training thread (Heartbeat, and
                TimedReport around a checkpoint save), read by the watchdog's thread
    Heartbeat   the Lightning callbacks that mark it at every batch's hooks (HeartbeatTail after
                every other callback's), and log each rank's step time once an epoch
    Watchdog    the thread: a heartbeat a second, the phase's deadline, the stacks, the end

A deadline is scaled from what the run measured itself: a batch may take failure.step_timeout_factor
times the median batch of its kind (never less than failure.step_timeout_min_s); start-up, to the
end of the first training step, failure.startup_timeout_s; a checkpoint save
failure.checkpoint_timeout_s, or 5 times the longest save so far; an epoch's or a validation's end
(samples drawn, metrics gathered, a user's epoch-end work) start-up's. The training thread only stores a
tuple and a time per hook (no lock, no call out of the process): the thread does the rest.
"""

import collections
import contextlib
import faulthandler
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

from raydra.lightning import pl
from raydra.private_apis.torch import flight_record
from raydra.worker.time_spent import LastStep, TimeSpent, last_words

log = logging.getLogger("raydra")

# How often a worker tells the Watch where it is; after a checkpoint save, at once (but never more
# often than this): a restart goes back to a save, and the compute ledger needs the save's figures.
BEAT_EVERY_S = 1.0
MIN_BEAT_S = 0.05
# A checkpoint save may take this many times the longest save so far, if that is above failure.checkpoint_timeout_s.
SAVE_FACTOR = 5.0
# How long a worker waits for every rank's stacks before it ends its process.
STACKS_WAIT_S = 20.0
# How long py-spy may take to dump this process's stacks.
PY_SPY_TIMEOUT_S = 20.0
# The positions' stages within a training step and after it (Progress.state): a rank that stands at
# a smaller position than another has not got as far. END: the step's first batch-end hook (raydra's
# own); ENDED: its last (after every user callback's), where the next step's collectives begin.
(
    START,
    BEFORE_BACKWARD,
    AFTER_BACKWARD,
    BEFORE_OPTIMIZER,
    END,
    ENDED,
    VALIDATION,
    VALIDATION_END,
    VALIDATED,
    EPOCH_END,
    EPOCH_ENDED,
    TRAINED,
    TEST,
    TESTED,
) = range(14)
# The start-up's stages, before the first training batch (position (-1, stage, batch)).
SET_UP, FIT_STARTED, TRAIN_STARTED, SANITY = range(1, 5)


class Progress:
    """Where this rank is: its phase (startup, train, validation, test, checkpoint, finishing), the
    last global step it completed, its position, and since when it has stood still; and the batch
    times its deadlines scale with."""

    def __init__(self, failure: Any) -> None:
        self.failure = failure
        self.began = time.monotonic()
        # (phase, global step, position, since): one tuple, so the thread reads a consistent view.
        self.state: Tuple[str, int, Tuple[int, ...], float] = ("startup", 0, (-1, 0, 0), self.began)
        self.batches = 0
        self.trained = False
        self.intervals: Dict[str, Deque[float]] = {kind: collections.deque(maxlen=256) for kind in ("train", "validation", "test")}
        self.last_start: Dict[str, Optional[float]] = dict.fromkeys(self.intervals)
        self.saves: List[float] = []
        # Each training batch's times, for the Watch's straggler check: (batch, global step, when
        # it reached its backward, when it was through its batch-end hooks), wall clock.
        self.steps: Deque[Tuple[int, int, Optional[float], float]] = collections.deque(maxlen=4096)
        self.backward_at: Optional[float] = None
        # Where this rank's time goes once it trains (the compute ledger), and a save to report at once.
        self.spent = TimeSpent()
        self.news = threading.Event()

    def at(self, phase: str, step: int, stage: int, index: int = 0) -> None:
        """This rank got to `stage` (and batch `index` within it) of `phase`: progress."""
        position = (-1 if phase == "startup" else self.batches, stage, index)
        # Start-up runs to the end of the first training step, whatever it passes through.
        self.state = (phase, step, position, time.monotonic()) if self.trained else ("startup", step, position, self.began)

    def batch_start(self, kind: str, step: int, index: int) -> None:
        now = time.monotonic()
        last = self.last_start[kind]
        if last is not None:
            self.intervals[kind].append(now - last)
        self.last_start[kind] = now
        if kind == "train":
            self.batches += 1
            self.backward_at = None
            if self.spent.started:
                self.spent.switch("productive")
            else:
                self.spent.first_step(step)
            self.at("train", step, START)
        elif self.trained:
            self.at(kind, step, VALIDATION if kind == "validation" else TEST, index)
        else:
            self.at(kind, step, SANITY, index)

    def backward(self, step: int) -> None:
        self.backward_at = time.time()
        self.at("train", step, BEFORE_BACKWARD)

    def batch_ended(self, step: int) -> None:
        """Through every batch-end hook: the step is done."""
        self.steps.append((self.batches, step, self.backward_at, time.time()))
        self.spent.step_ended(step)
        self.trained = True
        self.at("train", step, ENDED)

    def other_batches(self) -> None:
        """A validation or test begins: the training batch before it is no measure of the next."""
        self.last_start = dict.fromkeys(self.last_start)

    @contextlib.contextmanager
    def saving(self, step: int) -> Iterator[None]:
        """A checkpoint save: its own phase and deadline, at a position just after where it began."""
        phase, _, position, _ = self.state
        started = time.monotonic()
        doing = self.spent.doing
        self.spent.switch("checkpoint_save")
        if self.trained:
            self.state = ("checkpoint", step, (*position, 1), started)
        try:
            yield
            # Only a save that ended: a restart can go back to it.
            self.spent.saved(step, doing)
            self.news.set()
        finally:
            self.saves.append(time.monotonic() - started)
            if self.trained:
                self.state = (phase, step, (*position, 2), time.monotonic())

    def deadline(self, phase: str) -> float:
        """How long this rank may stand still in `phase` before it counts as hung."""
        failure = self.failure
        if phase in ("startup", "epoch_end", "finishing"):
            return float(failure.startup_timeout_s)
        if phase == "checkpoint":
            return max(float(failure.checkpoint_timeout_s), SAVE_FACTOR * max(self.saves, default=0.0))
        measured = self.intervals[phase] or self.intervals["train"]
        median = statistics.median(measured) if measured else 0.0
        return max(float(failure.step_timeout_min_s), failure.step_timeout_factor * median)


class Heartbeat(pl.Callback):
    """Marks this rank's Progress at every hook of a batch (first among the callbacks, so a user's
    callback that blocks is found inside the step it blocked), and logs each rank's step time and
    lag once an epoch (with more than one worker), from the Watch's straggler figures."""

    def __init__(self, progress: Progress, link: Any, world_size: int) -> None:
        self.progress, self.link, self.world_size = progress, link, world_size
        self.restore_from = time.time()

    def tail(self) -> "HeartbeatTail":
        """Its companion, for the end of the callback list."""
        return HeartbeatTail(self.progress)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.progress.at("startup", trainer.global_step, SET_UP)
        self.restore_from = time.time()

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.progress.at("startup", trainer.global_step, FIT_STARTED)
        # A strategy that restores after its set-up (FSDP, DeepSpeed) loads the checkpoint from here.
        if trainer.strategy.restore_checkpoint_after_setup:
            self.restore_from = time.time()

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        # The checkpoint's file read and the model's weights loaded (Lightning calls the callbacks'
        # hook after both): the compute ledger's restore, with the download loop.py timed.
        self.progress.spent.restore_s += time.time() - self.restore_from

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # The loader's iterator and its first batch: the wait for data.
        self.progress.spent.switch("data_wait")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.progress.at("startup", trainer.global_step, TRAIN_STARTED)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.progress.batch_start("train", trainer.global_step, batch_idx)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.progress.backward(trainer.global_step)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self.progress.at("train", trainer.global_step, AFTER_BACKWARD)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.progress.at("train", trainer.global_step, BEFORE_OPTIMIZER)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.progress.at("train", trainer.global_step, END)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.progress.other_batches()
        self.progress.spent.switch("validation")

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.progress.batch_start("validation", trainer.global_step, batch_idx)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        # What a validation's end computes (samples drawn, a FID) is not a batch: start-up's deadline.
        self.progress.at("epoch_end", trainer.global_step, VALIDATION_END)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.progress.at("train", trainer.global_step, VALIDATED)
        self.progress.spent.switch("data_wait")

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        # An epoch's end (metrics gathered, samples, a checkpoint, a user's epoch-end work) is not a
        # batch either: start-up's deadline, until the next batch starts.
        self.progress.at("epoch_end", trainer.global_step, EPOCH_END)
        self.progress.spent.switch("other")
        if self.world_size < 2:
            return
        try:
            figures = self.link("figures")
        except Exception as error:  # the Watch out of reach: the figures are missed, the run is not
            log.debug(f"per-rank step times: {error}")
            return
        for rank, figure in sorted(figures.items()):
            # The same values on every rank (logged by rank 0's loggers).
            pl_module.log(f"train/step_time_s_rank{rank}", figure["step_time_s"])
            pl_module.log(f"train/lag_s_rank{rank}", figure["lag_s"])

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.progress.at("finishing", trainer.global_step, TRAINED)
        self.progress.spent.switch("other")

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self.progress.other_batches()
        self.progress.spent.switch("test")

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.progress.batch_start("test", trainer.global_step, batch_idx)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self.progress.at("finishing", trainer.global_step, TESTED)
        self.progress.spent.switch("other")


class HeartbeatTail(pl.Callback):
    """Heartbeat's mark after every other callback's hook (the last callback): a rank past it has
    left the step (or epoch) behind, while one stuck in a user's callback has not."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.progress.batch_ended(trainer.global_step)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.progress.at("epoch_end", trainer.global_step, EPOCH_ENDED)


class Watchdog:
    """This worker's watchdog thread (see the module's doc). `local`: the worker is the driver's own
    process (local mode), which is not ended: its main thread is interrupted instead, and the fit
    records the hang."""

    def __init__(self, progress: Progress, link: Any, rank: int, world_size: int, local: bool, run_id: str = "") -> None:
        self.progress, self.link, self.rank, self.world_size, self.local = progress, link, rank, world_size, local
        self.run_id = run_id
        self.node = socket.gethostname()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.attempt = -1

    def start(self) -> "Watchdog":
        try:
            self.attempt = self.link("register", self.rank, self.world_size, self.node, os.getpid(), self.progress.deadline("startup"))
        except Exception as error:  # no Watch to tell: this run goes unwatched, not unrun
            log.warning(f"the hang watchdog could not reach the run's watch ({error}); this worker is not watched")
            return self
        self._keep_last_steps()
        self._thread = threading.Thread(target=self._watch, name="raydra-watchdog", daemon=True)
        self._thread.start()
        return self

    def _keep_last_steps(self) -> None:
        """Hand the Watch what workers of an earlier group left on this node (their last steps), and
        keep this one's own there from now on (raydra.worker.time_spent.LastStep)."""
        try:
            left = last_words(self.run_id, before=self.attempt)
            if left:
                self.link("last_words", left)
            self.progress.spent.kept = LastStep(self.run_id, self.attempt, self.rank)
        except Exception as error:  # no shared memory, the Watch out of reach: the heartbeats' figures stand
            log.debug(f"the compute ledger's last steps: {error}")

    def stop(self) -> None:
        """Stop the thread, and hand the Watch this worker's time to the end (the ledger's last word)."""
        self._stop.set()
        self.progress.news.set()
        if self._thread is None:
            return
        self._thread.join(timeout=10)
        spent = self.progress.spent.report()
        if spent is not None:
            try:
                self.link("spent", self.rank, self.attempt, spent, timeout=10.0)
            except Exception as error:  # the Watch gone (the driver's fit ended): the last beat's figures stand
                log.debug(f"the compute ledger's last report: {error}")
        kept, self.progress.spent.kept = self.progress.spent.kept, None
        if kept is not None:
            kept.close()

    def _watch(self) -> None:
        failed_beats = 0
        # A save is reported as it ends (see MIN_BEAT_S), else one beat a second.
        least = MIN_BEAT_S
        last = 0.0
        while not self._stop.is_set():
            self.progress.news.wait(BEAT_EVERY_S)
            self.progress.news.clear()
            if self._stop.wait(max(0.0, last + least - time.monotonic())):
                return
            last = time.monotonic()
            phase, step, position, since = self.progress.state
            steps = []
            while self.progress.steps:
                steps.append(self.progress.steps.popleft())
            beat = {
                "phase": phase,
                "step": step,
                "position": list(position),
                "still_s": time.monotonic() - since,
                "deadline_s": self.progress.deadline(phase),
                "steps": steps,
                "spent": self.progress.spent.report(),
            }
            try:
                number = self.link("beat", self.rank, self.attempt, beat)
            except Exception as error:
                failed_beats += 1
                if failed_beats == 3:
                    log.warning(f"the hang watchdog cannot reach the run's watch ({error})")
                continue
            failed_beats = 0
            if number is not None and not self._stop.is_set():
                self._hung(number)
                return

    def _hung(self, number: int) -> None:
        """Keep this process's stacks with the Watch, wait (a while) for every rank's, then end."""
        phase, step, _, since = self.progress.state
        heading = (
            f"rank {self.rank} of {self.world_size}, pid {os.getpid()} on {self.node}: {phase} after step {step}, "
            f"still for {time.monotonic() - since:.0f} s when hang {number} was declared\n\n"
        )
        try:
            flight = flight_record()
        except Exception as error:
            flight = None
            heading += f"(torch's flight record: {error})\n"
        try:
            self.link("stacks", number, self.rank, heading + stacks_of_this_process(), flight)
            waited = time.monotonic()
            while not self.link("all_stacks", number) and time.monotonic() - waited < STACKS_WAIT_S:
                time.sleep(0.5)
        except Exception as error:
            log.warning(f"the hang watchdog could not hand over this worker's stacks ({error})")
        if self.local:
            # The driver's own process: its main thread raises KeyboardInterrupt, and the fit,
            # seeing the declared hang, records the run as hung.
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            return
        log.error(f"hang {number}: ending worker {self.rank} so the worker group restarts or the run ends (failure.max_failures)")
        logging.shutdown()
        # Not an exception: the training thread is stuck and would never see one. Ray Train sees
        # the worker's death, ends the group, and failure.max_failures decides what follows.
        os.kill(os.getpid(), signal.SIGKILL)


def stacks_of_this_process() -> str:
    """Every thread's stack in this process: py-spy's (thread names, native frames: where a
    collective waits in C++), else Python's own faulthandler."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.exists(spy):
        for native in (["--native"], []):
            try:
                done = subprocess.run(
                    [spy, "dump", "--pid", str(os.getpid()), *native], capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout
    with tempfile.TemporaryFile("w+") as file:
        faulthandler.dump_traceback(file, all_threads=True)
        file.seek(0)
        return "(py-spy could not dump this process: Python's faulthandler instead)\n" + file.read()
