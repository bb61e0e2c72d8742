"""A Ray node raydra starts itself with `ray start --block`: the head and the other nodes of a SLURM
allocation's cluster (raydra.slurm), and the clusters of tests and benchmarks (raydra.testing).

Every port the node listens on is a free one of the machine it starts on, so two clusters on one
machine (two jobs sharing a node, a test beside another Ray) never meet; `--block` keeps `ray start`
in the foreground as the parent of the node's processes, so one pid stops them all (`stop`), and a
scheduler that tracks a job's processes (SLURM) finds them all in the job. A node with a temp dir
of its own runs under a keeper (`main`) that removes the directory once the node has ended.
"""

import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set

from raydra.private_apis.ray import node_stops_at_once_env

# What `ray start` prints once the node runs, and the address a head tells other nodes to join.
STARTED = "Ray runtime started"
_JOIN_ADDRESS = re.compile(r"ray start --address='([^']+)'")


# The ports free_port has handed out in this process. A port picked and let go can come straight back
# from the kernel (2000 picks here: 131 and 152 repeats), and `ray start` refuses a node whose components
# share one (seen in the suite: the node manager's and the dashboard agent's, both 36207).
_handed_out: Set[int] = set()
_handing_out = threading.Lock()
# Ports Ray takes by default where a node is not told otherwise (GCS, dashboard, client server, the
# dashboard agent's HTTP port): never handed out, so a node of raydra's never collides with a
# component left on its default (seen in the suite: a head's dashboard was handed 52365, the port
# its own dashboard agent then took by default, and the head refused to start).
RAY_DEFAULT_PORTS = frozenset({6379, 8265, 10001, 52365})


def free_port() -> int:
    """A TCP port of this machine that nothing listens on now and that this process has not handed
    out before."""
    with _handing_out:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _handed_out and port not in RAY_DEFAULT_PORTS:
                _handed_out.add(port)
                return port


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
    """`[prefix...] ray start <args> --block`, its output into `log_path`, in a session of its own
    (`prefix`: a command that execs the rest, such as a test's `unshare`). With a `--temp-dir=` among
    `args`, under `python -m raydra.cluster.ray_node` (`main`), which removes that temp dir once the node
    ends, whoever ends it."""
    keeper = [sys.executable, "-m", "raydra.cluster.ray_node"] if _temp_dir_in(args) else []
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [*prefix, *keeper, *command(args)], stdout=log, stderr=subprocess.STDOUT, env=environment(env), start_new_session=True
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
    return _wait_printed(proc, log_path, timeout, lambda text: STARTED in text)


def wait_head_started(proc: subprocess.Popen, log_path: Path, timeout: float) -> str:
    """Until the head runs and has printed the address other nodes join (its GCS, on the node's
    address), which it returns; RuntimeError as `wait_started`. The address comes a few lines after
    "Ray runtime started": a log read between the two has none (seen once in CI)."""
    printed = _JOIN_ADDRESS.search(_wait_printed(proc, log_path, timeout, _JOIN_ADDRESS.search))
    assert printed is not None  # _wait_printed returns only a log the search found the address in
    return printed.group(1)


def _wait_printed(proc: subprocess.Popen, log_path: Path, timeout: float, done: Callable[[str], object]) -> str:
    deadline = time.time() + timeout
    while not done(text := log_path.read_text(errors="replace")):
        if proc.poll() is not None or time.time() > deadline:
            stop(proc)
            why = f"exited with code {proc.returncode}" if proc.returncode is not None else f"did not start within {timeout:g} s"
            raise RuntimeError(f"`ray start` {why}: {text[-2000:]}")
        time.sleep(0.3)
    return text


def stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Stop a node `start` started, by pid: SIGTERM to `ray start` (or its keeper) alone, which stops its
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


def clean_up(temp_dir: str) -> None:
    """What a node started with `--temp-dir=temp_dir` leaves once its `ray start` has ended: its
    processes stopped (stop_left_in), then the directory removed."""
    stop_left_in(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _temp_dir_in(args: Sequence[str]) -> Optional[str]:
    return next((arg.split("=", 1)[1] for arg in args if arg.startswith("--temp-dir=")), None)


class Foreground:
    """One `ray start --block` at a time as this process's child, with `signals` passed on to it as
    SIGTERM (`ray start` then stops its node's processes in order); a signal that comes between two
    starts means no more starts. What a node's keeper (`main`) and a SLURM node's task run."""

    def __init__(self, signals: Sequence[int]) -> None:
        self.proc: Optional[subprocess.Popen] = None
        self.signalled = False
        for signum in signals:
            signal.signal(signum, self._pass_on)

    def _pass_on(self, signum: int, frame: object) -> None:
        self.signalled = True
        if self.proc is not None:
            self.proc.terminate()

    def run(self, cmd: Sequence[str], env: Optional[Dict[str, str]] = None) -> Optional[int]:
        """`cmd`'s exit code once it has ended; None, starting nothing, once a signal has come."""
        if self.signalled:
            return None
        self.proc = subprocess.Popen(list(cmd), env=env)
        if self.signalled:  # between the check and the Popen
            self.proc.terminate()
        return self.proc.wait()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m raydra.cluster.ray_node ray start ... --temp-dir=DIR --block`: that command in the
    Foreground, SIGTERM and SIGINT passed on to it, and once it ends, `clean_up(DIR)`; returns its
    exit code.

    The head of a SLURM allocation's cluster runs under it. scancel's SIGTERM reaches the driver
    as well, which may block leaving a Ray whose GCS is gone until SLURM kills it, before its own
    clean-up (seen in tests/system/test_slurm.py: the head's temp dir left in /tmp); this process has
    nothing else to do."""
    cmd = list(argv if argv is not None else sys.argv[1:])
    code = Foreground((signal.SIGTERM, signal.SIGINT)).run(cmd)
    temp_dir = _temp_dir_in(cmd)
    if temp_dir:
        clean_up(temp_dir)
    return code or 0


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
    both at once) would otherwise pass to init and outlive the job (seen in tests/system/test_slurm.py)."""
    import ctypes
    import ctypes.util

    PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
    if sys.platform.startswith("linux"):
        ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


if __name__ == "__main__":
    sys.exit(main())
