"""A multirun job's process, forked from a server that has already imported what every job's
driver imports (Hydra, Ray Train, torch, raydra): `python train.py` paid that in every job, ~3 s of
CPU each, which on a small machine came out of the jobs running beside it.

The server is multiprocessing's forkserver: a fresh interpreter started once per multirun that
imports `PRELOAD` and forks a child for each job. A child is a job as `python <command>` would be:
its own session, its console as stdout and stderr, the command's sys.argv and sys.path, and the
interpreter's exit handlers run as it ends (a process that ends through multiprocessing skips them,
and Ray, W&B and logging flush there).
"""

import io
import multiprocessing
import os
import runpy
import sys
from typing import Any, Dict, List

from raydra.private_apis import run_exit_handlers

# What a job's driver imports before it runs anything; a module missing here is imported by the
# job as usual.
PRELOAD = ["hydra", "omegaconf", "ray", "ray.train.torch", "raydra.entry", "raydra.driver", "raydra.fit"]

_context: Any = None


def _forkserver() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def start_server() -> None:
    """Start the server now (it imports for a few seconds) rather than at the first job."""
    from multiprocessing import forkserver

    _forkserver()
    forkserver.ensure_running()


def start(command: List[str], console: str, env: Dict[str, str]) -> Any:
    """Start `command` ([python, script, args...] or [python, -m, module, args...]) as a job, in
    this process's current directory; returns its multiprocessing Process."""
    process = _forkserver().Process(target=_run, args=(command, console, env, os.getcwd()), name="raydra-job")
    process.start()
    return process


def _run(command: List[str], console: str, env: Dict[str, str], cwd: str) -> None:
    os.setsid()
    os.chdir(cwd)
    fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # Unbuffered, as the job's PYTHONUNBUFFERED=1 makes `python`: each line is in the console at once.
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    os.environ.clear()
    os.environ.update(env)
    try:
        if command[1] == "-m":
            sys.argv = [command[2], *command[3:]]
            sys.path.insert(0, cwd)
            runpy.run_module(command[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = command[1:]
            sys.path.insert(0, os.path.dirname(os.path.abspath(command[1])))
            runpy.run_path(command[1], run_name="__main__")
    finally:
        run_exit_handlers()
