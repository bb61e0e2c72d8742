"""A Ray node raydra starts itself with `ray start --block`: the head and the other nodes of a SLURM
allocation's cluster (raydra.slurm), and the clusters of tests and benchmarks (raydra.testing).

Every port the node listens on is a free one of the machine it starts on, so two clusters on one
machine (two jobs sharing a node, a test beside another Ray) never meet; `--block` keeps `ray start`
in the foreground as the parent of the node's processes, so one pid stops them all (`stop`), and a
scheduler that tracks a job's processes (SLURM) finds them all in the job.
"""

import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

from raydra.private_apis import node_stops_at_once_env

# What `ray start` prints once the node runs, and the address a head tells other nodes to join.
STARTED = "Ray runtime started"
_JOIN_ADDRESS = re.compile(r"ray start --address='([^']+)'")


def free_port() -> int:
    """A TCP port of this machine that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_command() -> str:
    """The `ray` script of the environment this Python runs in."""
    return str(Path(sys.executable).parent / "ray")


def port_flags() -> List[str]:
    """`ray start` flags for every port a non-head node listens on, each a free one here."""
    return [
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
    ]


def head_port_flags(dashboard_port: int) -> List[str]:
    """The ports a head adds: its GCS, its dashboard (Ray's State API) and its client server."""
    return [f"--port={free_port()}", f"--dashboard-port={dashboard_port}", f"--ray-client-server-port={free_port()}"]


def start(args: Sequence[str], log_path: Path, env: Dict[str, str], prefix: Sequence[str] = ()) -> subprocess.Popen:
    """`[prefix...] ray start <args> --block`, its output into `log_path`, in a session of its own."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [*prefix, *command(args)], stdout=log, stderr=subprocess.STDOUT, env=environment(env), start_new_session=True
        )


def command(args: Sequence[str]) -> List[str]:
    """`ray start <args>` in the foreground (`--block`), as raydra starts every Ray node."""
    return [ray_command(), "start", *args, "--disable-usage-stats", "--block"]


def environment(env: Dict[str, str]) -> Dict[str, str]:
    """`env` for a Ray node raydra starts: one that stops at once on SIGTERM (private_apis)."""
    return {**env, **node_stops_at_once_env()}


def wait_started(proc: subprocess.Popen, log_path: Path, timeout: float) -> str:
    """Until the node runs; returns what `ray start` printed. RuntimeError with the log's end if it
    exits first or takes longer than `timeout` seconds (the node is stopped then)."""
    deadline = time.time() + timeout
    while STARTED not in (text := log_path.read_text(errors="replace")):
        if proc.poll() is not None or time.time() > deadline:
            stop(proc)
            why = f"exited with code {proc.returncode}" if proc.returncode is not None else f"did not start within {timeout:g} s"
            raise RuntimeError(f"`ray start` {why}: {text[-2000:]}")
        time.sleep(0.3)
    return text


def join_address(printed: str) -> str:
    """The address a head's `ray start` told other nodes to join (its GCS, on the node's address)."""
    return _JOIN_ADDRESS.search(printed).group(1)


def stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Stop a `ray start --block` node, by pid: SIGTERM to `ray start` alone, which stops its
    processes in order (measured: all gone in ~5 s, where SIGTERM to each at once leaves the GCS,
    raylet and agents running until the 10 s kill); whatever is left after `timeout` s is killed."""
    stop_tree(proc, timeout, every_process=False)


def stop_tree(proc: subprocess.Popen, timeout: float = 10, every_process: bool = True) -> None:
    """Stop `proc` and every process it spawned, by pid: SIGTERM to each of them (or to `proc`
    alone, when it stops its own), then SIGKILL to whatever is left after `timeout` seconds."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return
    _end(tree, tree if every_process else tree[:1], timeout)
    proc.poll()


def stop_left_in(temp_dir: str, timeout: float = 5) -> int:
    """Stop the processes of a node started with `--temp-dir=temp_dir` that outlived its `ray start`
    (every one of them names a path below it: sockets, session, logs); returns how many. When SLURM's
    scancel sends SIGTERM to the whole job, `ray start` ends first and its raylet's workers, which
    lose their parent, are left to stop on their own (seen: a worker still running after the job)."""
    import psutil

    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}
    left = [
        p for p in psutil.process_iter(["cmdline"]) if p.pid not in spared and any(temp_dir in part for part in p.info["cmdline"] or [])
    ]
    _end(left, left, timeout)
    return len(left)


def _end(processes: list, signalled: list, timeout: float) -> None:
    """SIGTERM to `signalled`, then SIGKILL to whatever of `processes` is left after `timeout` s."""
    import psutil

    for p in signalled:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def keep_orphans_here() -> None:
    """Make this process the parent of any of its descendants whose own parent exits first (Linux's
    child subreaper), so that they stay in this process's tree. SLURM without cgroups finds a job's
    processes by their parents: a Ray worker whose raylet ends before it (scancel's SIGTERM reaches
    both at once) would otherwise pass to init and outlive the job (seen in tests/test_slurm.py)."""
    import ctypes
    import ctypes.util

    PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
    if sys.platform.startswith("linux"):
        ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
