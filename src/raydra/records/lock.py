"""A run directory's claim and lock: a directory is claimed whole before a run writes into it, and
the driver training in it holds its lock (flock) for as long as it does, so that a second driver
(resume= of the same run, a requeued SLURM job) waits for it or is refused, never writes beside it.
"""

import errno
import fcntl
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Callable

from raydra.errors import OUT_OF_SPACE, RaydraError, unwritable
from raydra.records.layout import DRIVER_LOCK

log = logging.getLogger("raydra")


# What the first writes into a claimed directory need (Hydra's .hydra/ record is ~10 KB): written
# once, then removed, so that a full disk is named with its path before the run starts.
ROOM_FOR_THE_RECORD = 64 * 1024


def claim_directory(path: str) -> str:
    """`path`, or `path_2`, `path_3`, ... when an earlier invocation already has it: two launches
    in the same second (a script, a job array, a refused command and its retry) must not share a
    run directory, where the second would overwrite the first's Hydra record. Creating the
    directory claims it, so concurrent launches cannot both take the same one.

    A directory that cannot be made or written (a read-only paths.outputs, a full disk, a run name
    longer than a file name may be) is refused in one sentence naming it, and nothing is left."""
    candidate, n = Path(path), 1
    while True:
        try:
            candidate.mkdir(parents=True)
            break
        except FileExistsError:
            n += 1
            candidate = Path(f"{path}_{n}")
        except OSError as error:
            raise _unclaimable(error, candidate) from None
    probe = candidate / ".raydra-room"
    try:
        with open(probe, "wb") as file:
            file.write(b"\0" * ROOM_FOR_THE_RECORD)
    except OSError as error:
        shutil.rmtree(candidate, ignore_errors=True)
        raise _unclaimable(error, candidate) from None
    finally:
        probe.unlink(missing_ok=True)
    return str(candidate)


def _unclaimable(error: OSError, directory: Path) -> Exception:
    if error.errno == errno.ENAMETOOLONG:
        instead = "give the run a shorter name= (it names the directory)"
    elif error.errno in OUT_OF_SPACE:
        instead = "point paths.outputs at another disk (or the run at one with hydra.run.dir=)"
    else:
        instead = "point paths.outputs at a directory you can write (or the run at one with hydra.run.dir=)"
    return unwritable(error, directory, "the run's directory", instead) or error


def hold(run_dir: Path, asked: str, wait_s: float = 0.0) -> Callable[[], None]:
    """Lock `run_dir` for this process, which trains in it from now on; returns what lets it go.

    A second driver for the same run (`resume=` given twice, a run resumed while its first driver
    still trains, a requeued job while the old one lives on) is refused here, before it writes
    anything, told which process holds the run (`asked`: what it was asked, e.g. resume=<dir>),
    once `wait_s` has passed without the holder letting go (a driver that has recorded its run
    interrupted is still leaving Ray for a few seconds). The lock is the kernel's (flock): it ends
    with the process however it ends, SIGKILL included, so a crashed driver never leaves a run
    locked. The file stays, emptied, once it is let go."""
    path = Path(run_dir) / DRIVER_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "a process on another machine"
            if time.monotonic() >= deadline:
                os.close(fd)
                raise RaydraError(
                    f"{asked}: {run_dir} is being trained by another driver ({holder}); wait for it to end, or stop it, and resume then."
                ) from None
            if not said:
                log.info(f"{run_dir} is held by another driver ({holder}); waiting up to {wait_s:.0f} s for it to let go")
                said = True
            time.sleep(0.5)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)

    def release() -> None:
        os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor lets the lock go

    return release
