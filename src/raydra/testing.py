"""Servers on this machine for tests and benchmarks: a Ray head node, an S3-compatible store, a SLURM cluster.

raydra's own test suite and benchmarks start them here, and a researcher's tests of their own
project can too (start a head once, then run `python train.py ray.address=<address> ...` against
it). Every server listens on a free loopback or node port and is stopped by its process id, so
nothing else running on the machine (another Ray, another test session) is touched.
"""

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from raydra.cluster import ray_node
from raydra.cluster.ray_node import free_port
from raydra.private_apis.ray import state_api_address_env

__all__ = ["free_port", "start_ray_head", "start_s3_server", "start_slurm", "stop_process_tree", "stop_ray_node", "stop_slurm"]


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
    # which names whichever cluster was started last on this machine (see raydra.cluster.ray_cluster.connect).
    env = {**env, **state_api_address_env(dashboard_port)}
    proc = ray_node.start(
        # Every port the head listens on is one handed out here: none is left to Ray's defaults.
        ["--head", *ray_node.head_port_flags(dashboard_port), *ray_node.port_flags(), f"--num-cpus={num_cpus}", "--num-gpus=0", *args],
        log_path,
        env,
    )
    try:
        # The head listens on the node's address, which `ray start` prints for joining nodes.
        return proc, ray_node.wait_head_started(proc, log_path, timeout)
    except RuntimeError as error:
        raise RuntimeError(f"the Ray head node did not start: {error}") from None


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


@dataclass
class SlurmOnHost:
    """A SLURM cluster on this machine (start_slurm): its config and the daemons' processes."""

    root: Path
    conf: Path
    nodes: List[str]
    processes: List[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> Dict[str, str]:
        """What a process needs to use this cluster's sbatch, srun, squeue, scancel: SLURM_CONF."""
        return {"SLURM_CONF": str(self.conf)}

    def command(self, *args: str, timeout: float = 30) -> str:
        """A SLURM command against this cluster; its stdout (CalledProcessError if it fails)."""
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env}, check=True)
        return done.stdout


def start_slurm(
    root: Path, nodes: int = 2, cpus_per_node: int = 1, kill_wait_s: int = 30, requeue_delay_s: int = 10, timeout: float = 60
) -> SlurmOnHost:
    """A real SLURM (Debian's slurm-wlm: slurmctld, one slurmd per node, a munged of its own) on this
    machine, as root: `nodes` nodes named node1, node2, ..., all this host, each with
    `cpus_per_node` CPUs, on free ports, with its state, spool and logs under `root` (keep it short:
    munge's socket lives there). No cgroups: processes are tracked by their parent ids.
    `requeue_delay_s`: how long a requeued job waits before it can start again (SLURM's
    cred_expire, 120 s by default). Stop it with stop_slurm."""
    import shutil
    import socket

    for program in ("slurmctld", "slurmd", "munged", "sbatch"):
        if not shutil.which(program):
            raise RuntimeError(f"{program} is not installed: apt-get install slurm-wlm munge (make test does)")
    root.mkdir(parents=True, exist_ok=True)
    names = [f"node{i + 1}" for i in range(nodes)]
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = root / "munge.sock"
    for directory in ("state", "log", *(f"spool-{n}" for n in names)):
        (root / directory).mkdir(exist_ok=True)
    host = socket.gethostname()
    lines = [
        "ClusterName=raydra",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={socket_path},cred_expire={requeue_delay_s}",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool-%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        # No cgroups here: processes tracked by their parent ids, no binding, no accounting daemon.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        "MpiDefault=none",
        f"KillWait={kill_wait_s}",
        *(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs={cpus_per_node} State=UNKNOWN" for n in names),
        f"PartitionName=debug Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP",
    ]
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    cluster = SlurmOnHost(root=root, conf=conf, nodes=names)
    daemons = [
        ["munged", "--foreground", f"--socket={socket_path}", f"--key-file={key}", f"--pid-file={root}/munged.pid",
         f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge.seed"],
        ["slurmctld", "-D", "-f", str(conf)],
        *(["slurmd", "-D", "-N", n, "-f", str(conf)] for n in names),
    ]  # fmt: skip
    env = {**os.environ, **cluster.env}
    try:
        for argv in daemons:
            with open(root / "log" / f"{argv[0]}-{argv[-3] if argv[0] == 'slurmd' else 'main'}.out", "w") as out:
                cluster.processes.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            if argv[0] == "munged":
                _wait_for(cluster.processes[-1], socket_path.exists, root / "log" / "munged.log", "munged", timeout)
        deadline = time.time() + timeout
        while True:
            try:
                states = cluster.command("sinfo", "-h", "-N", "-o", "%T").split()
            except subprocess.SubprocessError:
                states = []
            if len(states) == nodes and all(s == "idle" for s in states):
                return cluster
            dead = [p.args[0] for p in cluster.processes if p.poll() is not None]
            if dead or time.time() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"nodes not idle within {timeout:g} s ({states})"
                logs = "".join((root / "log" / name).read_text()[-1500:] for name in ("slurmctld.log",) if (root / "log" / name).exists())
                raise RuntimeError(f"SLURM did not start: {why}; {logs}")
            time.sleep(0.5)
    except BaseException:
        stop_slurm(cluster)
        raise


def stop_slurm(cluster: SlurmOnHost) -> None:
    """Cancel this cluster's jobs (their processes end as SLURM ends a job's), then stop its daemons
    by pid: slurmd, slurmctld, munged."""
    try:
        jobs = cluster.command("squeue", "-h", "-o", "%i").split()
        if jobs:
            cluster.command("scancel", *jobs)
            deadline = time.time() + 60
            while cluster.command("squeue", "-h", "-o", "%i").split() and time.time() < deadline:
                time.sleep(0.5)
    except (subprocess.SubprocessError, OSError):
        pass  # the controller is not up: nothing ran
    for proc in reversed(cluster.processes):
        stop_process_tree(proc)
    _stop_escaped(cluster)


def _stop_escaped(cluster: SlurmOnHost) -> None:
    """Kill what this cluster's jobs started and SLURM no longer tracks. Without cgroups SLURM finds a
    job's processes by their parents; one whose parent exited first (a Ray node's processes when its
    `ray start` is killed) is inherited by init and outlives the job. Every process of a job inherits
    its SLURM_CONF, which names this cluster alone."""
    import psutil

    mine = f"SLURM_CONF={cluster.conf}"
    escaped = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and mine in open(f"/proc/{proc.pid}/environ", "rb").read().decode(errors="replace").split("\0"):
                escaped.append(proc)
        except (OSError, psutil.Error):
            continue
    for proc in escaped:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(escaped, timeout=10)
    if escaped:
        print(f"killed {len(escaped)} processes this SLURM's jobs left running: {[p.pid for p in escaped]}", file=sys.stderr)


def stop_process_tree(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Stop `proc` and everything it spawned (for `ray start`: GCS, raylet, dashboard and their
    agents), by pid; whatever is left after `timeout` seconds is killed."""
    ray_node.stop_tree(proc, timeout)


def stop_ray_node(proc: subprocess.Popen) -> None:
    """Stop a `ray start --block` node, by pid (raydra.cluster.ray_node.stop)."""
    ray_node.stop(proc)
