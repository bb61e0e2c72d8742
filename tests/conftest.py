"""Shared fixtures: one Ray cluster for every end-to-end test, and a way to run train.py for real.

Starting Ray costs ~10 s here, so end-to-end tests join one cluster started once per session
with `ray start --head` (which also exercises `ray.address=`). Tests that must prove the
in-process local start do so by leaving ray.address unset.
"""

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from raydra.cluster import ray_node
from raydra.testing import free_port, start_ray_head, start_s3_server, stop_process_tree, stop_ray_node

REPO = Path(__file__).resolve().parents[1]
# The test cluster's token (Ray's token authentication): one per session, handed to the cluster and
# every client through the environment. `ray start` refuses to create one itself, and a token file
# in ~/.ray would exist only if some earlier local ray.init happened to write it.
RAY_AUTH_TOKEN = secrets.token_hex(32)


def base_env() -> dict:
    env = dict(os.environ)
    # RAY_AUTH_MODE=token: Ray sends its token to an explicitly named cluster address only when
    # told to, as a user joining a `ray start` cluster by address must also do.
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=RAY_AUTH_TOKEN,
    )
    env.pop("WANDB_API_KEY", None)
    env.pop("RAY_ADDRESS", None)
    # Storage credentials only where a test hands them over (S3_ENV): the session cluster has none,
    # as a cluster whose nodes were never given them.
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(key, None)
    return env


# The temp dirs own_local_ray_env made, removed as the session ends (their Rays ended with their tests).
_OWN_RAY_TMPDIRS: list = []


def own_local_ray_env() -> dict:
    """base_env for a process that starts a local Ray of its own (ray.address unset): no token or
    address of the session's cluster, nor its State API, and a short temp dir of its own (Ray's
    socket paths must stay short)."""
    env = {k: v for k, v in base_env().items() if not k.startswith("RAY_AUTH") and k != "RAY_API_SERVER_ADDRESS"}
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    _OWN_RAY_TMPDIRS.append(env["RAY_TMPDIR"])
    return env


