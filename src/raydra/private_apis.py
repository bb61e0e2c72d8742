"""Every reach into another library's private API, and nowhere else.

Each function below leans on something Ray, torch, Lightning or Hugging Face do not document, because
no public API does the job (each says why). tests/test_private_apis.py pins the behaviour raydra
relies on, so an upgrade that moves one fails there in seconds rather than in a slow end-to-end
test, and pyproject.toml caps those libraries at the minor versions tested: an upgrade is a
decision, made by running that test file.

Imports are inside the functions: the driver, the workers and `raydra compare` each load only
the libraries they use.
"""

import contextlib
import functools
import os
import sys
from typing import Any, Callable, Dict, Iterator, List, Tuple

# ---------------------------------------------------------------------------------------------
# Hydra


def report_as_hydra_does(error: BaseException) -> None:
    """Hydra's own report of an error that reached its main (a message for its own errors, a
    trimmed traceback for others), then exit 1, as `@hydra.main` does when it catches the error
    itself. raydra's entry has Hydra raise instead (HYDRA_FULL_ERROR), to say the errors a user can
    fix in one sentence; the rest go back to Hydra's reporter, which no public API exposes."""
    from hydra._internal.utils import run_and_report

    def raise_it() -> None:
        raise error

    run_and_report(raise_it)


# ---------------------------------------------------------------------------------------------
# Ray


# The name under which ray.init registers its own printer of worker lines with the dispatcher.
RAY_PRINT_LOGS_HANDLER = "ray_print_logs"


def worker_stdstream_dispatcher() -> Any:
    """Ray's driver-side dispatcher of every worker's stdout/stderr lines (add_handler(name, fn),
    remove_handler(name)).

    Public Ray offers `log_to_driver` (all or nothing); raydra needs the lines themselves, to keep
    all of them in logs/ray.log and show only rank 0's progress lines on the console.
    """
    from ray._private.ray_logging import global_worker_stdstream_dispatcher

    return global_worker_stdstream_dispatcher


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


# Where Ray's State API is served, for every process that inherits this environment. Ray's own
# clients read it first (ray.dashboard.utils.get_address_for_submission_client), before RAY_ADDRESS
# and before /tmp/ray/ray_current_cluster; Ray Train's PlacementGroupCleaner asks the State API,
# from inside the cluster, whether a run's controller lives. `ray start` prints it for `ray job`.
RAY_STATE_API_ADDRESS_ENV = "RAY_API_SERVER_ADDRESS"


def state_api_address_env(dashboard_port: int) -> Dict[str, str]:
    """The environment that names this machine's dashboard on `dashboard_port` as the State API of
    every process started with it (a local Ray's own processes, or `ray start`'s)."""
    return {RAY_STATE_API_ADDRESS_ENV: f"http://127.0.0.1:{dashboard_port}"}


# Read by `ray start --block` as it gets SIGTERM (Ray 2.60, ray._private.node): first ask the GCS to
# drain this node and wait until its raylet is idle, for up to this many seconds (default 30), then
# stop the node's processes; 0 stops them at once. A node raydra stops has nothing to drain for (no
# Serve replicas; a run's end or notice is handled before), and where SLURM's scancel sends SIGTERM
# to every process of the job, the GCS among them, `ray start` waited out the 30 s for a GCS already
# gone, past the job's end (measured: the head outlived its job by 31 s).
RAY_NODE_DRAIN_TIMEOUT_ENV = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"


def node_stops_at_once_env() -> Dict[str, str]:
    """The environment of a `ray start --block` that stops its processes as soon as it gets SIGTERM."""
    return {RAY_NODE_DRAIN_TIMEOUT_ENV: "0"}


# Ray's worker process setup hook travels to a worker process in this variable. Ray's public
# `worker_process_setup_hook` is honoured only in ray.init's runtime_env (every process of the
# job: the controller and Ray Train's helper actors too), not in an actor's own runtime_env.
RAY_SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"


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


def worker_setup_hook_env(hook: str) -> dict:
    """Environment variables that make Ray run `hook` ("module.function") in a worker process as
    it starts, before it takes any task: for RunConfig(worker_runtime_env={"env_vars": ...}), so
    only Ray Train's workers run it."""
    return {RAY_SETUP_HOOK_ENV: hook}


