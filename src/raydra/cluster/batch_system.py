"""The batch system a command may run inside (SLURM today: raydra.slurm), as the rest of raydra sees it.

    current()          the batch system whose job this process runs in, or None
    named(name)        the one `ray.address=<name>` names (Ray across its allocation), or None
    requeued()         the id of this process's job when its batch system requeued it, or None
    watch(system)      from now on take `system`'s stop notice (SLURM: SIGUSR1 before the time limit)
    notice()           the stop notice this process watches: one that never comes when none is

Batch systems are found among the installed packages' entry points (group `raydra.batch_systems`;
raydra's pyproject.toml names raydra.slurm's), so no module outside raydra.slurm imports it: the
driver, the launcher and the sweep ask `notice()` whether to stop, and the run's record asks the
system for its job's record. A stand-in registered the same way, or handed to `watch`, takes its
place in a test.

What a batch system provides (raydra.slurm.SYSTEM is one):

    name                    the ray.address value that starts Ray across its allocation
    inside(env)             whether `env` is one of its jobs' environments
    job_record(env)         what summary.json records of the job (its id, logs, restarts), or None
    requeued(env)           the job's id when it was requeued (its script runs again), or None
    too_small(scale)        why its allocation cannot hold the run's workers (sentences), or none
    prepare_cluster()       what must hold before its Ray starts (an authentication token)
    start_cluster(record_dir, settings)   Ray across the allocation; returns its address
    and the stop notice: signal, watch(), watched(), noticed(), reason(), on_notice(action),
    run_stops_on_notice()   (see raydra.slurm.time_limit for SLURM's)
"""

import contextlib
import functools
import os
from importlib import metadata
from typing import Any, Callable, Dict, Iterator, Mapping, Optional

GROUP = "raydra.batch_systems"


@functools.lru_cache(maxsize=None)
def installed() -> Dict[str, Any]:
    """Every batch system the installed packages name, by name (loaded on first use)."""
    return {entry.name: entry.load() for entry in metadata.entry_points(group=GROUP)}


def named(name: Any) -> Optional[Any]:
    """The batch system `ray.address=<name>` starts Ray across, or None (a Ray address, auto, null)."""
    return installed().get(name) if isinstance(name, str) else None


def current(env: Mapping[str, str] = os.environ) -> Optional[Any]:
    """The batch system whose job this process runs in, or None."""
    return next((system for system in installed().values() if system.inside(env)), None)


def requeued(env: Mapping[str, str] = os.environ) -> Optional[str]:
    """This process's job id when its batch system requeued it (it runs its script again), else None."""
    system = current(env)
    return system.requeued(env) if system else None


def job_record(env: Mapping[str, str] = os.environ) -> Optional[Dict[str, Any]]:
    """What the run's record keeps of the batch job it runs in, or None outside one."""
    system = current(env)
    return system.job_record(env) if system else None


class NoNotice:
    """The stop notice of a process no batch system warns: it never comes."""

    signal = None

    def watched(self) -> bool:
        return False

    def noticed(self) -> bool:
        return False

    def reason(self) -> str:
        return ""

    @contextlib.contextmanager
    def on_notice(self, action: Callable[[], bool]) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def run_stops_on_notice(self) -> Iterator[None]:
        yield


NO_NOTICE = NoNotice()
_watched: Dict[str, Any] = {"system": None}


def watch(system: Any) -> None:
    """From now on this process takes `system`'s stop notice (main thread: it installs a signal handler)."""
    system.watch()
    _watched["system"] = system


def notice() -> Any:
    """The stop notice this process watches (see watch), or one that never comes."""
    return _watched["system"] or NO_NOTICE


def check_allocation(cfg: Any) -> None:
    """The allocation cfg.ray.address names (a batch system's, e.g. `slurm`) holds the run's workers:
    said before Ray starts across it, in one RaydraError; nothing where no allocation is named."""
    from omegaconf import OmegaConf

    from raydra.errors import RaydraError

    batch = named(cfg.ray.address)
    if batch:
        problems = batch.too_small(OmegaConf.to_object(cfg.scale))
        if problems:
            raise RaydraError(" ".join(problems))
