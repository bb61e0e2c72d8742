"""raydra.run.signals: SIGTERM stops what this process drives as Ctrl-C does (the driver, a sweep, a
multirun's launcher), and the previous handler comes back after."""

import os
import signal
import threading

import pytest

from raydra.run.signals import sigterm_interrupts


def test_sigterm_raises_keyboard_interrupt_until_the_previous_handler_is_put_back():
    before = signal.getsignal(signal.SIGTERM)
    taken = sigterm_interrupts()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        taken.put_back()
    assert signal.getsignal(signal.SIGTERM) is before


def test_as_sigint_hands_sigterm_to_the_processs_own_ctrl_c_handler():
    seen = []
    previous_int = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    taken = sigterm_interrupts(as_sigint=True)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        taken.put_back()
        signal.signal(signal.SIGINT, previous_int)
    assert seen == [signal.SIGINT]


def test_off_the_main_thread_nothing_is_installed():
    before = signal.getsignal(signal.SIGTERM)
    restores = []
    thread = threading.Thread(target=lambda: restores.append(sigterm_interrupts()))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is before
    restores[0].put_back()
    assert signal.getsignal(signal.SIGTERM) is before


def test_at_once_runs_as_sigterm_comes_while_the_main_thread_is_still_inside_a_c_call():
    # The driver blocked in Ray: here a C call that releases the GIL and checks for no signal (hashlib's
    # key derivation). Python's handler waits for it to return; `at_once` must not. Its length is
    # measured first: this machine's speed moves 2.3 times between hours (a fixed 3,000,000 rounds took
    # 0.55 s on a fast hour, too short to tell), so the call is sized to about 2 s.
    import hashlib
    import time

    tick = time.perf_counter()
    hashlib.pbkdf2_hmac("sha256", b"raydra", b"salt", 100_000)
    rounds = int(100_000 * 2.0 / max(time.perf_counter() - tick, 1e-3))
    called = []
    taken = sigterm_interrupts(at_once=lambda: called.append(time.monotonic()))
    sender = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        sender.start()
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            hashlib.pbkdf2_hmac("sha256", b"raydra", b"salt", rounds)
        back = time.monotonic()
    finally:
        sender.join()
        taken.put_back()
    assert back - began > 1.0, "the C call ended too soon to tell"
    assert len(called) == 1 and called[0] < began + 0.7 < back


def test_without_sigterm_at_once_is_not_called_and_the_wakeup_fd_is_put_back():
    called = []
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    taken = sigterm_interrupts(at_once=lambda: called.append(True))
    previous_usr1 = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # another signal, which the wakeup fd also carries
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)
    taken.put_back()
    assert called == [] and signal.set_wakeup_fd(before) == before


def test_once_stopping_a_further_sigterm_or_ctrl_c_hurries_the_stop_instead_of_interrupting_it():
    # Two SIGTERMs 0.3 s apart: the second raised KeyboardInterrupt into the code writing the run's
    # record, which then had neither its final form nor the line saying how to continue it.
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    hurried = []
    taken = sigterm_interrupts(again=lambda: hurried.append(True))
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # the second: no KeyboardInterrupt
        assert hurried == [True]
        taken.stopping()  # the record is being written: Ctrl-C hurries too
        os.kill(os.getpid(), signal.SIGINT)
        assert hurried == [True, True]
    finally:
        taken.put_back()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