def run_exit_handlers() -> None:
    """Run the interpreter's exit handlers (atexit) now, in a process that ends without them: a
    multiprocessing child ends with os._exit. Ray's disconnect, W&B's and logging's flushes are
    registered there."""
    import atexit

    atexit._run_exitfuncs()


def main_module_import() -> Dict[str, str]:
    """How this process's `__main__` (the user's script, or `-m` module) is imported in another
    process: what multiprocessing's spawn and forkserver children are told
    (multiprocessing.spawn.get_preparation_data, undocumented). Empty when there is nothing to
    import (an interactive session, a test runner's own main)."""
    from multiprocessing import spawn

    data = spawn.get_preparation_data("raydra-job")
    return {key: data[key] for key in ("init_main_from_name", "init_main_from_path") if key in data}


def import_main_module(how: Dict[str, str]) -> None:
    """Import another process's `__main__` here as multiprocessing's children do
    (multiprocessing.spawn.prepare, undocumented): as `__mp_main__`, aliased to `__main__`, its
    `if __name__ == "__main__":` block not run. A script whose path does not exist on this machine
    (a Ray node of another host) is skipped: its job's task function came by value."""
    from multiprocessing import spawn

    path = how.get("init_main_from_path")
    if path is not None and not os.path.isfile(path):
        return
    spawn.prepare(how)


def leave_forkserver() -> None:
    """In a child of multiprocessing's forkserver, let go of the server's liveness pipe
    (multiprocessing.forkserver's `_forkserver_alive_fd`, undocumented), so that the server ends
    when the process that started it does, whatever its children do. Every child holds the pipe's
    writing end (so that it could use the same server in turn), and the server only ends once no
    process holds it: a job of a launcher that was killed kept it running, and went on unwatched.
    This process would start a server of its own if it needed one."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
    server._forkserver_alive_fd = None
    server._forkserver_address = None


def draw_actor_class_ids_from_os() -> None:
    """Have `@ray.remote` classes draw their ids from the OS (ray.actor's `ActorClassID`, a module
    name, replaced) rather than from Ray's C++ generator (ray/util/random.h: "not fork-safe"),
    whose one shared seed source the first draw fills. Ray defines actor classes as it imports
    (ray.data's, imported by ray.train), so the jobs' forkserver, which imports Ray Train for them,
    filled that source before forking: every job then drew the same "random" ids, and two jobs
    joining Ray at once put the same warm-up object in the object store, where the second
    crashed (`Check failed: WarmupStore() ... Seal() called on an object without a reference`).
    Called before Ray's modules are imported, the server never draws, and each job fills its own
    source from the OS at its first draw. Random either way; nothing else reads these ids."""
    import ray.actor

    actor_class_id = ray.actor.ActorClassID

    class ActorClassIDsFromOS:
        @staticmethod
        def from_random() -> Any:
            return actor_class_id(os.urandom(actor_class_id.size()))

    ray.actor.ActorClassID = ActorClassIDsFromOS


def lean_local_ray() -> dict:
    """What raydra's own local Ray (ray.address unset: one machine, started for this run) is
    spared, as ray.init keyword arguments.

    Ray prestarts one idle worker process per CPU as the first driver connects
    (`prestart_worker_first_driver`). Ray Train's actors never take them (they carry their own
    runtime_env), so on 2 cores they only took CPU from the run's start.
    """
    return {"_system_config": {"prestart_worker_first_driver": False}}


def reread_auth_settings() -> None:
    """Ray in this process takes up RAY_AUTH_MODE and RAY_AUTH_TOKEN as they are now. Ray reads
    them into its config as it is imported and caches the token it loaded: set later, a driver
    joining a cluster with token authentication would send no token (measured: refused). Ray's
    own switch to token mode for a new local cluster does the same two things
    (authentication_token_setup._enable_token_auth, and the test utilities' reset)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def local_ray_on_loopback() -> Iterator[None]:
    """A local Ray that ray.init starts inside the block listens on the loopback address only: its
    GCS, raylet, object manager, workers, agents and metrics endpoints (measured with psutil: on
    Linux they took the machine's address or every interface, `*`/0.0.0.0).

    Ray binds each server to its node's IP (and loopback), and takes the node IP of a new local
    cluster from services.get_node_ip_address, which answers 127.0.0.1 where
    ray_constants.ENABLE_RAY_CLUSTER is false (Ray's own default on macOS and Windows, where a
    local Ray is one machine's alone); passing `_node_ip_address="127.0.0.1"` to ray.init is
    turned back into the machine's address. The flag is read only there, and put back after the
    block: the processes the block started were told their address on their command lines."""
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def keep_sigterm_through_ray_shutdown() -> None:
    """The Ray core worker this process starts as a driver (ray.init, from now on) installs no
    crash handler of Ray's C++ logger. That handler takes SIGTERM among the crash signals, and
    ray.shutdown() sets each back to the kernel's default beneath Python
    (RayLog::UninstallSignalAction), while Python still names its own handler: about 0.3 s into a
    local Ray's 1.6 s shutdown (measured), after which a SIGTERM ended a stopping driver at once,
    exit code 143, before its final record and the line saying how to continue it. The switch is
    the module constant that Ray reads from RAY_DISABLE_FAILURE_SIGNAL_HANDLER as it is imported
    (for a JVM's sake); set here, it leaves this process alone, not Ray's workers. What the driver
    gives up is the C++ stack that handler printed were the driver itself to crash in Ray's code."""
    from ray._private import ray_constants

    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True


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
      itself does not, until the job ends: tests/test_private_apis.py shows it). For a driver
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