def pytest_sessionfinish(session, exitstatus):
    for path in _OWN_RAY_TMPDIRS:
        shutil.rmtree(path, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    """Seconds per test file (set-up, call and tear-down, a shared fixture's start in the file that
    first asked for it), slowest first: where the suite's time budget goes, in every CI log."""
    per_file: dict = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown"):
                name = report.nodeid.split("::", 1)[0]
                per_file[name] = per_file.get(name, 0.0) + report.duration
    if not per_file:
        return
    terminalreporter.write_sep("=", "seconds per test file")
    for name, seconds in sorted(per_file.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f}  {name}")
    terminalreporter.write_line(f"{sum(per_file.values()):8.1f}  in all")


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A 2-CPU Ray head node for the session; yields its address. Only this node is stopped.

    Its own --temp-dir: `ray start` records the latest cluster in <temp-dir>/ray_current_cluster, and
    Ray's job server hands that address to every job it starts (ray.address=auto). Sharing /tmp/ray
    with the private-disk cluster, started later, sent this cluster's jobs to that one."""
    temp_dir = _short_temp_dir("rayh-")
    try:
        proc, address = start_ray_head(tmp_path_factory.mktemp("ray") / "ray_start.log", base_env(), args=[f"--temp-dir={temp_dir}"])
    except RuntimeError as error:
        pytest.fail(f"the test Ray cluster: {error}")
    try:
        yield address
    finally:
        stop_process_tree(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def reference(ray_cluster, tmp_path_factory) -> dict:
    """The summary of helpers.EVERY_STEP run without faults on the session cluster: what the runs
    tests/test_reliability.py and tests/test_preemption.py stop, kill and resume must end up
    matching. One run for both modules (~45 s here)."""
    from helpers import EVERY_STEP

    outputs = tmp_path_factory.mktemp("reference")
    done = run_train(*EVERY_STEP, outputs=outputs, address=ray_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(outputs)
    return summary_of(run_dir)


def _short_temp_dir(prefix: str) -> Path:
    """A Ray --temp-dir: short, as Ray's unix sockets live below it and a socket path may not exceed 107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix))


@contextlib.contextmanager
def cluster_of_nodes(monkeypatch, nodes: int, temp_prefix: str):
    """A ray.cluster_utils.Cluster: a head with no CPU (nothing of a run lands there but the driver)
    and `nodes` 1-CPU nodes, separate raylets that Ray schedules and fails like separate hosts. Its
    own temp dir (the nodes take the head's), ports and processes: the session's `ray start` cluster
    is untouched, and shutdown stops only what this cluster started. Its processes, started from
    this one, find its State API through RAY_API_SERVER_ADDRESS (see raydra.testing.start_ray_head)."""
    from ray.cluster_utils import Cluster

    dashboard_port = free_port()
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", f"http://127.0.0.1:{dashboard_port}")
    temp_dir = _short_temp_dir(temp_prefix)
    # The head writes its address to $RAY_TMPDIR/ray/ray_current_cluster, a dir it never makes: point
    # it here, or it fails where /tmp/ray is absent (a fresh machine) and overwrites it where not.
    monkeypatch.setenv("RAY_TMPDIR", str(temp_dir))
    (temp_dir / "ray").mkdir()
    cluster = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "gcs_server_port": free_port(),
                "dashboard_port": dashboard_port,
                "temp_dir": str(temp_dir / "ray"),
            },
        )
        for _ in range(nodes):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def run_train(*overrides: str, outputs: Path, address: str = None, timeout: int = 600, env: dict = None):
    """Run `python train.py` as a user would; returns the CompletedProcess."""
    flags = [o for o in overrides if o.startswith("-")]
    rest = [o for o in overrides if not o.startswith("-")]
    args = [sys.executable, str(REPO / "train.py"), *flags, f"paths.outputs={outputs}", *rest]
    if address:
        args.append(f"ray.address={address}")
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**base_env(), **(env or {})})


@pytest.fixture
def train_here(monkeypatch, capfd):
    """`python train.py` run inside this process: the entry, Hydra's composition and records, the
    driver and the fit as a user's command runs them, without the ~5 s a new Python process spends
    importing torch and Lightning again. For runs that start no Ray: refusals before Ray starts, and
    local mode (scale.num_workers=0), where Ray Train's own local mode runs the training function in
    this process. Returns what run_train returns (returncode, stdout, stderr). What needs a process
    of its own (a signal, a worker's Ray, a second run in one process) stays with run_train."""
    from hydra.core.global_hydra import GlobalHydra

    from raydra.entry import hydra_main

    for key, value in base_env().items():
        if key.startswith(("WANDB_", "RAY_USAGE", "PYTHONUNBUFFERED")):
            monkeypatch.setenv(key, value)
    for key in ("WANDB_API_KEY", "RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(REPO)

    def train(*overrides: str, outputs: Path) -> subprocess.CompletedProcess:
        flags = [o for o in overrides if o.startswith("-")]
        rest = [o for o in overrides if not o.startswith("-")]
        argv = ["train.py", *flags, f"paths.outputs={outputs}", *rest]
        monkeypatch.setattr(sys, "argv", argv)
        loggers = [logging.getLogger(), logging.getLogger("raydra")]
        before = [(logger.handlers[:], logger.level) for logger in loggers]
        environ = dict(os.environ)
        # A run stopped by a signal, whose process ends with it, leaves its stop signals in place for its
        # way out (raydra.run.lifecycle): this process goes on, with the handlers it had.
        signal_handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
        capfd.readouterr()
        GlobalHydra.instance().clear()
        try:
            hydra_main()
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        finally:
            GlobalHydra.instance().clear()
            # Hydra configured logging for this run (its driver.log, the console): put back what was.
            for logger, (handlers, level) in zip(loggers, before, strict=True):
                for handler in logger.handlers:
                    if handler not in handlers:
                        handler.close()
                logger.handlers[:] = handlers
                logger.setLevel(level)
            started_ray = _leave_ray_started_here()
            # What the run set in the environment (Ray Train's poll interval, Ray's auth mode) stays
            # with it: a later test's own cluster, started in this process, would inherit it.
            os.environ.clear()
            os.environ.update(environ)
            for signum, handler in signal_handlers.items():
                signal.signal(signum, handler)
        out = capfd.readouterr()
        if started_ray:
            pytest.fail(f"{' '.join(argv)} started Ray inside the test's process; run it with run_train\n{out.out[-2000:]}")
        return subprocess.CompletedProcess(argv, code, out.out, out.err)

    return train


def _leave_ray_started_here() -> bool:
    """Whether a run in this process started Ray (then left at once); only if Ray is imported."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    ray.shutdown()
    return True


def run_dirs(outputs: Path, kind: str = "runs") -> list:
    return sorted(p.parent for p in Path(outputs, kind).glob("**/summary.json"))


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# A multirun job small enough to run two side by side on the 2-CPU session cluster.
SMALL_JOB = ("experiment=vit_digits_smoke", "trainer.max_epochs=1", "trainer.test=false", "scale.num_workers=1")


def ran_side_by_side(a: dict, b: dict) -> bool:
    """Whether two runs' summary.json spans (started_at to finished_at) overlap."""
    start_a, end_a = datetime.fromisoformat(a["started_at"]), datetime.fromisoformat(a["finished_at"])
    start_b, end_b = datetime.fromisoformat(b["started_at"]), datetime.fromisoformat(b["finished_at"])
    return start_a < end_b and start_b < end_a


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests skip cleanly on machines without CUDA (CI has none)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


# ---------------------------------------------------------------------------------------------
# Storage and clusters without a shared disk

# Dummy credentials for the test S3 server (moto accepts any). A process that reaches it needs
# them in its environment, or pyarrow falls back to AWS's credential chain (instance metadata),
# which waits on network timeouts here. Hand them to subprocesses: run_train(..., env=S3_ENV).
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server for the session, as a subprocess on a free port (so Ray workers and other
    processes reach it too); yields its endpoint "127.0.0.1:PORT". Sets nothing global: processes
    that use it take S3_ENV."""
    try:
        proc, endpoint = start_s3_server(tmp_path_factory.mktemp("s3") / "moto_server.log", S3_ENV)
    except RuntimeError as error:
        pytest.fail(f"the test S3 server: {error}")
    try:
        yield endpoint
    finally:
        stop_process_tree(proc)


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A fresh bucket on the session's S3 server; yields a storage URI below it,
    "s3://<bucket>/prefix?endpoint_override=127.0.0.1:PORT&scheme=http".

    The URI carries the endpoint (pyarrow 26's S3 URIs accept endpoint_override, scheme, region,
    allow_bucket_creation and allow_bucket_deletion, and refuse other keys); the credentials are
    S3_ENV, set in this process's environment for the test and to be passed to subprocesses."""
    import pyarrow.fs as pafs

    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    bucket = f"raydra-{secrets.token_hex(4)}"
    s3 = pafs.S3FileSystem(
        endpoint_override=s3_server,
        scheme="http",
        access_key=S3_ENV["AWS_ACCESS_KEY_ID"],
        secret_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
        region=S3_ENV["AWS_DEFAULT_REGION"],
        allow_bucket_creation=True,
    )
    s3.create_dir(bucket)
    yield f"s3://{bucket}/prefix?endpoint_override={s3_server}&scheme=http"


@dataclass
class PrivateDiskCluster:
    address: str  # the head's GCS address, for ray.address= / ray.init(address=...)
    outputs: Path  # a directory only the driver's side sees: the worker node has an empty tmpfs there
    worker_temp_dir: Path  # the worker node's own Ray temp dir (its session logs)
    env: dict  # what its nodes were started with (S3_ENV, the auth token, its State API address)


@pytest.fixture(scope="module")
def private_disk_cluster(tmp_path_factory):
    """A 2-node Ray cluster on this machine whose worker node cannot see the driver's outputs dir,
    as on a cluster whose nodes share no disk (ray.cluster_utils.Cluster's nodes share one and cannot
    show it). One per module that uses it: idle, its processes take ~15 % of a core, which a
    session-wide one took from every test after test_cluster_storage's (about an hour on 2 cores);
    starting it again costs ~17 s for each of the two modules after that one.

    - Head: `ray start --head --num-cpus=0`, its own --temp-dir (see ray_cluster). Nothing that asks for CPU lands there, so every training
      worker and Tune trial runs on the worker node; the Train controller asks for 0 CPU and is pinned
      to the driver's node (the head) by Ray. A passing run therefore proves that no worker touched
      the driver's disk.
    - Worker: `unshare --mount --propagation private` (its own mount namespace, whose mounts do not
      propagate back), a private tmpfs mounted over `outputs`, then `ray start --address=<head>
      --num-cpus=2 --block`: one 2-worker x 1-CPU run, or two 1-worker trials, fit. Its own
      --temp-dir, so its log monitor reads only its own workers' logs (two monitors on one session
      dir publish every line twice), and free ports for everything, beside any other Ray here.

    Both nodes get S3_ENV and the session's auth token. Linux and root only (unshare -m needs
    CAP_SYS_ADMIN)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("private_disk_cluster needs Linux, root and unshare (util-linux) to give a Ray node its own mounts")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare --mount is refused here ({probe.stderr.strip()}); run as root with CAP_SYS_ADMIN")

    dashboard_port = free_port()
    # Its nodes' processes reach its State API here (see raydra.testing.start_ray_head).
    env = {**base_env(), **S3_ENV, "RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{dashboard_port}"}
    logs = tmp_path_factory.mktemp("private_disk_cluster")
    outputs = tmp_path_factory.mktemp("private_outputs")
    head_temp, worker_temp = _short_temp_dir("rayp-"), _short_temp_dir("rayw-")
    head_log = logs / "head.log"
    head = _start_node(
        ["--head", *ray_node.head_port_flags(dashboard_port), *ray_node.port_flags(), "--num-cpus=0", f"--temp-dir={head_temp}"],
        head_log,
        env,
    )
    worker = None
    try:
        address = _wait_node_started(head, head_log, "head", ray_node.wait_head_started)
        cluster = PrivateDiskCluster(address=address, outputs=outputs, worker_temp_dir=worker_temp, env=env)
        worker = start_private_node(cluster, num_cpus=2, temp_dir=worker_temp, log_path=logs / "worker.log")
        yield cluster
    finally:
        if worker is not None:
            stop_ray_node(worker)
        stop_ray_node(head)
        shutil.rmtree(worker_temp, ignore_errors=True)
        shutil.rmtree(head_temp, ignore_errors=True)


def start_private_node(cluster: "PrivateDiskCluster", num_cpus: int, temp_dir: Path, log_path: Path) -> subprocess.Popen:
    """One more node of the private-disk cluster, started and joined: `unshare --mount --propagation
    private` (its own mount namespace, whose mounts do not propagate back), a private tmpfs mounted
    over the cluster's outputs, then `ray start --address=<head> --block` with its own --temp-dir (so
    its log monitor reads only its own workers' logs: two monitors on one session dir publish every
    line twice) and free ports. unshare execs sh, which execs the node's keeper (raydra.cluster.ray_node),
    the parent of `ray start`: the pid Popen holds is the one stop_ray_node signals, and the keeper
    passes the signal on; the tmpfs lives as long as the namespace's processes."""
    node = _start_node(
        [f"--address={cluster.address}", f"--num-cpus={num_cpus}", f"--temp-dir={temp_dir}"],
        log_path,
        cluster.env,
        private_dir=cluster.outputs,
    )
    _wait_node_started(node, log_path, f"node in {temp_dir}")
    return node


def _start_node(args: list, log_path: Path, env: dict, private_dir: Path = None) -> subprocess.Popen:
    flags = [*args, *ray_node.port_flags(), "--object-store-memory=300000000", "--num-gpus=0"]
    prefix = []
    if private_dir is not None:
        mount = 'mount -t tmpfs -o size=256m raydra-private-outputs "$1" && shift && exec "$@"'
        prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", str(private_dir)]
    return ray_node.start(flags, log_path, env, prefix=prefix)


def _wait_node_started(proc: subprocess.Popen, log_path: Path, what: str, wait=ray_node.wait_started) -> str:
    try:
        return wait(proc, log_path, timeout=120)
    except RuntimeError as error:
        pytest.fail(f"the private-disk cluster's {what} did not start: {error}")


# ---------------------------------------------------------------------------------------------
# Lightning pieces for tests of one part (a callback, a data module, a checkpoint) without a run


def bare_trainer(**settings):
    """A plain Lightning Trainer on the CPU that writes and prints nothing; `settings` add to it."""
    from raydra.lightning import pl

    quiet = dict(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    return pl.Trainer(**{**quiet, **settings})


def tiny_vit(**settings):
    """raydra's ViT at a size that trains on digits-sized (8x8, 1 channel) images in seconds."""
    from raydra.models.vit import ViTClassifier

    tiny = dict(image_size=8, num_channels=1, num_classes=10, patch_size=2, hidden_size=64, num_layers=4, num_heads=4, mlp_size=128)
    tiny["optimizer"] = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3}
    return ViTClassifier(**{**tiny, **settings})
