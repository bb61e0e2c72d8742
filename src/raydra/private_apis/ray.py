"""Ray's private API, outside Ray Train and Tune: its driver's printing, processes, jobs, nodes and
auth (raydra.private_apis says why such a module exists).
"""

import contextlib
import os
from typing import Any, Dict, Iterator

# The name under which ray.init registers its own printer of worker lines with the dispatcher.
RAY_PRINT_LOGS_HANDLER = "ray_print_logs"

# Ray's private modules a multirun job's driver imports only as it first uses Ray (-X importtime of a
# job, 2026-11-28): the serialization context's pyarrow support, at the first actor call, and Ray
# Data's issue-detection config, which Ray Train's trainer reads. The jobs' server imports them ahead
# (raydra.multirun.job_process.PRELOAD); one that moves is skipped there and imported by the job as before.
RAY_MODULES_IMPORTED_ON_FIRST_USE = ("ray._private.arrow_serialization", "ray.data._internal.issue_detection.issue_detector_configuration")


def worker_stdstream_dispatcher() -> Any:
    """Ray's driver-side dispatcher of every worker's stdout/stderr lines (add_handler(name, fn),
    remove_handler(name)).

    Public Ray offers `log_to_driver` (all or nothing); raydra needs the lines themselves, to keep
    all of them in logs/ray.log and show only rank 0's progress lines on the console.
    """
    from ray._private.ray_logging import global_worker_stdstream_dispatcher

    return global_worker_stdstream_dispatcher


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
