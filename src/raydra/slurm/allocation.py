"""What SLURM gave this job, read once from the variables it sets in a batch script, an salloc
shell or a job step: the nodes in order, the CPUs and GPUs on each, the node this process runs on,
how often the job was requeued.

    SLURM_JOB_ID, SLURM_JOB_NODELIST ("gpu[01-02]", expanded by `scontrol show hostnames`),
    SLURM_JOB_CPUS_PER_NODE ("8(x2)" or "8,4"), SLURM_GPUS_ON_NODE / SLURM_GPUS_PER_NODE,
    SLURMD_NODENAME (unset in an salloc shell on a login node), SLURM_RESTART_COUNT, and inside a
    job step SLURM_STEP_ID with SLURM_STEP_NUM_TASKS.
"""

import math
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

from raydra.config.schema import ScaleConfig, SlurmConfig
from raydra.errors import RaydraError
from raydra.slurm import JOB_ID  # noqa: E402 - the package's one name for it


@dataclass(frozen=True)
class Allocation:
    # "" for the allocation `raydra submit` is about to ask for.
    job_id: str
    nodes: Tuple[str, ...]
    # CPUs the job holds on each node, in the order of `nodes`.
    cpus: Tuple[int, ...]
    # GPUs the job holds on each node (SLURM allocates them evenly: --gpus-per-node, --gres).
    gpus_per_node: int
    # The node this process runs on, or None outside the allocation (an salloc shell on a login node).
    here: Optional[str]
    # How often SLURM requeued the job (0 on its first start).
    restarts: int = 0

    @property
    def total_cpus(self) -> int:
        return sum(self.cpus)

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * len(self.nodes)

    @property
    def others(self) -> List[str]:
        """The nodes that get a Ray node through srun: every node but the one the head runs on."""
        return [node for node in self.nodes if node != self.here]

    def cpus_on(self, node: str) -> int:
        return self.cpus[self.nodes.index(node)]

    def describe(self) -> str:
        gpus = f", {self.gpus_per_node} GPUs each" if self.gpus_per_node else ""
        sizes = sorted(set(self.cpus))
        cpus = f"{sizes[0]} CPUs" if len(sizes) == 1 else f"{'/'.join(map(str, self.cpus))} CPUs"
        what = f"SLURM job {self.job_id}" if self.job_id else "the allocation slurm.* asks for"
        return f"{what} ({len(self.nodes)} node{'s' if len(self.nodes) > 1 else ''} x {cpus}{gpus})"


def current(env: Mapping[str, str] = os.environ) -> Allocation:
    """The allocation this process runs in; a RaydraError naming what is missing outside one, or
    inside a step of several tasks (each would start a cluster of its own)."""
    if not env.get(JOB_ID):
        raise RaydraError(
            "ray.address=slurm starts Ray across a SLURM allocation, but this process runs outside one (no SLURM_JOB_ID); "
            "run it inside sbatch or salloc, submit it with `raydra submit`, or set ray.address to a running cluster."
        )
    tasks = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1) if env.get("SLURM_STEP_ID") else 1
    if tasks > 1:
        raise RaydraError(
            f"ray.address=slurm starts Ray across the allocation from one process, but this is one of {tasks} tasks of "
            f"job step {env.get('SLURM_JOB_ID')}.{env.get('SLURM_STEP_ID')}, each of which would start its own; "
            "run the command once (in the batch script itself, or `srun --ntasks=1`)."
        )
    nodes = tuple(hostnames(env["SLURM_JOB_NODELIST"]))
    cpus = tuple(cpus_per_node(env.get("SLURM_JOB_CPUS_PER_NODE", ""), len(nodes)))
    here = env.get("SLURMD_NODENAME")
    return Allocation(
        job_id=env[JOB_ID],
        nodes=nodes,
        cpus=cpus,
        gpus_per_node=gpus_per_node(env),
        here=here if here in nodes else None,
        restarts=int(env.get("SLURM_RESTART_COUNT") or 0),
    )


def requeued(env: Mapping[str, str] = os.environ) -> Optional[str]:
    """This SLURM job's id when SLURM requeued it (the job runs its batch script again), else None."""
    return env.get(JOB_ID) if env.get(JOB_ID) and int(env.get("SLURM_RESTART_COUNT") or 0) > 0 else None


