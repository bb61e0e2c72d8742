"""The Ray cluster a run trains on: connecting to Ray (or starting a local one) and what it holds,
the Ray nodes raydra starts, the workers' output on the driver's console, and the batch system
(SLURM) a run may be inside.
"""
