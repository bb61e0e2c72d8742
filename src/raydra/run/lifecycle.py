"""One lifecycle for what this process drives: a single run (raydra.run.driver), a Tune sweep
(raydra.sweep.tuner) and a multirun's jobs (raydra.multirun.launcher); in Tune's process, a sweep's
trial (raydra.sweep.trial), which connects nothing and takes no signals. Each says how its record settles; this
is the one place that connects to Ray, installs the stop signals, takes the batch system's stop
notice and decides how the work ended, so a new stop signal or notice is added here once.

    with Lifecycle(settle, continue_with=lambda: f"resume={run_dir}") as life:
        ...                                   # checks, the record's start
        life.connect(cfg, run_dir)            # Ray (none in local mode), then the stop signals
        with life.stops_on_notice():          # the stop notice, while the work runs
            ...                               # the work
    # on the way out, settle(Ending) once, by how the block ended:

    the block returned                  completed (a run's fit has recorded it already)
    KeyboardInterrupt                   interrupted: Ctrl-C; SIGTERM, which the stop signals turn
                                        into one; the notice, which stops the work so
    an error once the notice came       interrupted too (work the notice stopped reports itself
                                        failed: Ray Train, of its SIGTERMed workers), raised on as
                                        KeyboardInterrupt
    any other error                     failed, with one sentence: a RaydraError's own, else the
                                        error's first line

An interrupted record's reason says what stopped the work (the notice's words, or Ctrl-C/SIGTERM)
and the command that continues it. A stop signal that comes while the work is being stopped (a
second SIGTERM, Ctrl-C while the record is written) hurries the stop (Ending.hurried) and never
interrupts it: the record and the line that says how to continue still come. Nothing here exits the
process: the entry turns the exceptions into exit codes (1, 130).
"""

import contextlib
import dataclasses
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Literal, Optional, cast

from raydra.cluster import batch_system
from raydra.errors import said
from raydra.records.envelope import COMPLETED, FAILED, INTERRUPTED
from raydra.run.signals import StopSignals, sigterm_interrupts

log = logging.getLogger("raydra")

# How often a process stopped by SIGTERM looks whether the one that started it is gone.
PARENT_CHECK_S = 0.2
# What an interrupted record says stopped the work when no stop notice did.
STOPPED_BY_SIGNAL = "interrupted (Ctrl-C or SIGTERM)"


@dataclass(frozen=True)
class Ending:
    """How the work ended, for the caller's record: completed, failed or interrupted."""

    status: str
    # One sentence: why it failed, or what interrupted it and the command that continues it.
    reason: Optional[str] = None
    # False: SIGTERM's at-once record, written from a thread as the signal comes (see Lifecycle);
    # the final one follows once the work has stopped.
    final: bool = True
    # What failed it, for a record that says more than its sentence (a hung run's, raydra.run.hang_watch).
    error: Optional[BaseException] = dataclasses.field(default=None, compare=False)
    # Set when a further stop signal comes while the work is being stopped: the settle waits for
    # nothing it can do without (a checkpoint still being registered).
    hurried: threading.Event = dataclasses.field(default_factory=threading.Event, compare=False)


