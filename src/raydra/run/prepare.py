"""A run's config made final once, before Ray starts: the one place that writes into a composed config.

    prepare(cfg, invocation) -> Prepared    on a copy: what the invocation brings from outside the
                                            config (the multirun job's cluster, the run it continues),
                                            the callbacks raydra stands in for turned into its own
                                            settings, then every check that needs no Ray
                                            (raydra.config.user_callbacks.resolve_and_validate)

Prepared.config is read-only from then on: the driver, the sweep and the fit read it, and resolving
it into the run's spec (raydra.run.resolve) works on a copy of its own. The same prepare is the
pre-flight check of a multirun's jobs (its launcher, before any job starts), of a sweep, and of each
of its trials, so a check written once holds for runs, jobs and trials alike.
"""

import copy
import json
import os
from dataclasses import asdict, dataclass
from typing import Dict, Optional, Tuple

from omegaconf import DictConfig, OmegaConf, open_dict

from raydra.cluster import batch_system

# Where JobSettings travel, from the launcher into the job's process environment.
SETTINGS_ENV = "RAYDRA_MULTIRUN_JOB"


@dataclass(frozen=True)
class JobSettings:
    """What raydra's launcher decides for a job of raydra's own command, beyond its config."""

    # The Ray cluster the multirun joined (or started): the job's run joins it when its own
    # ray.address is null.
    ray_address: Optional[str] = None
    # The multirun's W&B group, for a run whose logger.wandb.group is null.
    wandb_group: Optional[str] = None
    # The job's directory, when a resumed multirun continues the run it holds.
    resume: Optional[str] = None
    # ray_address is a local Ray the launcher started (one machine, no autoscaler).
    local_ray: bool = False
    # The multirun runs across a SLURM allocation: the launcher passes SLURM's time-limit notice
    # (SIGUSR1) on to the job, whose workers checkpoint and stop (raydra.slurm.time_limit).
    time_limit_notice: bool = False

    def env(self) -> Dict[str, str]:
        return {SETTINGS_ENV: json.dumps(asdict(self))}

    @staticmethod
    def take() -> Optional["JobSettings"]:
        """This process's settings, if raydra's launcher started it as a job; taken out of the
        environment, so that a process the job starts in turn is not taken for a job too."""
        value = os.environ.pop(SETTINGS_ENV, None)
        return JobSettings(**json.loads(value)) if value else None


@dataclass(frozen=True)
class Invocation:
    """What a run is handed besides its composed config."""

    # The command line's overrides, as typed (a ModelCheckpoint may not change a checkpoint.* given there).
    overrides: Tuple[str, ...] = ()
    # The cluster of the multirun this run is a job of (its launcher's local Ray, or Ray across its
    # allocation), when the job's config leaves ray.address to it.
    job_ray_address: Optional[str] = None
    # The run this one continues when the config does not say (resume=): a resumed multirun's job,
    # or the run a requeued batch job started.
    continues: Optional[str] = None
    # Whether the arguments of raydra's own model and data classes are checked here (None: where
    # this process imports them anyway, local mode; see resolve_and_validate).
    own_classes: Optional[bool] = None
    # A sweep's trial: its sweep started the cluster, after checking the allocation holds it.
    trial: bool = False
    # Whether the caller checks the `_target_`s' arguments itself (raydra.config.arguments.check on the
    # prepared config): the driver of a Ray run does, alongside Ray's start, since the check imports
    # the optimizer's and scheduler's modules (torch, transformers: ~1.5 s here) that the driver
    # imports then anyway (raydra.run.driver). Every other check is still made here.
    arguments_by_caller: bool = False


@dataclass(frozen=True)
class Prepared:
    # The run's config, final and read-only.
    config: DictConfig
    # As composed, before raydra's callbacks became its settings: what a resumed run's record is compared with.
    composed: DictConfig


def prepare(cfg: DictConfig, invocation: Invocation = Invocation()) -> Prepared:
    """The run's final config from its composed `cfg` (left as it is), checked; a RaydraError names
    the first key that is wrong."""
    from raydra.config.user_callbacks import resolve_and_validate

    config = copy.deepcopy(cfg)
    with open_dict(config):
        if invocation.job_ray_address and (config.ray.address is None or batch_system.named(config.ray.address)):
            config.ray.address = invocation.job_ray_address
        if invocation.continues and not config.resume:
            config.resume = invocation.continues
    composed = resolve_and_validate(
        config, list(invocation.overrides), own_classes=invocation.own_classes, check_arguments=not invocation.arguments_by_caller
    )
    if not invocation.trial:
        # Before Ray starts across it: an allocation too small for the workers is said at once.
        batch_system.check_allocation(config)
    OmegaConf.set_readonly(config, True)
    return Prepared(config=config, composed=composed)


def writable(cfg: DictConfig) -> DictConfig:
    """A copy of a prepared config that may be changed (resolving it into a spec fills in paths and
    what the data says of itself); the prepared one stays as it is."""
    copied = copy.deepcopy(cfg)
    OmegaConf.set_readonly(copied, False)
    return copied
