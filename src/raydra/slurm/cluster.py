"""Ray across the SLURM allocation this command runs in (ray.address=slurm): what Ray's own docs
leave to a sample batch script, done by the command itself.

    head     `ray start --head --block` here, holding this node's CPUs and GPUs of the allocation
             (none when here is not one of its nodes: an salloc shell on a login node)
    nodes    one `srun --nodes=1 --ntasks=1 --nodelist=<node> python -m raydra.slurm.node` per
             other node, holding that node's CPUs and GPUs (raydra.slurm.node)
    join     every node's `ray start` says it runs within slurm.join_timeout_s, or the command
             stops what it started and fails naming the node and its log
    stop     when the process ends (also after an error or Ctrl-C): SLURM's requeue first if its
             time-limit notice asked for one (raydra.slurm.time_limit), the nodes' steps, the head

Every port is a free one of its node and the head's temp dir is its own, so jobs sharing a node do
not meet. Each node's `ray start` output lands in the record's logs/slurm-ray-<node>.log on this
machine (srun hands it back), so the logs need no shared disk.
"""

import atexit
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

from raydra.cluster import ray_node
from raydra.errors import RaydraError
from raydra.private_apis.ray import reread_auth_settings, state_api_address_env
from raydra.records.layout import LOGS, slurm_node_log
from raydra.slurm import time_limit
from raydra.slurm.allocation import Allocation, current
from raydra.slurm.node import STOP as NODE_STOP

log = logging.getLogger("raydra")

# How long the nodes' steps get to stop their Ray nodes before they are killed.
STOP_S = 30.0
# How often a Ray node that fails to start (a port taken between picking and binding) is started again.
START_ATTEMPTS = 3


@dataclass
class AllocationCluster:
    allocation: Allocation
    address: str
    head: subprocess.Popen
    temp_dir: str
    requeue: bool
    nodes: Dict[str, subprocess.Popen] = field(default_factory=dict)


_running: Optional[AllocationCluster] = None


def start(record_dir: Path, join_timeout_s: float, requeue: bool) -> str:
    """Start Ray across this allocation; returns the head's address, for ray.init. Once per process
    (later calls return the same address); stopped as the process ends. The nodes' `ray start`
    output goes to `record_dir` (the run's or multirun's directory) as run_record.slurm_node_log."""
    global _running
    if _running is not None:
        return _running.address
    allocation = current()
    ray_node.keep_orphans_here()
    (record_dir / LOGS).mkdir(parents=True, exist_ok=True)
    temp_dir = tempfile.mkdtemp(prefix=f"ray-{allocation.job_id}-")
    dashboard_port = ray_node.free_port()
    # This process and the cluster's find the cluster's State API here (see raydra.cluster.ray_cluster.connect).
    os.environ.update(state_api_address_env(dashboard_port))
    job_token()
    cpus = allocation.cpus_on(allocation.here) if allocation.here else 0
    gpus = allocation.gpus_per_node if allocation.here else 0
    head_log = record_dir / slurm_node_log(allocation.here or "head")
    for attempt in range(1, START_ATTEMPTS + 1):
        # Free ports are free when picked, not when bound: another job's Ray starting on this node
        # at the same moment may take one first (seen: two jobs of a job array on one host).
        args = ["--head", *ray_node.head_port_flags(dashboard_port), *ray_node.port_flags(), f"--num-cpus={cpus}", f"--num-gpus={gpus}"]
        began = time.time()
        head = ray_node.start([*args, f"--temp-dir={temp_dir}"], head_log, dict(os.environ))
        try:
            address = ray_node.wait_head_started(head, head_log, join_timeout_s)
            break
        except RuntimeError as error:
            if attempt == START_ATTEMPTS or time.time() - began >= join_timeout_s:  # out of attempts, or of time
                shutil.rmtree(temp_dir, ignore_errors=True)
                where = allocation.here or "this machine"
                raise RaydraError(f"the Ray head of {allocation.describe()} did not start on {where}: {error}") from None
            log.info(f"the Ray head did not start (attempt {attempt} of {START_ATTEMPTS}); starting it again on other free ports")
            dashboard_port = ray_node.free_port()
            os.environ.update(state_api_address_env(dashboard_port))
    _running = AllocationCluster(allocation=allocation, address=address, head=head, temp_dir=temp_dir, requeue=requeue)
    atexit.register(stop)
    for name in allocation.others:
        _running.nodes[name] = _srun_node(allocation, name, address, record_dir / slurm_node_log(name))
    _wait_joined(_running, record_dir, join_timeout_s)
    log.info(
        f"started Ray across {allocation.describe()}: head on {allocation.here or 'this machine (outside the allocation)'}"
        + (f", nodes on {', '.join(allocation.others)}" if allocation.others else "")
    )
    return address