def job_record(env: Mapping[str, str] = os.environ) -> Optional[Dict[str, object]]:
    """What summary.json records of the SLURM job a run ran in (None outside one): how to find its
    logs and its accounting (sacct -j <job_id>), and how often it was requeued."""
    if not env.get(JOB_ID):
        return None
    return {"job_id": env[JOB_ID], "nodes": env.get("SLURM_JOB_NODELIST"), "restarts": int(env.get("SLURM_RESTART_COUNT") or 0)}


def hostnames(nodelist: str) -> List[str]:
    """SLURM's compressed node list ("gpu[01-03,07],cpu1") as host names, as SLURM expands it."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as error:
        raise RaydraError(
            f"could not expand SLURM_JOB_NODELIST={nodelist} with `scontrol show hostnames` ({error}); is SLURM's scontrol on PATH?"
        ) from None
    return out.stdout.split()


def cpus_per_node(value: str, count: int) -> List[int]:
    """SLURM_JOB_CPUS_PER_NODE ("8(x2),4": 8, 8, 4) as one count per node."""
    cpus: List[int] = []
    for part in filter(None, value.split(",")):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not found:
            raise RaydraError(f"SLURM_JOB_CPUS_PER_NODE={value} is not in SLURM's form (e.g. 8(x2),4); is this a SLURM job?")
        cpus += [int(found.group(1))] * int(found.group(2) or 1)
    if len(cpus) != count:
        raise RaydraError(f"SLURM_JOB_CPUS_PER_NODE={value} names {len(cpus)} nodes but SLURM_JOB_NODELIST {count}; is this a SLURM job?")
    return cpus


def gpus_per_node(env: Mapping[str, str]) -> int:
    """GPUs per node: this node's count where SLURM states it, else what --gpus-per-node asked
    ("4" or "a100:4"), else none."""
    if env.get("SLURM_GPUS_ON_NODE"):
        return int(env["SLURM_GPUS_ON_NODE"])
    asked = env.get("SLURM_GPUS_PER_NODE", "")
    found = re.search(r"(\d+)$", asked)
    return int(found.group(1)) if found else 0


def asked_for(slurm: SlurmConfig, scale: ScaleConfig) -> Tuple[int, int]:
    """(CPUs, GPUs) per node that `raydra submit` asks for: slurm.cpus_per_node / gpus_per_node, or
    what the run's workers need on each node when they are null."""
    per_node = math.ceil(scale.max_workers / slurm.nodes)
    cpus = slurm.cpus_per_node if slurm.cpus_per_node is not None else max(1, math.ceil(per_node * scale.cpus_per_worker))
    gpus = slurm.gpus_per_node
    if gpus is None:
        gpus = math.ceil(per_node * scale.gpus_per_worker) if scale.use_gpu else 0
    return cpus, gpus


def too_small(allocation: Allocation, scale: ScaleConfig) -> Iterator[str]:
    """Why the allocation cannot hold the run's workers, one sentence naming both numbers each, or
    nothing. Counted per node, as Ray places a worker on one node: an elastic group counts at its min."""
    workers = scale.min_workers
    if workers == 0:
        return
    # The head node's CPUs hold the driver as well, but it asks Ray for none.
    per_node = [_fits(cpus, allocation.gpus_per_node, scale) for cpus in allocation.cpus]
    if sum(per_node) >= workers:
        return
    need = f"{scale.cpus_per_worker:g} CPU" + (f" and {scale.gpus_per_worker:g} GPU" if scale.use_gpu else "")
    holds = sum(per_node)
    yield (
        f"scale.num_workers={workers} workers of {need} each do not fit {allocation.describe()}, which holds {holds} such "
        f"worker{'s' if holds != 1 else ''}; lower scale.num_workers to {holds} or ask SLURM for more (slurm.nodes, --cpus-per-task, --gpus-per-node)."
    )


def _fits(cpus: int, gpus: int, scale: ScaleConfig) -> int:
    by_cpu = int(cpus // scale.cpus_per_worker) if scale.cpus_per_worker > 0 else 1 << 30
    if not scale.use_gpu:
        return by_cpu
    by_gpu = int(gpus // scale.gpus_per_worker) if scale.gpus_per_worker > 0 else 1 << 30
    return min(by_cpu, by_gpu)