def torch_config(backend: Any, timeout_s: int) -> Any:
    """Ray Train's TorchConfig for the run's process group (`backend`, `timeout_s` as Ray's own
    takes them), whose rendezvous store listens on one address: rank 0's node's, the address Ray
    names as MASTER_ADDR (127.0.0.1 for the local Ray raydra starts, local_ray_on_loopback).

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
    DeepSpeed's environment read them) and the torch variables every worker gets, the shut-down.

    A TorchConfig subclass naming its own backend class is how Ray's own TorchftConfig plugs in;
    _TorchBackend, its helper for the torch variables and the worker group's execute methods are
    Ray Train's internals. The classes go to Ray Train's controller by value, as the trainer's
    scaling policy does (torch_trainer_class)."""
    config_class, _ = _bound_rendezvous_classes()
    return config_class(backend=backend, timeout_s=timeout_s)


@functools.lru_cache(maxsize=None)
def _bound_rendezvous_classes() -> Tuple[Any, Any]:
    from ray.train.torch.config import TorchConfig, _set_torch_distributed_env_vars, _TorchBackend

    class BoundRendezvousBackend(_TorchBackend):
        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            address, port = worker_group.execute_single(0, rendezvous_listener)
            worker_group.execute(_set_master, address=address, port=port)
            worker_group.execute(_set_torch_distributed_env_vars)
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
            import ray

            ray.get(joins)

    class BoundRendezvousTorchConfig(TorchConfig):
        @property
        def backend_cls(self) -> Any:
            return BoundRendezvousBackend

    return BoundRendezvousTorchConfig, BoundRendezvousBackend


# The socket rank 0's worker bound for the rendezvous store, until join_process_group hands it to
# torch: one per worker group start (a restarted or resized group binds a new one).
_rendezvous_sockets: List[Any] = []


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


def tune_stop_probe() -> Callable[[], bool]:
    """Inside a Tune function trial: a function that tells whether Tune has asked this trial to stop.

    Taken at the trial's start and held: when Tune stops a trial, it sets the session's stop event
    and drops the session in the same call, often before the trial's thread sees its fit end. Tune
    has no public "was I stopped" question for function trainables.
    """
    from ray.train._internal.session import get_session

    session = get_session()
    return lambda: session is not None and session.stop_event.is_set()


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


def submitted_job_working_dir() -> Any:
    """The working_dir of the Ray job this driver runs in (`ray job submit --working-dir .`), or None.

    Ray's job server hands a submitted driver its job's runtime_env in an environment variable and
    merges it with the one ray.init is given; both naming a working_dir is a conflict ray.init
    refuses. There is no public question for it before ray.init.
    """
    import json
    import os

    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    job = os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR)
    return (json.loads(job).get("runtime_env") or {}).get("working_dir") if job else None


