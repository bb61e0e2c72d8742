"""SIGTERM (a scheduler's or `kill`'s stop) ends what this process drives the way Ctrl-C does, so a
run, a sweep or a multirun records itself interrupted, with the command that continues it.

Installed after connecting to Ray: ray.init puts in a SIGTERM handler of its own, which would end
the process at once, without a record. Only a process's main thread may install a handler; called
from any other thread, this changes nothing.
"""

import signal
import threading
from typing import Any, Callable


def sigterm_interrupts(as_sigint: bool = False) -> Callable[[], None]:
    """Make SIGTERM interrupt this process as Ctrl-C does; returns the function that puts the
    previous handler back.

    By default the handler raises KeyboardInterrupt where the main thread is. `as_sigint`: raise
    SIGINT instead, for code that handles Ctrl-C itself (Ray Tune ends its trials and saves its
    state on SIGINT, so `tune.resume=` can continue the sweep)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, frame: Any) -> None:
        if as_sigint:
            signal.raise_signal(signal.SIGINT)
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, previous)
