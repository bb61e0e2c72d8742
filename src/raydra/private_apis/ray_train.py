"""Ray Train's private API: its controller, worker group, checkpoints and process group set-up
(raydra.private_apis says why such a module exists).
"""

import contextlib
import functools
import os
import sys
from typing import Any, Callable, Dict, Iterator, List, Tuple

from raydra.private_apis.ray import RAY_STATE_API_ADDRESS_ENV

# Ray Train reads this variable in its controller (passed on from the driver's environment) for
# how often it polls the workers; a worker's report waits in a queue of one until a poll takes it.
# Documented only in Ray's source (ray.train.v2._internal.constants), default 2 s.
RAY_TRAIN_POLL_INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


def poll_workers_often(seconds: float) -> None:
    """Have Ray Train's controller take the workers' reports every `seconds` (unless the user set
    the interval). Its default, 2 s, paced every run whose epochs are shorter: the next epoch's
    report waited for the last one to be taken (measured: the default run's 30 epochs of ~0.8 s
    took 62 s). A missed poll is harmless: a worker counts as hung only after 10 minutes of them."""
    import os

    os.environ.setdefault(RAY_TRAIN_POLL_INTERVAL_ENV, str(seconds))


# The module of Ray Train's worker actor, which a worker process's main thread imports (ray.train
# with it) as the process becomes one.
RAY_TRAIN_WORKER_MODULE = "ray.train.v2._internal.execution.worker_group.worker"


def ray_train_worker_imported() -> bool:
    """Whether this process's main thread has finished importing Ray Train's worker actor, and
    ray.train with it. raydra.worker.preload waits for this before importing in its own thread:
    imported from two threads at once, `ray.train` was seen half-initialised by Ray's side (Python
    hands back a partial module rather than deadlock on two threads' import locks) and the
    worker's logging set-up failed with "module 'ray.train' has no attribute 'v2'"."""

    def initializing(module: Any) -> bool:
        return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))

    worker, train = sys.modules.get(RAY_TRAIN_WORKER_MODULE), sys.modules.get("ray.train")
    return hasattr(worker, "RayTrainWorker") and not initializing(worker) and train is not None and not initializing(train)


def leave_out_preemption_watcher() -> None:
    """Ray Train's controllers started from this process start no preemption watcher (a process
    per run polling Ray for node drains). The switch is Ray Train's environment variable
    RAY_TRAIN_ENABLE_PREEMPTION_WATCHER, which the driver sends on to the controller; a value you
    set wins."""
    import os

    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


