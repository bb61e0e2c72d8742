"""SIGTERM (a scheduler's or `kill`'s stop) ends what this process drives the way Ctrl-C does, so a
run, a sweep or a multirun records itself interrupted, with the command that continues it.

Installed after connecting to Ray: ray.init puts in a SIGTERM handler of its own, which would end
the process at once, without a record. Only a process's main thread may install a handler; called
from any other thread, this changes nothing.
"""

import os
import signal
import threading
from typing import Any, Callable, Optional


def sigterm_interrupts(as_sigint: bool = False, at_once: Optional[Callable[[], None]] = None) -> Callable[[], None]:
    """Make SIGTERM interrupt this process as Ctrl-C does; returns the function that puts the
    previous handler back.

    By default the handler raises KeyboardInterrupt where the main thread is. `as_sigint`: raise
    SIGINT instead, for code that handles Ctrl-C itself (Ray Tune ends its trials and saves its
    state on SIGINT, so `tune.resume=` can continue the sweep).

    `at_once`: also called, from a thread of its own, the moment SIGTERM arrives. Python runs a
    handler only once the main thread is back in Python, and a driver blocked in Ray waits up to a
    second for that; scancel's SIGTERM reaches the Ray head's processes too, and a driver whose
    raylet has gone is ended by Ray within half a second (seen in the suite: no record at all)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, frame: Any) -> None:
        if as_sigint:
            signal.raise_signal(signal.SIGINT)
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    stop_watching = _watch_for_sigterm(at_once) if at_once else lambda: None

    def restore() -> None:
        stop_watching()
        signal.signal(signal.SIGTERM, previous)

    return restore


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
