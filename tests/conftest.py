"""The suite's fixtures and pytest hooks: one Ray cluster for every end-to-end test, a way to run
train.py inside this process, the S3 server and the private-disk cluster. Plain functions and
constants the tests share are in tests/helpers.py (importable as `helpers` from every folder: pytest
puts this directory on sys.path as it loads this file).

Starting Ray costs ~10 s here, so end-to-end tests join one cluster started once per session
with `ray start --head` (which also exercises `ray.address=`). Tests that must prove the
in-process local start do so by leaving ray.address unset.
"""

import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    EVERY_STEP,
    REPO,
    S3_ENV,
    PrivateDiskCluster,
    base_env,
    remove_own_ray_tmpdirs,
    run_dirs,
    run_train,
    short_temp_dir,
    start_node,
    start_private_node,
    summary_of,
    wait_node_started,
)

from raydra.cluster import ray_node
from raydra.testing import free_port, start_ray_head, start_s3_server, stop_process_tree, stop_ray_node


def pytest_sessionfinish(session, exitstatus):
    remove_own_ray_tmpdirs()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """Seconds per test file (set-up, call and tear-down, a shared fixture's start in the file that
    first asked for it), slowest first: where the suite's time budget goes, in every CI log. Last,
    after the per-test durations, so that the log's tail (what CI shows) holds it."""
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
    temp_dir = short_temp_dir("rayh-")
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
    tests/system/test_reliability.py and tests/system/test_preemption.py stop, kill and resume must end up
    matching. One run for both modules (~45 s here)."""
    outputs = tmp_path_factory.mktemp("reference")
    done = run_train(*EVERY_STEP, outputs=outputs, address=ray_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(outputs)
    return summary_of(run_dir)


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
    head_temp, worker_temp = short_temp_dir("rayp-"), short_temp_dir("rayw-")
    head_log = logs / "head.log"
    head = start_node(
        ["--head", *ray_node.head_port_flags(dashboard_port), *ray_node.port_flags(), "--num-cpus=0", f"--temp-dir={head_temp}"],
        head_log,
        env,
    )
    worker = None
    try:
        address = wait_node_started(head, head_log, "head", ray_node.wait_head_started)
        cluster = PrivateDiskCluster(address=address, outputs=outputs, worker_temp_dir=worker_temp, env=env)
        worker = start_private_node(cluster, num_cpus=2, temp_dir=worker_temp, log_path=logs / "worker.log")
        yield cluster
    finally:
        if worker is not None:
            stop_ray_node(worker)
        stop_ray_node(head)
        shutil.rmtree(worker_temp, ignore_errors=True)
        shutil.rmtree(head_temp, ignore_errors=True)