def replace_restored_tuner_callbacks(tuner: Any, callbacks: List[Any]) -> None:
    """A restored Tuner's RunConfig holds the interrupted driver's callbacks, unpickled; the new
    driver needs its own to see the trials. `Tuner.restore` takes no callbacks of its own."""
    tuner._local_tuner.get_run_config().callbacks = callbacks


def restored_tuner_scheduler(tuner: Any) -> Any:
    """The trial scheduler a restored Tuner will use; Tuner has no public accessor for it."""
    return tuner._local_tuner._tune_config.scheduler


def restore_scheduler_rungs(scheduler: Any, path: str) -> None:
    """Load a saved ASHA scheduler's rungs into `scheduler` while keeping its metric and mode.

    `Tuner.restore` brings back the scheduler as created, with no rungs; `TrialScheduler.restore`
    (public) would also bring back metric and mode, which Tune then refuses to set a second time.
    """
    kept = {k: v for k, v in vars(scheduler).items() if k in ("_metric", "_mode", "_metric_op")}
    scheduler.restore(path)
    vars(scheduler).update(kept)


# ---------------------------------------------------------------------------------------------
# torch


# torch's flight recorder keeps its last entries per process group when this is above 0, read as the
# process group is created (distributed_c10d; TORCH_NCCL_TRACE_BUFFER_SIZE is its older name).
FLIGHT_RECORDER_ENV = "TORCH_FR_BUFFER_SIZE"
# Entries kept: every collective of the last several steps of any model (a few hundred bytes each).
FLIGHT_RECORDER_ENTRIES = 2000


