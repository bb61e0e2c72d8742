"""SLURM: a run uses a whole allocation as its Ray cluster (ray.address=slurm), submits itself with
`raydra submit`, and meets the time limit by checkpointing and requeueing (docs/slurm.md).

    allocation.py   what SLURM gave this job (nodes, CPUs, GPUs, restarts), read from its variables
    cluster.py      Ray across the allocation: a head where the command runs, a node per other node
                    through srun; stopped when the command ends
    node.py         what srun runs on each other node: `ray start --block` on that node's free ports
    time_limit.py   SLURM's warning before the time limit: checkpoint at the step in flight, requeue
    submit.py       `raydra submit`: the batch script into the run's record, sbatch, where to look

Nothing here is imported by a run that does not use SLURM.
"""
