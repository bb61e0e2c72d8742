"""raydra's Hydra launcher: the jobs of a multirun side by side on the Ray cluster, for raydra's own
`python train.py -m ...` and for any Hydra app (`hydra/launcher=raydra`).

Selected in conf/hydra/default.yaml; `hydra/launcher=basic` on the command line brings back
Hydra's one-after-another launcher. Each job is composed here as Hydra's basic launcher composes it
and runs through Hydra's own run_job in a process of its own (raydra.multirun.job); the multirun
is raydra.multirun.launcher's (its checks in raydra.multirun.admission, its queue in
raydra.multirun.scheduling, its record and closing report in raydra.multirun.outcome). Hydra imports
every module under hydra_plugins at each start (a single run and --help included), so this one
imports only Hydra at its top.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

if TYPE_CHECKING:
    from raydra.multirun.feed import JobFeed
    from raydra.multirun.job import Job
    from raydra.multirun.state import Multirun


@dataclass
class RaydraLauncherConf:
    """hydra.launcher.* for raydra's launcher: the one home of these settings and their defaults
    (raydra.multirun's launcher, admission and scheduling read them as this class)."""

    _target_: str = "hydra_plugins.raydra_launcher.raydra_launcher.RaydraLauncher"
    # Most jobs running at once; null: as many as the Ray cluster can place side by side.
    max_concurrent: Optional[int] = None
    # Continue the multirun in hydra.sweep.dir (the same command plus hydra.sweep.dir=<its directory>
    # hydra.launcher.resume=true): completed jobs are kept and not run again, the others continue
    # (a raydra run from its last checkpoint), under the same job numbers and directories.
    resume: bool = False
    # For the jobs of any other Hydra app (a raydra run's own config says where and on what it runs):
    # the Ray cluster to run them on (null: RAY_ADDRESS if set, else a local Ray started here) and
    # what each job holds there.
    address: Optional[str] = None
    cpus_per_job: float = 1.0
    gpus_per_job: float = 0.0
    resources_per_job: Dict[str, float] = field(default_factory=dict)
    # Ray's runtime_env for those jobs, handed to ray.init as it is, e.g. {working_dir: .} to ship
    # the app's code to the cluster's other hosts.
    runtime_env: Dict[str, Any] = field(default_factory=dict)


ConfigStore.instance().store(group="hydra/launcher", name="raydra", node=RaydraLauncherConf, provider="raydra")


class RaydraLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None
        # Batches of one multirun (a sweeper calls launch once per batch): the record of this
        # multirun's earlier batches is its own, not one to resume.
        self.launches = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from raydra.multirun import launcher
        from raydra.multirun.job import JobPayload

        multirun = self._multirun()
        jobs = self._compose([list(o) for o in job_overrides], initial_job_idx)
        state = Singleton.get_state()
        assert self.hydra_context is not None
        for job in jobs:
            job.payload = JobPayload(self.hydra_context, job.cfg, self.task_function, state, os.getcwd()).dumps()
        self._run(multirun, lambda: launcher.run_jobs(multirun, jobs), jobs)
        return [launcher.job_return(job) for job in jobs]

    def launch_as_slots_free(self, feed: "JobFeed") -> List["Job"]:
        """Not in Hydra's Launcher API: an asynchronous sweeper's multirun (raydra.multirun.feed). Its
        jobs are asked of `feed` one at a time, the moment a slot frees, instead of in batches, and
        each is composed as `launch` composes a job. Returns the jobs, each with its outcome."""
        from raydra.multirun import launcher
        from raydra.multirun.job import JobPayload

        multirun = self._multirun()
        jobs: List["Job"] = []

        def compose(num: int, overrides: List[str]) -> "Job":
            assert self.hydra_context is not None
            (job,) = self._compose([overrides], num)
            job.payload = JobPayload(self.hydra_context, job.cfg, self.task_function, Singleton.get_state(), os.getcwd()).dumps()
            return job

        self._run(multirun, lambda: launcher.run_jobs(multirun, jobs, feed=feed, compose=compose), jobs)
        return jobs

    def _multirun(self) -> "Multirun":
        from raydra.multirun.job import is_raydra_command
        from raydra.multirun.state import Multirun

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        multirun = Multirun(
            sweep_dir=Path(str(self.config.hydra.sweep.dir)).resolve(),
            settings=OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RaydraLauncherConf), self.settings)),
            raydra_runs=is_raydra_command(self.task_function),
            first_batch=self.launches == 0,
            # Unresolved: a job's own interpolations (hydra.sweep.subdir=job_${hydra.job.num}) mean nothing here.
            typed=[*OmegaConf.to_container(self.config.hydra.overrides.task), *OmegaConf.to_container(self.config.hydra.overrides.hydra)],
        )
        self.launches += 1
        return multirun

    def _run(self, multirun: "Multirun", run: Any, jobs: List["Job"]) -> None:
        from raydra.errors import RaydraError
        from raydra.multirun import outcome

        try:
            run()
        except RaydraError:
            # Already said in one sentence, as a single run says it; nothing started.
            raise SystemExit(1) from None
        except KeyboardInterrupt:
            outcome.report(multirun, jobs)
            raise SystemExit(130) from None
        outcome.report(multirun, jobs)

    def _compose(self, job_overrides: List[List[str]], initial_job_idx: int) -> List["Job"]:
        """Each job's config as Hydra's basic launcher composes it, and its directory."""
        from raydra.multirun.job import Job

        jobs = []
        outer = HydraConfig.instance().cfg
        try:
            for i, overrides in enumerate(job_overrides):
                num = initial_job_idx + i
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
                with open_dict(cfg):
                    cfg.hydra.job.id = num
                    cfg.hydra.job.num = num
                # hydra.sweep.dir/subdir may read the job's Hydra config (${hydra.job.num},
                # ${hydra.job.override_dirname}): resolved with it, as run_job resolves them in the job.
                HydraConfig.instance().set_config(cfg)
                job_dir = Path(str(OmegaConf.select(cfg, "hydra.sweep.dir")), str(OmegaConf.select(cfg, "hydra.sweep.subdir"))).resolve()
                with read_write(cfg.hydra.runtime):
                    cfg.hydra.runtime.output_dir = str(job_dir)
                jobs.append(Job(num=num, overrides=overrides, cfg=cfg, dir=job_dir))
        finally:
            HydraConfig.instance().cfg = outer
        return jobs