def flight_record() -> Any:
    """torch's flight record of this process's collectives (what each process group enqueued,
    started and completed, with sequence numbers: the rank whose last started collective is behind
    the others' is the one that stopped), as JSON text; None without a process group or a recorder.

    torch documents the recorder (docs: "Flight Recorder") and its environment variable, but dumps
    it in-process only through torch._C._distributed_c10d: the public route is its automatic dump
    when a NCCL collective times out, which is the 30 minutes the hang watchdog exists to cut short.
    It records gloo's collectives too, so CPU runs have it as well."""
    import torch.distributed

    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    if int(os.environ.get(FLIGHT_RECORDER_ENV, os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0"))) <= 0:
        return None
    from torch._C._distributed_c10d import _dump_fr_trace_json

    return _dump_fr_trace_json(includeCollectives=True, onlyActive=False).decode()


def apply_activation_checkpointing(module: Any, check_fn: Callable[[Any], bool]) -> None:
    """Wrap every submodule of `module` for which `check_fn` holds so that its activations are
    recomputed in backward instead of kept. torch's FSDP2 examples use this wrapper; it lives in
    torch.distributed.algorithms._checkpoint (torch.utils.checkpoint has no module-wrapping API)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing as apply

    apply(module, check_fn=check_fn)


# ---------------------------------------------------------------------------------------------
# Lightning


def _model_parallel_module() -> Any:
    """The module of Lightning's ModelParallelStrategy, from whichever package Ray's strategies use."""
    from raydra.lightning import pl

    return sys.modules[pl.strategies.ModelParallelStrategy.__module__]


def materialize_distributed_module(module: Any, device: Any) -> None:
    """Initialise a meta-device module's parameters on `device` after sharding, as
    ModelParallelStrategy.setup does; the strategy exposes no public step for it."""
    _model_parallel_module()._materialize_distributed_module(module, device)


def optimizers_to_device(optimizers: List[Any], device: Any) -> None:
    """Move restored optimizer state to the worker's device, as ModelParallelStrategy.setup does."""
    _model_parallel_module()._optimizers_to_device(optimizers, device)


def save_distributed_checkpoint(shards: Any, path: Any) -> None:
    """torch.distributed.checkpoint save of this worker's shards, in the layout Lightning's
    ModelParallelStrategy.load_checkpoint reads back."""
    _model_parallel_module()._distributed_checkpoint_save(shards, path)


def distributed_checkpoint_metadata_file() -> str:
    """The file name Lightning's sharded checkpoints keep the non-tensor state in (meta.pt)."""
    return _model_parallel_module()._METADATA_FILENAME


def restart_train_iterator(trainer: Any) -> None:
    """Make the fit loop's train iterator again, from the loader's current position.

    Lightning makes it before `on_train_start`, and a DataLoader with worker processes has already
    queued batches from it by then; a resumed run moves the sampler there, so the iterator must be
    made again. The fit loop's data fetcher is the only handle on it.
    """
    fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
    if fetcher is not None:
        iter(fetcher)


def set_csv_columns(writer: Any, columns: List[str]) -> None:
    """Tell Lightning's CSV experiment writer which columns metrics.csv already has, so it appends
    to the rows raydra kept instead of rewriting the header. The writer has no public setter."""
    writer.metrics_keys = list(columns)


def csv_pending(writer: Any) -> Tuple[str, List[Dict[str, Any]], List[str], bool]:
    """What Lightning's CSV experiment writer holds for its next save: (metrics.csv's path, the rows
    logged since its last save, its columns before them, whether those rows bring new columns).
    The new rows' keys join the writer's columns (sorted), as its own save() does first. The
    writer's rows and columns have no public handle, and `_record_new_keys` is its own step."""
    before = list(writer.metrics_keys)
    new_keys = writer._record_new_keys()
    return writer.metrics_file_path, writer.metrics, before, bool(new_keys)


def csv_columns(writer: Any) -> List[str]:
    """The columns Lightning's CSV experiment writer writes metrics.csv under."""
    return list(writer.metrics_keys)


def csv_saved(writer: Any) -> None:
    """Tell Lightning's CSV experiment writer that its pending rows are on disk, as its save() ends."""
    writer.metrics = []


def epoch_end_logging_step(trainer: Any) -> int:
    """The step Lightning logs an epoch's end metrics at, read in on_train_epoch_end: its count of
    batches that stepped the optimizer, less the one its last batch added (the fit loop takes it off
    while it logs them, so that they share the step of the epoch's last batch and its validation).
    Not trainer.global_step, which counts optimizer steps: two a batch for a module with two
    optimizers under manual optimization. The count has no public handle."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped - 1


def tensorboard_default_hp_metric(logger: Any) -> bool:
    """Whether a TensorBoardLogger was built with `default_hp_metric=True`, which it keeps only in
    itself: False is how a user says they log `hp_metric` themselves (Lightning's own advice)."""
    return bool(logger._default_hp_metric)


# ---------------------------------------------------------------------------------------------
# Hugging Face


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Make `datasets` and `huggingface_hub` answer from the local cache only, for this block.

    HF_HUB_OFFLINE is read once, at import; after that only these module constants switch it. Going
    offline keeps a cached hub id from contacting the hub (which, without network, waits on time-outs).
    """
    import datasets.config
    import huggingface_hub.constants

    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


# ---------------------------------------------------------------------------------------------
# torchmetrics

# What torchmetrics imports at its own import because it is installed, though only some metrics use
# it (torchmetrics 1.9; Lightning imports torchmetrics whole): transformers for BERTScore, InfoLM and
# CLIPScore, matplotlib for Metric.plot, scipy.signal for an audio library's back-compatibility patch.
# Its flags (lightning_utilities RequirementCache objects, in torchmetrics.utilities.imports) that
# gate those imports, and the package torchmetrics/__init__ asks `package_available` about.
TORCHMETRICS_OPTIONAL_FLAGS = (
    "_TRANSFORMERS_AVAILABLE",
    "_TRANSFORMERS_GREATER_EQUAL_4_4",
    "_TRANSFORMERS_GREATER_EQUAL_4_10",
    "_MATPLOTLIB_AVAILABLE",
    "_SCIPI_AVAILABLE",
)
TORCHMETRICS_IMPORTS_MODULE = "torchmetrics.utilities.imports"
# What those flags keep from being imported (tests/test_private_apis.py checks that none is).
TORCHMETRICS_LEAN_LEAVES_OUT = ("transformers", "scipy.signal", "matplotlib")


def torchmetrics_without_optional_integrations() -> bool:
    """Have torchmetrics, when it is first imported in this process, leave out the integrations that
    the flags above gate (torchmetrics' own issue #3457): `import raydra.worker.loop` took 4.3-4.7 s
    and takes 2.9-3.1 s with them left out (transformers 0.48, scipy.signal 0.48, matplotlib 0.21 of
    it in -X importtime, 2026-11-27, this 2-core machine). Only for a process whose
    run builds nothing of the user's (raydra.fit decides): those metrics then say they need the
    package, as on a machine without it. False, changing nothing, where torchmetrics is already
    imported.

    No public switch exists: the flags are evaluated as torchmetrics' modules import, so they are set
    the moment torchmetrics.utilities.imports has run, through a finder that wraps that module's
    loader, and torchmetrics/__init__'s own `package_available("scipy")` is answered False while it
    runs."""
    import importlib.abc
    import importlib.machinery

    if "torchmetrics" in sys.modules:
        return False
    import lightning_utilities.core.imports as lu_imports

    real_package_available = lu_imports.package_available

    def package_available(name: str) -> bool:
        # Bound by torchmetrics/__init__ at its import; everyone else gets the real one back below.
        return (
            False
            if name == "scipy" and "torchmetrics" in sys.modules and "torchmetrics.functional" not in sys.modules
            else real_package_available(name)
        )

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name != TORCHMETRICS_IMPORTS_MODULE:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader

            class Loader(importlib.abc.Loader):
                def create_module(self, spec: Any) -> Any:
                    return loader.create_module(spec)

                def exec_module(self, module: Any) -> None:
                    loader.exec_module(module)
                    for flag in TORCHMETRICS_OPTIONAL_FLAGS:
                        getattr(module, flag).available = False
                    lu_imports.package_available = real_package_available

            spec.loader = Loader()
            return spec

    lu_imports.package_available = package_available
    sys.meta_path.insert(0, Finder())
    return True


# ---------------------------------------------------------------------------------------------
# W&B

# A run's `.wandb` file (its transaction log, offline or online: what `wandb sync` uploads) is a
# LevelDB log of `wandb.proto.wandb_internal_pb2.Record`s behind a 7-byte header. wandb 0.29 read it
# with wandb.sdk.internal.datastore, which 0.31 no longer ships; no public reader exists. The layout
# (wandb 0.29's datastore.py, LevelDB's doc/log_format.md): 32 KiB blocks of chunks, each chunk
# a 7-byte header (CRC-32 of its type and data, data length, type: full, first, middle, last); a
# block's tail shorter than a header is zero padding.
WANDB_FILE_HEADER = b":W&B\xe1\xbe\x00"  # ident ":W&B", magic 0xBEE1 (little-endian), version 0
WANDB_BLOCK = 32768
WANDB_CHUNK_HEADER = 7
WANDB_FULL, WANDB_FIRST, WANDB_MIDDLE, WANDB_LAST = 1, 2, 3, 4


def wandb_records(path: Any) -> Iterator[Any]:
    """Every whole record of a `.wandb` file, in order, as W&B's protobuf Record. A file its writer
    never finished (a process killed mid-write) ends at its last whole record: what W&B holds."""
    import struct
    import zlib

    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as file:
        data = file.read()
    if not data.startswith(WANDB_FILE_HEADER):
        return
    offset, pieces = len(WANDB_FILE_HEADER), []
    while True:
        left_in_block = WANDB_BLOCK - offset % WANDB_BLOCK
        if left_in_block < WANDB_CHUNK_HEADER:
            offset += left_in_block
        if offset + WANDB_CHUNK_HEADER > len(data):
            return
        checksum, length, kind = struct.unpack_from("<IHB", data, offset)
        chunk = data[offset + WANDB_CHUNK_HEADER : offset + WANDB_CHUNK_HEADER + length]
        if len(chunk) < length or kind not in (WANDB_FULL, WANDB_FIRST, WANDB_MIDDLE, WANDB_LAST):
            return
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != checksum:
            return  # a chunk its writer did not finish: nothing after it was written whole
        offset += WANDB_CHUNK_HEADER + length
        if kind in (WANDB_FULL, WANDB_FIRST):
            pieces = [chunk]
        else:
            pieces.append(chunk)
        if kind in (WANDB_FULL, WANDB_LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(pieces))
            yield record
