"""The process of one multirun job of raydra's own command, on the launcher's machine, forked from a
server that has already imported what every job imports (Hydra, Ray Train, torch, raydra): a fresh
`python` paid that in every job, ~3 s of CPU each, which on a small machine came out of the jobs
running beside it. The job's run is a Ray driver there; its workers take the cluster's resources.

The server is multiprocessing's forkserver, started once per multirun; it forks a child for each
job. Like any forkserver child, the child imports the launcher's `__main__` (the user's script)
once, as `__mp_main__`. It has its own session (Ctrl-C reaches the launcher only, which stops each
job once), the launcher's working directory and environment as of the job's start, its console
file as stdout and stderr, and it stops (SIGTERM: recorded as interrupted) when the launcher is
gone. It runs the job (raydra.multirun.job.execute: Hydra's run_job) and sends its JobReturn back
through a pipe, then runs the interpreter's exit handlers (a process that ends through
multiprocessing skips them, and Ray, W&B and logging flush there).
"""

import ctypes
import io
import multiprocessing
import os
import signal
import sys
from typing import Any, Dict, Optional, Tuple

from raydra.private_apis.ray import RAY_MODULES_IMPORTED_ON_FIRST_USE, leave_forkserver, run_exit_handlers

# What a job imports before it runs anything; a module missing here is imported by the job as usual.
# raydra.multirun.job_server comes before Ray's modules: what it changes must hold while they import.
PRELOAD = [
    "raydra.multirun.job_server",
    "hydra",
    "hydra.core.utils",
    "omegaconf",
    "cloudpickle",
    "ray",
    "ray.train.torch",
    "raydra.entry",
    "raydra.run.driver",
    "raydra.run.fit",
    "raydra.multirun.job",
    # What every job imported after the fork (-X importtime of a job, 2026-11-28): what the run's
    # config checks import, what Ray's serialization context imports at the first actor call
    # (pydantic.v1, starlette, pyarrow's), Ray Data's context the trainer reads, and what
    # ray.shutdown imports at the job's end (ray.dag).
    "raydra.config.checks",
    "raydra.config.user_callbacks",
    "pydantic.v1.fields",
    "starlette.datastructures",
    "pyarrow.json",
    "ray.dag.compiled_dag_node",
    *RAY_MODULES_IMPORTED_ON_FIRST_USE,
]
# Linux's prctl option that has the kernel signal a process when its parent ends.
PR_SET_PDEATHSIG = 1

_context: Any = None


def _forkserver() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def start_server(env: Optional[Dict[str, str]] = None) -> None:
    """Start the server now (it imports for a few seconds) rather than at the first job. `env`:
    variables the server imports with beyond this process's environment (which is left as it was)."""
    from multiprocessing import forkserver

    _forkserver()
    before = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        forkserver.ensure_running()
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def start(payload: bytes, console: str, env: Dict[str, str]) -> Tuple[Any, Any]:
    """Start the job `payload` (raydra.multirun.job.JobPayload.dumps()) in a process of its own, in
    this process's current directory, its output appended to `console`. Returns its multiprocessing
    Process and the reading end of the pipe its pickled JobReturn comes through."""
    context = _forkserver()
    result, sender = context.Pipe(duplex=False)
    process = context.Process(target=_run, args=(payload, sender, console, env, os.getcwd()), name="raydra-job")
    process.start()
    sender.close()
    return process, result


def _run(payload: bytes, sender: Any, console: str, env: Dict[str, str], cwd: str) -> None:
    os.setsid()
    # The server ends when the launcher does (a lost launcher, kill -9): the job then stops as it
    # would on Ctrl-C, recording its run interrupted, rather than train on unwatched.
    leave_forkserver()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the server was gone before the line above
        os.kill(os.getpid(), signal.SIGTERM)
    os.chdir(cwd)
    fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # Unbuffered, as PYTHONUNBUFFERED=1 makes `python`: each line is in the console at once.
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    os.environ.clear()
    os.environ.update(env)
    from raydra.multirun.job import execute

    try:
        sender.send_bytes(execute(payload))
    except KeyboardInterrupt:
        # Stopped (the launcher's SIGTERM, or its end): the run has recorded itself interrupted, and
        # says so in one line; 130 is the shell's code for it.
        raise SystemExit(130) from None
    finally:
        sender.close()
        run_exit_handlers()
