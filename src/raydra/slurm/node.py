"""What srun runs on each node of the allocation but the head's: a Ray node that joins the head.

    python -m raydra.slurm.node <head address> <CPUs>

It runs as the one task of a job step on its node, so everything about it is that node's: its ports
are free ones there (two jobs sharing a node never meet), its temp dir is its own under TMPDIR, and
its GPUs are those SLURM gave the step (SLURM_GPUS_ON_NODE; none when unset, so GPUs the job was not
given stay unused). `ray start` prints to this step's output, which srun hands back to the head's
log. It stays in the foreground until the head asks it to stop (SIGUSR2 through srun) or SLURM ends
the step (SIGTERM), then stops its Ray node and removes its temp dir.
"""

import os
import signal
import sys
import tempfile
import time
from typing import List, Optional

from raydra.cluster import ray_node

# What the head sends srun to stop this node: srun passes it on to the task unchanged.
STOP = signal.SIGUSR2
# A `ray start` that fails within this many seconds failed to start, and is started again, at most
# START_ATTEMPTS times in all.
START_UP_S = 60.0
START_ATTEMPTS = 3


def main(argv: Optional[List[str]] = None) -> int:
    address, cpus = (argv if argv is not None else sys.argv[1:])[:2]
    temp_dir = tempfile.mkdtemp(prefix=f"ray-{os.environ.get('SLURM_JOB_ID', 'job')}-")
    ray_node.keep_orphans_here()
    # SIGUSR2 is how the head asks (srun passes it on to the task, where SIGTERM to srun would
    # abort the step with SIGKILL); SIGTERM is SLURM's own when the job ends.
    node = ray_node.Foreground((STOP, signal.SIGTERM, signal.SIGINT))
    code: Optional[int] = None
    for _ in range(START_ATTEMPTS):
        args = [
            f"--address={address}", f"--num-cpus={cpus}", f"--num-gpus={os.environ.get('SLURM_GPUS_ON_NODE') or 0}",
            f"--temp-dir={temp_dir}", *ray_node.port_flags(),
        ]  # fmt: skip
        began = time.time()
        # Its output goes to this step's (srun hands it back to the head's log), not a file here.
        code = node.run(ray_node.command(args), env=ray_node.environment(dict(os.environ)))
        # A port taken between picking and binding (another job's Ray starting on this node at the
        # same moment) ends `ray start` within its start-up: start it again on other free ports.
        if node.signalled or code == 0 or time.time() - began > START_UP_S:
            break
    ray_node.clean_up(temp_dir)
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