class Lifecycle:
    """The lifecycle of one run, trial, sweep or multirun batch (see the module's docstring).

    `settle(ending)`: the caller's record, settled; called once with the final Ending, and for a
    run with `settle_at_once` possibly once before it with a non-final one.
    `continue_with()`: the command or override that continues the work (asked when it is stopped,
    so it names where the work is by then: a resumed run's directory).
    `sigterm_as_sigint`: SIGTERM is handed to the process's own Ctrl-C handling (Ray Tune ends its
    trials and saves its state on SIGINT, so tune.resume= continues the sweep) rather than raised
    as KeyboardInterrupt where the main thread is.
    `settle_at_once`: SIGTERM also settles the record at once, from a thread, as it comes: a driver
    blocked in Ray gets back to Python only after a while, and one whose Ray node went with the
    signal (scancel's SIGTERM reaches the Ray head too) may never; the final record replaces it,
    and the at-once one is never written after the final one has begun.
    `process_ends_with_it`: the process exits once the block ends. Stopped, it ignores further
    stop signals on its way out rather than putting the previous handlers back (StopSignals.put_back):
    they have nothing left to stop, and the previous one (the kernel's default, where no Ray put one
    in) would end it as killed, exit code 143 instead of 130.
    """

    def __init__(
        self,
        settle: Callable[[Ending], None],
        continue_with: Callable[[], str],
        sigterm_as_sigint: bool = False,
        settle_at_once: bool = False,
        process_ends_with_it: bool = False,
    ) -> None:
        self._settle, self._continue_with = settle, continue_with
        self._sigterm_as_sigint, self._settle_at_once = sigterm_as_sigint, settle_at_once
        self._process_ends_with_it = process_ends_with_it
        self._signals: Optional[StopSignals] = None
        self._hurried = threading.Event()
        self._settling = threading.Lock()
        self._final_begun = False
        # The non-final record is written once, by whichever of SIGTERM's thread and the main thread comes first.
        self._settled_at_once = False
        # The process that started this one, and the block's end (_end_with_parent watches until it).
        self._parent = os.getppid()
        self._done = threading.Event()

    @property
    def notice(self) -> Any:
        """The batch system's stop notice this process watches (raydra.cluster.batch_system.notice)."""
        return batch_system.notice()

    def reason(self) -> str:
        """An interrupted record's reason: what stopped the work and the command that continues it."""
        notice = self.notice
        why = notice.reason() if notice.noticed() else STOPPED_BY_SIGNAL
        return f"{why}; continue it with {self._continue_with()}"

    # -- the steps --------------------------------------------------------------------------------

    def connect(self, cfg: Any, record_dir: Path, local: bool = False, dashboard: bool = True, launchers_local: bool = False) -> None:
        """Join or start the Ray that `cfg.ray` names (raydra.cluster.ray_cluster.connect: `record_dir` takes
        the logs of Ray across a SLURM allocation), or none with `local` (scale.num_workers=0:
        the fit runs in this process); then take the stop signals. A stop notice that came already
        interrupts at once: nothing would run."""
        if self.notice.noticed():
            raise KeyboardInterrupt
        if local:
            log.info("local mode (scale.num_workers=0): training in this process, without Ray")
        else:
            from omegaconf import OmegaConf

            from raydra.cluster.ray_cluster import connect
            from raydra.config import project
            from raydra.config.schema import SlurmConfig

            connect(
                cfg.ray.address,
                cfg.ray.num_cpus,
                cfg.verbose,
                project.runtime_env(cfg),
                dashboard=dashboard,
                launchers_local=launchers_local,
                slurm=cast(SlurmConfig, OmegaConf.to_object(cfg.slurm)),  # a structured node's object: its dataclass
                record_dir=record_dir,
            )
        self.take_stop_signals()

    def take_stop_signals(self) -> None:
        """From now on SIGTERM stops the work as Ctrl-C does (raydra.run.signals), until the block ends.
        After connecting: ray.init installs a SIGTERM handler of its own, which would end the
        process at once, without a record. Taken once; a second call changes nothing."""
        if self._signals is None:
            at_once = self._interrupted_at_once if self._settle_at_once else None
            self._signals = sigterm_interrupts(as_sigint=self._sigterm_as_sigint, at_once=at_once, again=self._hurry)

    def stops_on_notice(self, action: Optional[Callable[[], bool]] = None) -> ContextManager[None]:
        """Around the work: the batch system's stop notice stops it. `action` (run in a thread of its
        own; returns whether the work it stopped continues after a requeue) says how; by default a
        run's: its workers checkpoint at the step in flight, then this process gets SIGTERM."""
        notice = self.notice
        return notice.on_notice(action) if action is not None else notice.run_stops_on_notice()

    # -- the end ----------------------------------------------------------------------------------

    def __enter__(self) -> "Lifecycle":
        return self

    def __exit__(self, kind: Any, error: Optional[BaseException], traceback: Any) -> Literal[False]:
        try:
            if error is None:
                self._settle(Ending(COMPLETED))
            elif isinstance(error, KeyboardInterrupt):
                self._interrupted()
            elif isinstance(error, Exception):
                if self.notice.noticed():
                    self._interrupted()
                    raise KeyboardInterrupt from error
                self._settle(Ending(FAILED, said(error), error=error))
        finally:
            # First: SIGTERM's thread may be watching the parent (_end_with_parent), and putting the
            # signals back waits for that thread.
            self._done.set()
            if self._signals is not None:
                self._signals.put_back(leaving=self._process_ends_with_it and self._signals.is_stopping)
                self._signals = None
        return False  # the exception goes on to the caller's caller

    def _hurry(self) -> None:
        """A stop signal while the work is being stopped (StopSignals.stopping)."""
        if not self._hurried.is_set():
            log.warning("already stopping: the record is being written as things stand, without waiting any longer")
        self._hurried.set()

    def _interrupted(self) -> None:
        if self._signals is not None:
            self._signals.stopping()
        ending = Ending(INTERRUPTED, self.reason(), hurried=self._hurried)
        with self._settling:
            # Recorded at once, as things stand, before the final record's slower way (a driver
            # leaving Ray): one that never gets past it still leaves the work interrupted.
            if self._settle_at_once and not self._settled_at_once:
                self._settle(dataclasses.replace(ending, final=False))
            self._final_begun = True
        self._settle(ending)

    def _interrupted_at_once(self) -> None:
        """SIGTERM's thread, as the signal comes; then this process ends with the one that started it."""
        with self._settling:
            if not self._final_begun:
                self._settle(Ending(INTERRUPTED, self.reason(), final=False, hurried=self._hurried))
                self._settled_at_once = True
        self._end_with_parent()

    def _end_with_parent(self) -> None:
        """Once the record says interrupted, this process does not outlive the process that started
        it. A SLURM job's shell that runs `python train.py` (not exec'd) dies on scancel's SIGTERM at
        once; without cgroups (proctrack/linuxproc) SLURM then loses track of this process, which
        went on leaving Ray for seconds after its job had left squeue (measured), able to write into
        a run directory that a requeued job has taken over. Its parent gone, it ends at once: the
        at-once record stands, and SLURM's SIGTERM reached the Ray processes of the job as well."""
        while not self._done.wait(PARENT_CHECK_S):
            if os.getppid() != self._parent:
                log.warning("the process that started this one has ended: ending too (the record says interrupted)")
                for handler in logging.getLogger().handlers + log.handlers:
                    with contextlib.suppress(Exception):
                        handler.flush()
                os._exit(130)