def job_token() -> None:
    """Token authentication for the cluster, on before its head starts: the GCS of a node that is
    not loopback listens on every interface of it (Ray 2.60 has no setting to narrow that), and a
    client there without the token could run code as the job's user (ShadowRay, CVE-2023-48022).

    The head, every node (srun hands them this environment) and this driver must agree. A token this
    process was started with (`raydra submit`'s script makes one per job) is kept; otherwise one is
    made for this job, in this process's environment, which only the job's user can read
    (/proc/<pid>/environ). RAY_AUTH_MODE=disabled, set by the user, is kept, and said. Ray read its
    mode as it was imported, which this process has been: it is told again (private_apis)."""
    mode = os.environ.get("RAY_AUTH_MODE", "").lower()
    if mode == "disabled":
        log.warning(
            "RAY_AUTH_MODE=disabled: the Ray cluster across this allocation admits any client that reaches its nodes; "
            "unset it to have a token made for the job."
        )
        return
    if mode == "token" and (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        return
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    reread_auth_settings()


def _srun_node(allocation: Allocation, node: str, address: str, log_path: Path) -> subprocess.Popen:
    """One job step on `node` holding its CPUs (and GPUs) of the job, running a Ray node there."""
    cpus = allocation.cpus_on(node)
    gpus = [f"--gres=gpu:{allocation.gpus_per_node}"] if allocation.gpus_per_node else []
    cmd = [
        "srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", f"--cpus-per-task={cpus}", *gpus,
        "--kill-on-bad-exit=1", f"--job-name=ray-node-{node}",
        sys.executable, "-m", "raydra.slurm.node", address, str(cpus),
    ]  # fmt: skip
    with open(log_path, "w") as out:
        # A session of its own: a Ctrl-C at the terminal reaches the driver, which stops the nodes
        # after recording the run, not the nodes first.
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_joined(cluster: AllocationCluster, record_dir: Path, timeout: float) -> None:
    deadline = time.time() + timeout
    waiting = dict(cluster.nodes)
    while waiting:
        for name, proc in list(waiting.items()):
            path = record_dir / slurm_node_log(name)
            text = path.read_text(errors="replace") if path.exists() else ""
            if ray_node.STARTED in text:
                del waiting[name]
            elif proc.poll() is not None or time.time() > deadline:
                stop()
                why = (
                    f"its step ended (exit code {proc.returncode})"
                    if proc.returncode is not None
                    else f"within {timeout:g} s (slurm.join_timeout_s)"
                )
                last = [line for line in text.splitlines() if line.strip()][-1:] or ["(nothing)"]
                raise RaydraError(f"SLURM node {name} did not join the Ray cluster: {why}; its output ({path}) ends with: {last[0][:300]}")
        time.sleep(0.3)


def stop() -> None:
    """Stop what start() started: this process leaves Ray, the job is requeued if SLURM's notice asked,
    the nodes' steps end (each node's `ray start` stops its processes), then the head."""
    global _running
    cluster, _running = _running, None
    if cluster is None:
        return
    import ray

    began = time.time()
    if threading.current_thread() is threading.main_thread():
        # SLURM's SIGTERM from here on (a requeue's, the time limit's) would only cut the stopping short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if ray.is_initialized():
        ray.shutdown()
    # The requeue first: SLURM then ends every process of the job itself, and the time limit close
    # behind the notice cannot end the job before it is requeued.
    time_limit.requeue_if_noticed(cluster.requeue)
    for proc in cluster.nodes.values():
        if proc.poll() is None:
            # srun passes this on to the node's task, which stops its Ray node in order; SIGTERM to
            # srun would abort the step with SIGKILL (measured).
            proc.send_signal(NODE_STOP)
    deadline = time.time() + STOP_S
    for proc in cluster.nodes.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.terminate()  # srun aborts the step
            proc.wait()
    # The head's keeper (python -m raydra.cluster.ray_node) removes its temp dir as the head ends; again
    # here for a keeper killed at stop's timeout.
    ray_node.stop(cluster.head)
    ray_node.clean_up(cluster.temp_dir)
    log.info(f"stopped Ray across {cluster.allocation.describe()} in {time.time() - began:.1f} s")
