"""SIGTERM (a scheduler's or `kill`'s stop) ends what this process drives the way Ctrl-C does, so a
run, a sweep or a multirun records itself interrupted, with the command that continues it.

Installed after connecting to Ray: ray.init puts in a SIGTERM handler of its own, which would end
the process at once, without a record. Only a process's main thread may install a handler; called
from any other thread, this changes nothing.

Once the work is stopping, a further SIGTERM or Ctrl-C hurries the stop rather than interrupting
the code that stops it and writes its record (StopSignals.stopping).
"""

import os
import signal
import threading
from typing import Any, Callable, Dict, Optional


def sigterm_interrupts(
    as_sigint: bool = False, at_once: Optional[Callable[[], None]] = None, again: Optional[Callable[[], None]] = None
) -> "StopSignals":
    """Make SIGTERM interrupt this process as Ctrl-C does; returns what puts the previous handler
    back (StopSignals.put_back).

    By default the handler raises KeyboardInterrupt where the main thread is. `as_sigint`: raise
    SIGINT instead, for code that handles Ctrl-C itself (Ray Tune ends its trials and saves its
    state on SIGINT, so `tune.resume=` can continue the sweep).

    `at_once`: also called, from a thread of its own, the moment SIGTERM arrives. Python runs a
    handler only once the main thread is back in Python, and a driver blocked in Ray waits up to a
    second for that; scancel's SIGTERM reaches the Ray head's processes too, and a driver whose
    raylet has gone is ended by Ray within half a second (seen in the suite: no record at all).

    `again`: called instead of interrupting once the work is stopping (a SIGTERM after the first,
    or any stop signal after StopSignals.stopping): a second KeyboardInterrupt would land in the
    code that stops the work and records it, and cut it short (two SIGTERMs 0.3 s apart left a run
    with no final record and no line saying how to continue it). The second signal hurries the
    stop; it does not silence it."""
    return StopSignals(as_sigint, at_once, again)


class StopSignals:
    """SIGTERM taken as Ctrl-C (sigterm_interrupts), and the stop signals once the work is stopping."""

    def __init__(self, as_sigint: bool, at_once: Optional[Callable[[], None]], again: Optional[Callable[[], None]]) -> None:
        self._as_sigint, self._again = as_sigint, again
        self._stopping = False
        # What each signal's handler was before, to put back; nothing is installed off the main thread.
        self._previous: Dict[int, Any] = {}
        self._stop_watching: Callable[[], None] = lambda: None
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_sigterm)
        if at_once:
            self._stop_watching = _watch_for_sigterm(at_once)

    @property
    def is_stopping(self) -> bool:
        return self._stopping

    def stopping(self) -> None:
        """The work is being stopped (by Ctrl-C, SIGTERM or a notice): from now on SIGTERM and Ctrl-C
        call `again` instead of interrupting what stops it."""
        self._stopping = True
        if self._previous and signal.SIGINT not in self._previous:
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_again)

    def put_back(self, leaving: bool = False) -> None:
        """Stop watching, and put the previous handlers back. `leaving`: the process ends now, with
        the work it stopped; SIGTERM and Ctrl-C are ignored on its way out instead, having nothing
        left to stop. The previous handler may be the kernel's default, which would end it as killed
        (exit code 143, not 130), and so would a handler of Python's own in its last moments: Python
        puts the default back for those as it finalizes, but leaves an ignored signal ignored."""
        self._stop_watching()
        self._stop_watching = lambda: None
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if leaving else handler)
        self._previous = {}

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._stopping:
            self._on_again(signum, frame)
            return
        self._stopping = True
        if self._as_sigint:
            signal.raise_signal(signal.SIGINT)
            return
        raise KeyboardInterrupt

    def _on_again(self, signum: int, frame: Any) -> None:
        if self._again is not None:
            self._again()


def _watch_for_sigterm(at_once: Callable[[], None]) -> Callable[[], None]:
    """Call `at_once` in a thread as SIGTERM arrives; returns the function that stops watching.

    Python's own C-level handler writes each signal's number to the wakeup fd as the signal comes,
    whichever thread the kernel picked and wherever the main thread is (signal.set_wakeup_fd)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            try:
                said = os.read(read_end, 64)
            except OSError:
                return
            if not said:
                return  # stopped
            if signal.SIGTERM in said:
                at_once()
                return

    thread = threading.Thread(target=watch, name="raydra-sigterm", daemon=True)
    thread.start()

    def stop() -> None:
        signal.set_wakeup_fd(previous_fd)
        os.close(write_end)  # the watcher reads the end of the pipe and returns
        thread.join(timeout=30)
        os.close(read_end)

    return stop
