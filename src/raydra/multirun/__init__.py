"""Hydra multiruns on Ray (hydra/launcher=raydra): raydra's launcher, one job and its process, and
the server that forks the jobs' processes.
"""
