"""raydra.signals: SIGTERM stops what this process drives as Ctrl-C does (the driver, a sweep, a
multirun's launcher), and the previous handler comes back after."""

import os
import signal
import threading

import pytest

from raydra.signals import sigterm_interrupts


def test_sigterm_raises_keyboard_interrupt_until_the_previous_handler_is_put_back():
    before = signal.getsignal(signal.SIGTERM)
    restore = sigterm_interrupts()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_as_sigint_hands_sigterm_to_the_processs_own_ctrl_c_handler():
    seen = []
    previous_int = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    restore = sigterm_interrupts(as_sigint=True)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        restore()
        signal.signal(signal.SIGINT, previous_int)
    assert seen == [signal.SIGINT]


def test_off_the_main_thread_nothing_is_installed():
    before = signal.getsignal(signal.SIGTERM)
    restores = []
    thread = threading.Thread(target=lambda: restores.append(sigterm_interrupts()))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is before
    restores[0]()
    assert signal.getsignal(signal.SIGTERM) is before
