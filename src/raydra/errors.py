"""The one exception type raydra raises for mistakes a user can fix, and the sentences for errors
the user fixes outside raydra (a full disk)."""

import errno
import os


class RaydraError(Exception):
    """A user-facing error: its message is one sentence naming the key or path and the fix."""


# Set on an exception that a training function raised in the driver's own process (local mode):
# the rank whose logs/worker_<rank>.log holds its traceback (raydra.fit.one_line names that file).
WORKER_RANK = "raydra_worker_rank"

# What the OS says when a disk, or a quota on it, is full.
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)


def out_of_space(error: BaseException, path: object, what: str) -> "RaydraError | None":
    """A full disk met while writing `what` at `path`, as one sentence; None for any other error.
    pyarrow reports the OS's errno in its message only, so the message is read too."""
    if not isinstance(error, OSError):
        return None
    if error.errno not in OUT_OF_SPACE and not any(os.strerror(code) in str(error) for code in OUT_OF_SPACE):
        return None
    return RaydraError(
        f"the disk holding {path} is full: writing {what} failed, and nothing half-written was kept; "
        "free space there, then continue the run with resume=latest."
    )
