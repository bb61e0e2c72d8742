"""SLURM: a run uses a whole allocation as its Ray cluster (ray.address=slurm), submits itself with
`raydra submit`, and meets the time limit by checkpointing and requeueing (docs/slurm.md).

    allocation.py   what SLURM gave this job (nodes, CPUs, GPUs, restarts), read from its variables
    cluster.py      Ray across the allocation: a head where the command runs, a node per other node
                    through srun; stopped when the command ends
    node.py         what srun runs on each other node: `ray start --block` on that node's free ports
    time_limit.py   SLURM's warning before the time limit: checkpoint at the step in flight, requeue
    submit.py       `raydra submit`: the batch script into the run's record, sbatch, where to look

A run outside SLURM imports only this package's SYSTEM (raydra.cluster.batch_system finds it through its
entry point), whose modules load on first use.
"""

from typing import Any, Dict, List, Mapping, Optional

# The variable that says a process runs inside a SLURM job.
JOB_ID = "SLURM_JOB_ID"


class Slurm:
    """SLURM as raydra.cluster.batch_system asks for a batch system (found through the entry point
    `raydra.batch_systems: slurm` in pyproject.toml). Its modules are imported on first use, so a
    run outside SLURM loads only this class."""

    name = "slurm"

    @property
    def signal(self) -> Any:
        from raydra.slurm import time_limit

        return time_limit.NOTICE

    def inside(self, env: Mapping[str, str]) -> bool:
        return bool(env.get(JOB_ID))

    def job_record(self, env: Mapping[str, str]) -> Optional[Dict[str, object]]:
        from raydra.slurm import allocation

        return allocation.job_record(env)

    def requeued(self, env: Mapping[str, str]) -> Optional[str]:
        from raydra.slurm import allocation

        return allocation.requeued(env)

    def too_small(self, scale: Any) -> List[str]:
        from raydra.slurm import allocation

        return list(allocation.too_small(allocation.current(), scale))

    def prepare_cluster(self) -> None:
        from raydra.slurm import cluster

        cluster.job_token()

    def start_cluster(self, record_dir: Any, settings: Any) -> str:
        from raydra.slurm import cluster

        return cluster.start(record_dir, settings.join_timeout_s, settings.requeue)

    # SLURM's warning before the time limit (SIGUSR1), raydra.slurm.time_limit's.
    def watch(self) -> None:
        from raydra.slurm import time_limit

        time_limit.watch()

    def watched(self) -> bool:
        from raydra.slurm import time_limit

        return time_limit.watched()

    def noticed(self) -> bool:
        from raydra.slurm import time_limit

        return time_limit.noticed()

    def reason(self) -> str:
        from raydra.slurm import time_limit

        return time_limit.reason()

    def on_notice(self, action: Any) -> Any:
        from raydra.slurm import time_limit

        return time_limit.on_notice(action)

    def run_stops_on_notice(self) -> Any:
        from raydra.slurm import time_limit

        return time_limit.run_stops_on_notice()


SYSTEM = Slurm()
