"""What a run, sweep or multirun leaves on disk, as typed values and files: the records (summary.json,
sweep.json, jobs.json) and the envelope they share, the run directory's layout, its copy in
storage, the directory lock, checkpoints, metrics.csv, W&B's files, the Hugging Face export, and
whether a run directory is this machine's. Only the standard library (and raydra.storage) at
import time: `raydra compare` and `show` read records without torch, Ray or Hydra.
"""
