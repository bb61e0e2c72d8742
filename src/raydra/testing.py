"""Servers on this machine for tests and benchmarks: a Ray head node and an S3-compatible store.

raydra's own test suite and benchmarks start them here, and a researcher's tests of their own
project can too (start a head once, then run `python train.py ray.address=<address> ...` against
it). Every server listens on a free loopback or node port and is stopped by its process id, so
nothing else running on the machine (another Ray, another test session) is touched.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from raydra.cluster import free_port
from raydra.private_apis import state_api_address_env

__all__ = ["free_port", "start_ray_head", "start_s3_server", "stop_process_tree", "stop_ray_node"]


def _wait_for(proc: subprocess.Popen, ready, log_path: Path, what: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while not ready():
        if proc.poll() is not None or time.time() > deadline:
            stop_process_tree(proc)
            raise RuntimeError(f"{what} did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.3)


def start_ray_head(
    log_path: Path, env: Dict[str, str], num_cpus: int = 2, args: Sequence[str] = (), timeout: float = 120
) -> Tuple[subprocess.Popen, str]:
    """`ray start --head --block` on free ports; returns the process and the address nodes and
    drivers join (`ray.address=`). Stop it with stop_process_tree."""
    dashboard_port = free_port()
    # The cluster's own processes find its State API here, not through /tmp/ray/ray_current_cluster,
    # which names whichever cluster was started last on this machine (see raydra.cluster.connect).
    env = {**env, **state_api_address_env(dashboard_port)}
    cmd = [
        str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
        f"--port={free_port()}", f"--dashboard-port={dashboard_port}", f"--ray-client-server-port={free_port()}",
        f"--num-cpus={num_cpus}", "--num-gpus=0", "--disable-usage-stats", *args,
    ]  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    _wait_for(proc, lambda: "Ray runtime started" in log_path.read_text(), log_path, "the Ray head node", timeout)
    # The head listens on the node's address, which `ray start` prints for joining nodes.
    return proc, re.search(r"ray start --address='([^']+)'", log_path.read_text()).group(1)


def start_s3_server(log_path: Path, env: Optional[Dict[str, str]] = None, timeout: float = 60) -> Tuple[subprocess.Popen, str]:
    """moto's S3 server mode on a free loopback port (the store Ray's own storage tests use);
    returns the process and its endpoint "127.0.0.1:PORT". moto[server] 5.2.5 at least: older
    ones break pyarrow 26's multipart uploads."""
    import urllib.request

    port = free_port()

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
            return True
        except OSError:
            return False

    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True,
        )  # fmt: skip
    _wait_for(proc, answers, log_path, "the S3 server", timeout)
    return proc, f"127.0.0.1:{port}"


def stop_process_tree(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Stop `proc` and everything it spawned (for `ray start`: GCS, raylet, dashboard and their
    agents), by pid; whatever is left after `timeout` seconds is killed."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def stop_ray_node(proc: subprocess.Popen) -> None:
    """Stop a `ray start --block` node, by pid: SIGTERM to `ray start` alone, which stops its
    processes in order (measured: all gone in ~5 s, where SIGTERM to each at once leaves the GCS,
    raylet and agents running until the 10 s kill); whatever is left after 20 s is killed."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
        tree[0].terminate()
    except psutil.NoSuchProcess:
        return
    _, alive = psutil.wait_procs(tree, timeout=20)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
