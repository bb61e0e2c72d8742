"""Shared fixtures: one Ray cluster for every end-to-end test, and a way to run train.py for real.

Starting Ray costs ~10 s here, so end-to-end tests join one cluster started once per session
with `ray start --head` (which also exercises `ray.address=`). Tests that must prove the
in-process local start do so by leaving ray.address unset.
"""

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The test cluster's token (Ray's token authentication): one per session, handed to the cluster and
# every client through the environment. `ray start` refuses to create one itself, and a token file
# in ~/.ray would exist only if some earlier local ray.init happened to write it.
RAY_AUTH_TOKEN = secrets.token_hex(32)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env() -> dict:
    env = dict(os.environ)
    # RAY_AUTH_MODE=token: Ray sends its token to an explicitly named cluster address only when
    # told to, as a user joining a `ray start` cluster by address must also do.
    env.update(
        WANDB_MODE="offline", WANDB_SILENT="true", RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
        RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=RAY_AUTH_TOKEN,
    )
    env.pop("WANDB_API_KEY", None)
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A 2-CPU Ray head node for the session; yields its address. Only this node is stopped."""
    port, dashboard_port = _free_port(), _free_port()
    cmd = [
        str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
        f"--port={port}", f"--dashboard-port={dashboard_port}", f"--ray-client-server-port={_free_port()}",
        "--num-cpus=2", "--num-gpus=0", "--disable-usage-stats",
    ]
    log_path = tmp_path_factory.mktemp("ray") / "ray_start.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=base_env(), start_new_session=True)
    try:
        deadline = time.time() + 120
        while "Ray runtime started" not in log_path.read_text():
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"the test Ray cluster did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.5)
        # The head listens on the node's address, which `ray start` prints for joining nodes.
        yield re.search(r"ray start --address='([^']+)'", log_path.read_text()).group(1)
    finally:
        stop_process_tree(proc)


def stop_process_tree(proc: subprocess.Popen) -> None:
    """Stop `ray start` and everything it spawned (GCS, raylet, dashboard and their agents), by pid:
    only this session's cluster, never another Ray on the machine."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=10)
    for p in alive:
        p.kill()


def run_train(*overrides: str, outputs: Path, address: str = None, timeout: int = 600, env: dict = None):
    """Run `python train.py` as a user would; returns the CompletedProcess."""
    flags = [o for o in overrides if o.startswith("-")]
    rest = [o for o in overrides if not o.startswith("-")]
    args = [sys.executable, str(REPO / "train.py"), *flags, f"paths.outputs={outputs}", *rest]
    if address:
        args.append(f"ray.address={address}")
    return subprocess.run(
        args, cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**base_env(), **(env or {})}
    )


def run_dirs(outputs: Path, kind: str = "runs") -> list:
    return sorted(p.parent for p in Path(outputs, kind).glob("**/summary.json"))


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests skip cleanly on machines without CUDA (CI has none)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