def run_on_train_worker_main_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` on the main thread of this Ray Train worker's process, from its training thread,
    and return what it returns.

    Ray Train V2 runs the training function in a thread of the RayTrainWorker actor, whose main
    thread executes the actor's tasks (the controller's polls among them); only the main thread
    may install a signal handler. `__ray_call__` (a Ray DeveloperAPI) runs a function as such a
    task on the actor itself; that a Train worker is a plain (single-threaded) actor is Ray
    Train's internal choice.
    """
    import ray

    return ray.get(ray.get_runtime_context().current_actor.__ray_call__.remote(lambda _actor: fn()))


def wait_until_reports_taken(timeout_s: float) -> bool:
    """Wait until Ray Train's controller has taken every report this worker made (False if it
    has not within `timeout_s`).

    `ray.train.report` returns once its result is queued for the controller's next poll (one
    every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S); a worker about to stop on purpose must not stop
    before then, or its last checkpoint is never registered. The worker's result queue is the
    only place that says so.
    """
    import time

    from ray.train.v2._internal.execution.context import get_train_context

    queue = get_train_context().execution_context.result_queue
    deadline = time.monotonic() + timeout_s
    while queue.unfinished_tasks:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def registered_checkpoint_names(run_storage: str) -> Any:
    """The checkpoint directories Ray Train has registered for a run whose storage (RunConfig
    storage_path/name) is `run_storage`, oldest first; None when Ray wrote no snapshot there (local
    mode, or no checkpoint yet) or the snapshot cannot be read.

    Ray copies a reported checkpoint straight into its final `checkpoint_*` directory and records
    it in its checkpoint manager's snapshot afterwards: a copy cut short (a full disk, SIGKILL) is a
    directory that looks like a checkpoint but is not one. The snapshot is Ray's only record of which
    are, and what Train V2 itself resumes from; its file name and fields are Ray Train internals.
    """
    import json

    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    from raydra import storage

    try:
        snapshot = json.loads(storage.read_text(storage.join(run_storage, CHECKPOINT_MANAGER_SNAPSHOT_FILENAME)))
        names = [result["checkpoint_dir_name"] for result in snapshot["checkpoint_results"]]
        latest = (snapshot.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # Ray keeps the latest whatever num_to_keep says; it goes last, as the one a restart takes.
    return [n for n in names if n != latest] + ([latest] if latest else [])


@functools.lru_cache(maxsize=None)  # one class per kind, however many runs a process fits
def torch_trainer_class(placement_group_cleaner: bool = True, autoscaling_requests: bool = True) -> Any:
    """Ray's TorchTrainer, less the helpers Ray Train 2.60 starts for every run (none has a
    switch) where the run has no use for them. Each helper is a process of its own that imports
    Ray; on 2 cores they took CPU from the workers' start (measured: ~1.5 s of the time to the
    first step for the last two together).

    - Always, in a run that hands it no datasets: Ray Data's set-up (DatasetsCallback: a
      DatasetManager actor importing Ray Data and pandas, and every worker importing Ray Data to
      receive the driver's DataContext; ~3 s of CPU). data.loader=ray_data keeps it.
    - `placement_group_cleaner=False`: the PlacementGroupCleaner, a detached actor that removes
      the worker group's placement group if the controller dies while the driver lives on (Ray
      itself does not, until the job ends: tests/private_apis/test_private_apis.py shows it). For a driver
      whose process ends with the run, Ray removes the job's placement groups as it ends.
    - `autoscaling_requests=False` (and no datasets): the fixed-size group's resource requests to
      Ray Data's AutoscalingCoordinator, a detached actor the controller creates and waits for
      (~0.9 s, measured) before it starts the workers. They tell a cluster autoscaler what the
      run needs; a Ray started for one run on this machine has none.
    """
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

    class TorchTrainerWithoutUnusedHelpers(TorchTrainer):
        def _create_default_callbacks(self) -> List[Any]:
            unused = () if self.datasets else (DatasetsCallback,)
            unused += () if placement_group_cleaner else (PlacementGroupCleanerCallback,)
            return [callback for callback in super()._create_default_callbacks() if not isinstance(callback, unused)]

        def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
            # The policy is handed to the controller actor as an argument: its class goes by value.
            policy = controller_init_kwargs["scaling_policy"]
            if not autoscaling_requests and not self.datasets and type(policy) is FixedScalingPolicy:
                controller_init_kwargs["scaling_policy"] = _fixed_policy_without_autoscaling_class()(policy.scaling_config)
            return super()._initialize_and_run_controller(**controller_init_kwargs)

    return TorchTrainerWithoutUnusedHelpers


@functools.lru_cache(maxsize=None)
def _fixed_policy_without_autoscaling_class() -> Any:
    """Ray Train's fixed-size scaling policy, without its requests to the AutoscalingCoordinator
    (its only use of it: a fixed group's decisions do not depend on the answers)."""
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

    class FixedScalingPolicyWithoutAutoscaling(FixedScalingPolicy):
        def after_controller_start(self, train_run_context: Any) -> None:
            pass  # where the base class creates the coordinator and sends the first request

        def _maybe_send_resource_request(self) -> None:
            pass

    return FixedScalingPolicyWithoutAutoscaling


# The socket rank 0's worker bound for the rendezvous store, until join_process_group hands it to
# torch: one per worker group start (a restarted or resized group binds a new one).
_rendezvous_sockets: List[Any] = []


def torch_config(backend: Any, timeout_s: int) -> Any:
    """Ray Train's TorchConfig for the run's process group (`backend`, `timeout_s` as Ray's own
    takes them), whose rendezvous store listens on one address: rank 0's node's, the address Ray
    names as MASTER_ADDR (127.0.0.1 for the local Ray raydra starts, local_ray_on_loopback), and
    whose classes import no torch where Ray Train's controller unpickles them.

    Ray Train 2.60's torch backend (ray.train.torch.config._TorchBackend.on_start) sets MASTER_ADDR
    and MASTER_PORT on every worker and has each call init_process_group(init_method="env://"), where
    rank 0 starts torch's TCPStore server. That server listens on every interface (`*`: measured
    with `ss -ltn` during a default run, beside Ray's own listeners on 127.0.0.1) whatever
    MASTER_ADDR says: torch binds the wildcard address unless TCPStore is handed a socket
    (`master_listen_fd`, documented), which env:// and tcp:// never do, and no variable or
    TorchConfig field names the address. So this backend does what Ray's does, with the store made
    by hand: rank 0 binds a socket to its node's address and hands it to its TCPStore, the other
    ranks join that store as clients, and each passes its store to init_process_group. The rest is
    Ray's: the backend by device (TorchTrainer fills it in), MASTER_ADDR/MASTER_PORT (Lightning's and
    DeepSpeed's environment read them), the torch variables every worker gets, the shut-down.

    The classes derive from Ray Train's BackendConfig and Backend, not from TorchConfig and
    _TorchBackend, whose module imports torch: Ray Train's controller unpickles the config, and
    through TorchConfig it imported torch in every run (1.2-1.4 s of CPU on the way to the first
    step, measured 2026-11-28). What runs on the workers, where torch is imported anyway, calls Ray's
    own functions (ray.train.torch.config's) by name. The classes go to the controller by value, as
    the trainer's scaling policy does (torch_trainer_class); ray.train.torch.config's TorchConfig
    is what TorchTrainer documents, and the test of this module checks the two keep the same fields."""
    config_class, _ = _bound_rendezvous_classes()
    return config_class(backend=backend, timeout_s=timeout_s)


@functools.lru_cache(maxsize=None)
def _bound_rendezvous_classes() -> Tuple[Any, Any]:
    import dataclasses

    import ray
    from ray.train.backend import Backend, BackendConfig
    from ray.train.constants import DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S

    class BoundRendezvousBackend(Backend):
        # As Ray's torch backend: the workers of a node see each other's GPUs (NCCL needs it).
        share_cuda_visible_devices = True

        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            address, port = worker_group.execute_single(0, rendezvous_listener)
            worker_group.execute(_set_master, address=address, port=port)
            worker_group.execute(_set_torch_variables)
            size = len(worker_group)
            joins = [
                worker_group.execute_single_async(
                    rank,
                    join_process_group,
                    backend=backend_config.backend,
                    world_rank=rank,
                    world_size=size,
                    address=address,
                    port=port,
                    timeout_s=backend_config.timeout_s,
                )
                for rank in range(size)
            ]
            ray.get(joins)

        def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
            leaving = worker_group.execute_async(_leave_process_group, destroy_process_group=len(worker_group) > 1)
            timeout_s = float(os.environ.get(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S))
            try:
                ray.get(leaving, timeout=timeout_s)
            except ray.exceptions.GetTimeoutError:
                import logging

                logging.getLogger("raydra").warning(f"the process group's shut-down timed out after {timeout_s:g} s")

    @dataclasses.dataclass
    class BoundRendezvousTorchConfig(BackendConfig):
        backend: Any = None
        init_method: str = "env"
        timeout_s: int = 1800

        @property
        def backend_cls(self) -> Any:
            return BoundRendezvousBackend

        @property
        def train_func_context(self) -> Any:
            return _TorchDeviceContext

        @property
        def framework(self) -> Any:
            from ray.train.v2._internal.util import TrainingFramework

            return TrainingFramework.TORCH

        def to_dict(self) -> Dict[str, Any]:
            return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}

    return BoundRendezvousTorchConfig, BoundRendezvousBackend


class _TorchDeviceContext:
    """Around the training function on each worker: Ray's torch context (the worker's CUDA device
    made current), imported there."""

    def __enter__(self) -> None:
        from ray.train.torch.config import TorchConfigContextManager

        self._context = TorchConfigContextManager()
        self._context.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        return bool(self._context.__exit__(*exc))


def _set_torch_variables() -> None:
    """On a worker: LOCAL_RANK, RANK, WORLD_SIZE and the rest, as Ray's torch backend sets them."""
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


def _leave_process_group(destroy_process_group: bool) -> None:
    """On a worker: Ray's torch backend's shut-down (the process group, CUDA's cache)."""
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy_process_group)


def rendezvous_listener() -> Tuple[str, int]:
    """On rank 0: a socket bound to this node's address (the one Ray gives MASTER_ADDR; an IPv6
    one as such) on a free port, kept for join_process_group; returns (address, port). A node
    address that is none of this machine's own (a Ray node started with another machine's
    --node-ip-address, behind a NAT) cannot be bound: every interface then, as torch's store would."""
    import errno
    import logging
    import socket

    import ray

    address = ray.util.get_node_ip_address()
    listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((address, 0))
    except OSError as error:
        if error.errno != errno.EADDRNOTAVAIL:
            raise
        logging.getLogger("raydra").warning(f"the process group's store listens on every interface: {address} is no address of this node's")
        listener.bind(("", 0))
    _rendezvous_sockets[:] = [listener]
    return address, listener.getsockname()[1]


def _set_master(address: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = address
    os.environ["MASTER_PORT"] = str(port)


def join_process_group(backend: str, world_rank: int, world_size: int, address: str, port: int, timeout_s: float) -> None:
    """torch.distributed's default process group through a TCPStore at address:port: rank 0 serves
    it on the socket rendezvous_listener bound (torch's store then listens there alone), the
    others connect to it. As Ray's own set-up does, NCCL's collectives time out as errors unless
    the user chose otherwise (Ray 2.60's _setup_torch_process_group)."""
    from datetime import timedelta

    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if world_rank == 0:
        # detach: the store owns the descriptor from here on and closes it with its server.
        listening = _rendezvous_sockets.pop().detach()
        store = dist.TCPStore(address, port, world_size, is_master=True, timeout=timeout, master_listen_fd=listening)
    else:
        store = dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
    if "nccl" in backend and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ and "TORCH_NCCL_BLOCKING_WAIT" not in os.environ:
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    dist.init_process_group(backend=backend, store=store, rank=world_rank, world_size=world_size, timeout=timeout)


# Read by Ray Train's controller (passed on from the driver's environment, like the poll interval):
# how long a new worker group waits for its placement group before the start fails and the
# controller decides again. Named in Ray's own error message; default 60 s.
RAY_TRAIN_START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"


@contextlib.contextmanager
def elastic_reacts_quickly(start_timeout_s: float) -> Iterator[None]:
    """While a TorchTrainer with an elastic ScalingConfig is created and fit: its scaling policy
    sees the cluster as it is now, and a group that cannot be placed is given up after
    `start_timeout_s` (unless the user set that timeout), so a run that lost a node continues on
    the nodes left without waiting for a replacement.

    Ray 2.60's ElasticScalingPolicy counts the workers that fit from Ray Data's
    AutoscalingCoordinator, whose view of the nodes is refreshed every 20 s (its TICK_INTERVAL_S,
    fixed in a detached actor). Measured on a 2-node cluster after losing one: the controller
    restarted a 2-worker group on the stale view, waited the 60 s start timeout, did so again, and
    continued on 1 worker 77 s after the loss. The policy here asks the coordinator to recompute
    first (`get_reserved_resources(recompute=True)`, which the coordinator offers for this), so only
    Ray's own detection of the dead node (its GCS health check, about 15 s) stands in the way;
    a start tried before that detection fails after `start_timeout_s` and is decided again.
    """

    from ray.train.v2.api import data_parallel_trainer

    original = data_parallel_trainer.create_scaling_policy
    policy_class = _fresh_elastic_policy_class()

    def create(scaling_config: Any) -> Any:
        return policy_class(scaling_config) if scaling_config.elasticity_enabled else original(scaling_config)

    data_parallel_trainer.create_scaling_policy = create
    try:
        with worker_groups_start_within(start_timeout_s):
            yield
    finally:
        data_parallel_trainer.create_scaling_policy = original


@contextlib.contextmanager
def worker_groups_start_within(seconds: float) -> Iterator[None]:
    """While a TorchTrainer is created and fit: a new worker group gets `seconds` to be placed and
    started before Ray Train fails the start (unless the user set the timeout). The controller reads
    RAY_TRAIN_START_TIMEOUT_ENV, which the driver's environment passes on to it; no public setting
    sets it."""
    import os

    user_set = RAY_TRAIN_START_TIMEOUT_ENV in os.environ
    if not user_set:
        os.environ[RAY_TRAIN_START_TIMEOUT_ENV] = str(seconds)
    try:
        yield
    finally:
        if not user_set:
            os.environ.pop(RAY_TRAIN_START_TIMEOUT_ENV, None)


def _fresh_elastic_policy_class() -> Any:
    """ElasticScalingPolicy asking for a recomputed reservation. Defined in a function, so Ray
    pickles the class itself into its controller actor (by value), rather than a name to import."""
    import logging

    import ray
    from ray.train.v2._internal.execution.scaling_policy import AUTOSCALING_REQUESTS_GET_TIMEOUT_S, ElasticScalingPolicy
    from ray.train.v2._internal.util import time_monotonic

    class FreshElasticScalingPolicy(ElasticScalingPolicy):
        def _get_reserved_resources(self) -> Any:
            if time_monotonic() - self._latest_reserved_resources_query_time < self.GET_RESERVED_RESOURCES_INTERVAL_S:
                return self._latest_reserved_resources
            reserved = None
            try:
                reserved = ray.get(
                    self._autoscaling_coordinator.get_reserved_resources.remote(self._requester_id, recompute=True),
                    timeout=AUTOSCALING_REQUESTS_GET_TIMEOUT_S,
                )
            except Exception as error:  # as Ray's own policy does: no decision this time, the next one retries
                logging.getLogger(__name__).warning(f"could not get the reserved resources of {self._requester_id}: {error}")
            self._latest_reserved_resources_query_time = time_monotonic()
            self._latest_reserved_resources = reserved
            return reserved

    return FreshElasticScalingPolicy


# The class name of Ray Train V2's worker actors (ray.train.v2._internal.execution.worker_group.worker),
# one per training worker, which the State API lists with its pid and node.
RAY_TRAIN_WORKER_CLASS = "RayTrainWorker"


def train_worker_actors(job_id: str) -> List[Dict[str, str]]:
    """The live Ray Train worker processes of Ray job `job_id` (a driver's own runs), each as
    {"actor_id", "node_id", "pid"}.

    Ray's State API is public; the worker actors' class name is not. raydra needs the processes to
    send each the preemption notice (SIGTERM) SLURM's time-limit warning stands for: Ray Train
    offers no call that asks a running worker group to checkpoint and stop.

    Asks the State API of the cluster this process joined (its dashboard address, which the
    cluster's GCS holds), unless RAY_API_SERVER_ADDRESS names one: without an address Ray's client
    takes the cluster `ray start` last recorded in /tmp/ray, which may be another one (measured: the
    list came back empty and the notice reached no worker)."""
    import ray
    from ray.dashboard.utils import ray_address_to_api_server_url
    from ray.util.state import list_actors

    address = os.environ.get(RAY_STATE_API_ADDRESS_ENV) or ray_address_to_api_server_url(ray.get_runtime_context().gcs_address)
    filters = [("class_name", "=", RAY_TRAIN_WORKER_CLASS), ("state", "=", "ALIVE"), ("job_id", "=", job_id)]
    actors = list_actors(address=address, filters=filters, limit=10_000)
    return [{"actor_id": a.actor_id, "node_id": a.node_id, "pid": str(a.pid)} for a in actors]
