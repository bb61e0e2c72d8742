"""The multirun as raydra's launcher runs it: the state its parts (admission, scheduling, outcome)
share, apart from the launcher that drives them, so that they import it rather than the launcher."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from hydra_plugins.raydra_launcher.raydra_launcher import RaydraLauncherConf
from raydra.records.jobs import JobsRecord
from raydra.run.prepare import JobSettings


@dataclass
class Multirun:
    sweep_dir: Path
    settings: RaydraLauncherConf  # hydra.launcher.*, each explained there
    # The jobs are runs of raydra's own command (train.py, `raydra train`), not another app's.
    raydra_runs: bool
    # The first batch of this multirun (a sweeper launches several); a record already in the sweep
    # directory then belongs to an earlier multirun.
    first_batch: bool = True
    # The multirun's overrides as typed (its hydra.overrides.task and .hydra): the command to continue it.
    typed: List[str] = field(default_factory=list)
    # jobs.json as this batch writes it: this multirun's earlier batches' record, the record of the
    # multirun it resumes, or a new one (admission._take_over_record).
    record: Optional[JobsRecord] = None
    # Whether this batch wrote jobs.json yet: until then a refusal leaves the file as it was.
    written: bool = False
    # Whether it continues a multirun stopped before (hydra.launcher.resume=true, or SLURM's requeue),
    # and that multirun's jobs.json as it found it.
    resuming: bool = False
    recorded: Optional[JobsRecord] = None
    # What each raydra run of it is handed (the cluster it joined, its W&B group, SLURM's notice),
    # once it has joined the cluster (admission); a job's own resume and local Ray added to it.
    job_settings: Optional[JobSettings] = None
    # That cluster is a local Ray started here (one machine, no autoscaler).
    local_ray: bool = False
    # Each kind of run's share of the cluster, measured once (admission._size_run).
    sized: Dict[str, float] = field(default_factory=dict)
