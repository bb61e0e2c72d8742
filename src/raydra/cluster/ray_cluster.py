"""Connecting to Ray and checking, before asking, that the cluster can hold the run.

Ray waits forever for resources a cluster will never have; raydra fails in seconds instead,
naming what was asked and what the cluster has.
"""

import contextlib
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import ray

from raydra.cluster import batch_system
from raydra.cluster.ray_node import free_port
from raydra.cluster.worker_output import take_over_worker_output
from raydra.config.schema import ScaleConfig, SlurmConfig
from raydra.errors import RaydraError
from raydra.private_apis.ray import keep_sigterm_through_ray_shutdown, lean_local_ray, local_ray_on_loopback, state_api_address_env
from raydra.private_apis.ray_train import leave_out_preemption_watcher

log = logging.getLogger(__name__)

# The GCS address of the Ray that connect() started inside this process (ray.address unset), if any.
_started_here: Optional[str] = None
# The GCS address of a multirun launcher's local Ray that this process joined as one of its jobs.
_launchers_local_ray: Optional[str] = None
# The GCS address of the Ray this process started across its SLURM allocation (ray.address=slurm).
_allocations_ray: Optional[str] = None


def connect(
    address: Any,
    num_cpus: Any,
    verbose: bool,
    runtime_env: Optional[Dict[str, Any]] = None,
    dashboard: bool = True,
    launchers_local: bool = False,
    slurm: Optional[SlurmConfig] = None,
    record_dir: Optional[Path] = None,
) -> None:
    """Join `address`, or start a local Ray inside this process when it is null, or Ray across the
    SLURM allocation this process runs in when it is "slurm" (`slurm`: its settings; the nodes' logs
    go to the logs/ of `record_dir`, the run's or multirun's directory; raydra.slurm.cluster). `runtime_env`:
    Ray's, for every process of the run (raydra.config.project.runtime_env: the user's code).
    `dashboard=False`: a local Ray starts without its dashboard, which serves Ray's State API. Only
    Ray Train's placement-group cleaner asks that API here, and a run whose process ends with it
    starts none (fit.fit_and_record); the dashboard's processes took ~1 s of the start (measured).

    `launchers_local`: `address` is the local Ray a multirun's launcher started for its jobs (one
    machine, no autoscaler), which this process joins as one of them.

    Jobs of a multirun on Hydra's basic launcher share one process, so a Ray already up is reused.
    """
    if ray.is_initialized():
        log.info(f"reusing the Ray this process already joined ({ray.get_runtime_context().gcs_address})")
        return
    # ray.init replaces the local paths in runtime_env with the URIs of their uploads: name them now.
    shipping = [str(p) for p in [(runtime_env or {}).get("working_dir"), *(runtime_env or {}).get("py_modules", [])] if p]
    # Keep Ray's usage-stats prompt and upload off: runs must never wait on the network.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    global _started_here, _launchers_local_ray, _allocations_ray
    batch = batch_system.named(address)
    if batch:
        address = _allocations_ray = batch.start_cluster(record_dir or Path.cwd(), slurm or SlurmConfig())
    if address and address != "auto" and not address.startswith("ray://"):
        _check_reachable(address)
    dashboard_port = None
    if not address and dashboard:
        # Ray Train's PlacementGroupCleaner asks Ray's State API, from inside the cluster, whether
        # the run's controller lives. Without an address that API takes the one `ray start` last
        # wrote to /tmp/ray/ray_current_cluster: a cluster long gone (each run then ended 12 s late,
        # measured) or another live one, whose "no such actor" reads as a dead controller. The local
        # Ray's processes inherit this environment, so name its own dashboard for them.
        dashboard_port = free_port()
        os.environ.update(state_api_address_env(dashboard_port))
    lean = lean_local_ray() if not address else {}
    if not address:
        _private_token_file()
    # A driver stopping its run leaves Ray first: a second SIGTERM meanwhile must still reach raydra's
    # stop signals (raydra.run.signals), not the kernel's default.
    keep_sigterm_through_ray_shutdown()
    try:
        # A local Ray is this process's own, or its multirun's, on one machine: it listens on the
        # loopback address, which a job joining its launcher's Ray must be let keep (Ray would turn
        # 127.0.0.1 into the machine's address, where nothing listens).
        with local_ray_on_loopback() if not address or launchers_local else contextlib.nullcontext():
            ray.init(
                # "local" forces a fresh in-process cluster even if `ray start` left one running here.
                address=address or "local",
                num_cpus=None if address else num_cpus,
                include_dashboard=None if address or dashboard else False,
                dashboard_port=dashboard_port,
                logging_level=logging.INFO if verbose else logging.WARNING,
                # Not verbose: Ray's own driver-side notices propagate to driver.log, not the console.
                configure_logging=verbose,
                log_to_driver=True,
                runtime_env=runtime_env,
                **lean,
            )
    except ValueError as error:
        if "exceeds the maximum size" not in str(error) or not runtime_env:
            raise
        # Ray's own sentence says how big the package is and where its limit lies.
        raise RaydraError(
            f"{', '.join(shipping)} is too large to ship to the workers ({str(error).split('. ')[0]}); move data out of "
            "the project or exclude it with ray.runtime_env.excludes=[<folder>/], or set ray.working_dir=null."
        ) from None
    except ConnectionError as error:
        hint = "start one with `ray start --head` or leave ray.address unset for a local Ray"
        if address != "auto" and "RAY_AUTH_MODE" not in os.environ:
            # Ray sends its auth token to an explicitly named address only when told to.
            hint += "; if the cluster uses token authentication (Ray's default), set RAY_AUTH_MODE=token"
        raise RaydraError(f"could not reach the Ray cluster at ray.address={address} ({error}); {hint}.") from None
    if not address:
        _started_here = ray.get_runtime_context().gcs_address
    elif launchers_local:
        _launchers_local_ray = ray.get_runtime_context().gcs_address
    if not str(address).startswith("ray://") and _only_node_is_this_one():  # a Ray Client driver has no node
        leave_out_preemption_watcher()
    take_over_worker_output(verbose)
    where = f"joined the Ray cluster at {ray.get_runtime_context().gcs_address}" if address else "started a local Ray"
    log.info(f"{where} with {ray.cluster_resources().get('CPU', 0):g} CPUs")
    if shipping:
        log.info(f"shipped {', '.join(shipping)} to the workers as Ray's runtime_env (ray.working_dir; they run in its copy)")


