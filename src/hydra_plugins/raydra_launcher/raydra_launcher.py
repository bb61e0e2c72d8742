"""raydra's Hydra launcher: `python train.py -m ...` jobs side by side on the Ray cluster.

Selected in raydra/conf/hydra/default.yaml; `hydra/launcher=basic` on the command line brings back Hydra's
one-after-another launcher. Hydra imports every module under hydra_plugins at each start (a single
run and --help included), so this one imports only Hydra at its top; the work is in raydra.launcher.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from hydra.errors import CompactHydraException
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from raydra.errors import RaydraError

if TYPE_CHECKING:
    from raydra.launcher import Job


@dataclass
class RaydraLauncherConf:
    _target_: str = "hydra_plugins.raydra_launcher.raydra_launcher.RaydraLauncher"
    # Most jobs running at once; null: as many as the Ray cluster can place side by side.
    max_concurrent: Optional[int] = None


ConfigStore.instance().store(group="hydra/launcher", name="raydra", node=RaydraLauncherConf, provider="raydra")


class MultirunError(RaydraError, CompactHydraException):
    """Hydra prints a CompactHydraException as its message alone and any other exception as a
    traceback: raydra's errors are one sentence, so they stay one sentence here too."""


class RaydraLauncher(Launcher):
    def __init__(self, max_concurrent: Optional[int] = None) -> None:
        self.max_concurrent = max_concurrent
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        # The task function is not called here: each job runs it in its own process.
        self.config, self.hydra_context = config, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from raydra import launcher

        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        jobs = [self._compose(list(overrides), initial_job_idx + i) for i, overrides in enumerate(job_overrides)]
        hydra_overrides = [str(o) for o in self.config.hydra.overrides.hydra]
        try:
            launcher.run(jobs, self._entry(), hydra_overrides, sweep_dir, self.max_concurrent)
        except RaydraError:
            # Already said in one sentence, as a single run says it; nothing started.
            raise SystemExit(1) from None
        except KeyboardInterrupt:
            launcher.report(jobs, sweep_dir)
            raise SystemExit(130) from None
        launcher.report(jobs, sweep_dir)
        return [self._job_return(job) for job in jobs]

    def _compose(self, overrides: List[str], num: int) -> "Job":
        from raydra.launcher import Job

        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(cfg):
            cfg.hydra.job.id = cfg.hydra.job.num = num
        # The job's directory as Hydra's own launcher names it (hydra.sweep.dir/hydra.sweep.subdir),
        # whose interpolations may read the job's Hydra config.
        HydraConfig.instance().set_config(cfg)
        job_dir = Path(str(OmegaConf.select(cfg, "hydra.sweep.dir")), str(OmegaConf.select(cfg, "hydra.sweep.subdir")))
        with read_write(cfg.hydra.runtime):
            cfg.hydra.runtime.output_dir = str(job_dir.resolve())
        return Job(num=num, overrides=overrides, cfg=cfg, dir=job_dir.resolve())

    def _entry(self) -> List[str]:
        """The command that runs one job: this very command (train.py or `raydra train`) with this
        invocation's configs."""
        from raydra.entry import command as entry_command

        runtime = self.config.hydra.runtime
        command = [*entry_command(), f"--config-name={self.config.hydra.job.config_name}"]
        for source in runtime.config_sources:
            if source.schema != "file":
                continue
            if source.provider == "main":
                command.append(f"--config-path={source.path}")
            elif source.provider == "command-line":
                command.append(f"--config-dir={source.path}")
        return command

    def _job_return(self, job: "Job") -> JobReturn:
        task_cfg = OmegaConf.masked_copy(job.cfg, [k for k in job.cfg if k != "hydra"])
        ret = JobReturn(
            overrides=job.overrides,
            cfg=task_cfg,
            hydra_cfg=OmegaConf.masked_copy(job.cfg, ["hydra"]),
            working_dir=str(job.dir),
            task_name=str(job.cfg.hydra.job.name),
        )
        if job.status == "completed":
            # The job's monitored metric (its best checkpoint.monitor value): a sweeper's objective.
            ret.status, ret.return_value = JobStatus.COMPLETED, job.metric
        else:
            ret.status = JobStatus.FAILED
            ret.return_value = MultirunError(f"multirun job {job.label} {job.status}: {job.error}; its run directory: {job.dir}")
        return ret