def ray_token_file() -> Path:
    """Where Ray keeps its authentication token: RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def _private_token_file() -> None:
    """The token a local Ray in token mode (Ray's default for one it starts) reads, readable by
    this user alone. Ray writes ~/.ray/auth_token when it is missing, with the umask's mode
    (0644 here): whoever could read it could run code through any Ray using it. So raydra writes it
    first, mode 0600, as Ray would (32 random bytes, hex), or takes a looser one's mode to 0600."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token" or os.environ.get("RAY_AUTH_TOKEN"):
        return
    path = ray_token_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
    except FileExistsError:
        mode = path.stat()
        if mode.st_mode & 0o077 and mode.st_uid == os.getuid():
            path.chmod(0o600)
    except OSError as error:  # a read-only home: Ray says what it needs itself
        log.debug(f"could not write {path}: {error}")


def is_local_ray() -> bool:
    """Whether this process is connected to a Ray it started itself (ray.address unset): one
    machine, no autoscaler, gone when the process ends."""
    return _started_here is not None and ray.is_initialized() and ray.get_runtime_context().gcs_address == _started_here


def has_no_autoscaler() -> bool:
    """Whether the cluster is known to have no autoscaler: a local Ray raydra started, this
    process's own or its multirun launcher's, or Ray across this process's SLURM allocation. Ray Train's requests to an autoscaler would go to a
    coordinating actor of Ray Data's that the first run on a cluster starts (~1.3 s of CPU, measured)."""
    if is_local_ray():
        return True
    if _allocations_ray is not None and ray.is_initialized() and ray.get_runtime_context().gcs_address == _allocations_ray:
        return True
    return _launchers_local_ray is not None and ray.is_initialized() and ray.get_runtime_context().gcs_address == _launchers_local_ray


def _only_node_is_this_one() -> bool:
    """Whether the cluster is one node, the one this driver runs on (a local Ray; `ray start` on
    one machine). Ray Train's preemption watcher, a process per run, watches the nodes holding the
    run's workers for drain notices, so that a restart after a preemption counts against Ray's
    own budget for preemptions rather than failure.max_failures. A drain of the only node ends the
    driver, the controller (placed on the driver's node) and the workers together: no restart
    follows, and nothing acts on the notice. Decided once, as this process joins: runs it starts
    after the cluster grew (an autoscaler adding nodes) still start no watcher."""
    alive = [node for node in ray.nodes() if node["Alive"]]
    return len(alive) == 1 and alive[0]["NodeID"] == ray.get_runtime_context().get_node_id()


def _check_reachable(address: str) -> None:
    """Ray retries an unreachable GCS address for minutes; a plain TCP connect answers in seconds."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as error:
        raise RaydraError(
            f"could not reach the Ray cluster at ray.address={address} ({error}); check the head node's "
            "host:port (`ray status` on the head prints it), or leave ray.address unset for a local Ray."
        ) from None


# What a Tune trial's own process (the driver of its TorchTrainer) holds. Tune rejects a trial that
# asks for no CPU; the workers of a trial ask for this much less between them, so N trials need
# exactly N times what one run's workers need (measured: trial {CPU: 0.01} + one worker {CPU: 0.99}
# run two trials side by side on 2 CPUs).
TRIAL_CPU = 0.01


def worker_resources(scale: ScaleConfig, tune_trial: bool = False) -> Dict[str, float]:
    cpus = float(scale.cpus_per_worker)
    if tune_trial:
        cpus = max(cpus - TRIAL_CPU / scale.max_workers, TRIAL_CPU)
    resources = {"CPU": cpus}
    if scale.use_gpu:
        resources["GPU"] = float(scale.gpus_per_worker)
    resources.update({k: float(v) for k, v in scale.resources_per_worker.items()})
    return resources


def check_fits(scale: ScaleConfig) -> None:
    """Raise if the live nodes cannot place every worker, as Ray's placement group would need. An
    elastic group ([min, max]) starts once `min` fit, so `min` is what must fit now."""
    per_worker = worker_resources(scale)
    needed = scale.min_workers
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    if _workers_placeable(nodes, per_worker, scale.placement_strategy) >= needed:
        return
    totals = ray.cluster_resources()
    if scale.use_gpu and not totals.get("GPU"):
        raise RaydraError("scale.use_gpu=true but the Ray cluster has no GPU; run on a cluster with GPUs or set scale.use_gpu=false.")
    asked = {k: v * needed for k, v in per_worker.items()}
    least = " at least" if needed != scale.max_workers else ""
    raise RaydraError(
        f"the run asks for{least} {needed} workers x {_fmt(per_worker)} = {_fmt(asked)} "
        f"({scale.placement_strategy}) but the Ray cluster has {_fmt(totals, keys=per_worker)} "
        f"on {len(nodes)} node(s); lower scale.num_workers or scale.cpus_per_worker, or add nodes."
    )


def check_room_for_data(scale: ScaleConfig) -> None:
    """data.loader=ray_data runs its reading and preprocessing as Ray tasks beside the workers;
    Ray Data only uses CPUs the workers have not reserved, so with none left it waits for ever
    (measured: 2 workers x 1 CPU on 2 CPUs never produced a batch)."""
    total = ray.cluster_resources().get("CPU", 0)
    # An elastic group may grow to its max: the data must still have room then.
    workers = scale.max_workers
    free = total - workers * scale.cpus_per_worker
    if free < 1:
        raise RaydraError(
            f"data.loader=ray_data needs at least 1 CPU beside the workers for its preprocessing tasks, but "
            f"{workers} workers x {scale.cpus_per_worker} CPU leave {free:g} of the cluster's {total:g}; "
            "lower scale.cpus_per_worker (e.g. 0.5) or scale.num_workers, or add nodes."
        )


def trials_that_fit(scale: ScaleConfig) -> int:
    """How many trials' worker groups the live nodes can hold at once (at least 1: check_fits has
    already refused a run that does not fit once). An elastic run counts at its max, as it may grow."""
    per_worker = worker_resources(scale)
    size = scale.max_workers
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    if scale.placement_strategy == "STRICT_PACK":
        groups = sum(_count_fits(node, per_worker) // size for node in nodes)
    elif scale.placement_strategy == "STRICT_SPREAD":
        # g groups fit when the nodes, each giving at most one worker per group, hold g x num_workers.
        fits = [min(_count_fits(node, per_worker), 1 << 16) for node in nodes]
        groups = 0
        while sum(min(f, groups + 1) for f in fits) >= (groups + 1) * size:
            groups += 1
    else:
        groups = _workers_placeable(nodes, per_worker, scale.placement_strategy) // size
    return max(1, groups)


def _workers_placeable(nodes: List[Dict[str, float]], per_worker: Dict[str, float], strategy: str) -> int:
    free = [dict(node) for node in nodes]
    if strategy == "STRICT_PACK":
        return max((_count_fits(node, per_worker) for node in free), default=0)
    placed = 0
    for node in free:
        fits = _count_fits(node, per_worker)
        placed += min(fits, 1) if strategy == "STRICT_SPREAD" else fits
    return placed


def _count_fits(node: Dict[str, float], per_worker: Dict[str, float]) -> int:
    counts = [node.get(key, 0.0) // need for key, need in per_worker.items() if need > 0]
    return int(min(counts)) if counts else 1 << 30


def _fmt(resources: Mapping[str, float], keys: Any = None) -> str:
    shown = {k: resources.get(k, 0.0) for k in (keys or resources)}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown.items()) + "}"
