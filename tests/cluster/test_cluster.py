"""raydra.cluster.ray_cluster: the local Ray a run starts for itself, and what a run on a one-node cluster leaves out."""

import json
import subprocess
import sys

import pytest
from helpers import own_local_ray_env

# Starts a local Ray through raydra.cluster.ray_cluster.connect, told it has no use for the dashboard, and says
# whether raydra pointed Ray's processes at a State API and how many of the dashboard's module
# processes run. (With the dashboard, as by default, the State API answers: test_private_apis's
# helper-actor test asks it.)
LOCAL_RAY = """
import glob, json, os, re, sys, time
import psutil
from raydra.cluster.ray_cluster import connect

connect(None, 1, False, dashboard=False)
# The dashboard's head logs how many module processes it starts ("Loaded N subprocess modules")
# before it starts them: wait for that line (its logs are under RAY_TMPDIR), then look for them.
deadline, loaded = time.time() + 60, None
while loaded is None:
    if time.time() > deadline:
        sys.exit("the dashboard's head never said which module processes it starts")
    time.sleep(0.1)
    text = "".join(open(path).read() for path in glob.glob(os.path.join(os.environ["RAY_TMPDIR"], "ray", "session_latest", "logs", "dashboard.log")))
    loaded = re.search(r"Loaded (\\d+) subprocess modules", text)
modules = [p for p in psutil.Process().children(recursive=True) if "ray-dashboard-" in " ".join(p.cmdline())]
print("LOADED", loaded.group(1))
# Every address this Ray's processes listen on, and the mode of the token it was started with.
mine = {p.pid for p in [psutil.Process(), *psutil.Process().children(recursive=True)]}
listening = sorted({c.laddr.ip for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid in mine})
token_mode = oct(os.stat(os.path.expanduser("~/.ray/auth_token")).st_mode & 0o777)
print(json.dumps({"state_api": os.environ.get("RAY_API_SERVER_ADDRESS"), "dashboard_modules": len(modules), "listening": listening, "token_mode": token_mode}))
"""


@pytest.mark.e2e
def test_a_local_ray_for_a_run_whose_process_ends_with_it_starts_no_dashboard(tmp_path):
    """Only Ray Train's placement-group cleaner asks the dashboard's State API, and such a run starts
    no cleaner (fit.fit_and_record's process_ends_with_run): its processes took ~1 s of the start.
    The local Ray is reachable from this machine alone: every process of it listens on the loopback
    address, and the token raydra made for it (a home without one) is readable by its user only."""
    env = {**own_local_ray_env(), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", LOCAL_RAY], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert {k: seen[k] for k in ("state_api", "dashboard_modules")} == {"state_api": None, "dashboard_modules": 0}
    assert "LOADED 0" in done.stdout  # the head itself chose none, so none can start later either
    assert seen["listening"] and all(ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for ip in seen["listening"]), seen["listening"]
    assert seen["token_mode"] == "0o600"


# Joins a cluster through raydra.cluster.ray_cluster.connect and says what Ray Train's preemption-watcher
# switch is for the runs this process starts.
JOIN = """
import os, sys
from raydra.cluster.ray_cluster import connect

connect(sys.argv[1], None, False)
print("WATCHER", os.environ.get("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"))
"""


@pytest.mark.e2e
def test_runs_on_a_cluster_of_one_node_the_drivers_own_start_no_preemption_watcher(ray_cluster):
    """A drain of the only node ends the driver, the controller and the workers at once, so Ray
    Train's watcher (a process per run) has nothing to act on. (On a cluster of several nodes the
    watcher runs: test_multinode.)"""
    from helpers import base_env

    done = subprocess.run([sys.executable, "-c", JOIN, ray_cluster], env=base_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WATCHER 0" in done.stdout
    # A value the user set wins.
    env = {**base_env(), "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1"}
    done = subprocess.run([sys.executable, "-c", JOIN, ray_cluster], env=env, capture_output=True, text=True, timeout=120)
    assert "WATCHER 1" in done.stdout, done.stderr[-3000:]


def test_a_head_is_started_once_it_has_printed_the_address_nodes_join(tmp_path):
    # `ray start --head` prints "Ray runtime started" a few lines before the address (a read between
    # the two ended a SLURM job's start in CI): a stand-in that pauses between them.
    from raydra.cluster import ray_node

    log = tmp_path / "head.log"
    script = "echo '--- Ray runtime started. ---'; sleep 1; echo \"  ray start --address='192.0.2.7:6380'\"; sleep 60"
    with log.open("w") as out:
        head = subprocess.Popen(["sh", "-c", script], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert ray_node.wait_head_started(head, log, timeout=20) == "192.0.2.7:6380"
    finally:
        head.kill()
        head.wait()


def test_the_ports_handed_out_for_ray_nodes_never_repeat():
    """Each port `ray start` is given must differ from every other it is given: one process picks
    them all (a head takes nine), and the kernel hands a released port out again (2000 plain
    picks here repeated 131 and 152 times)."""
    from raydra.cluster import ray_node

    ports = [ray_node.free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    flags = ray_node.head_port_flags(ray_node.free_port()) + ray_node.port_flags()
    assert len({flag.split("=")[1] for flag in flags}) == len(flags)


def test_a_port_ray_takes_by_default_is_never_handed_out(monkeypatch):
    """A head's dashboard was handed 52365, the port its own dashboard agent takes by default, and
    the head refused to start (the suite's session cluster, once): Ray's default ports are skipped."""
    from raydra.cluster import ray_node

    kernel = iter([52365, 8265, 6379, 10001, 41234])

    class Socket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(kernel)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(ray_node.socket, "socket", Socket)
    monkeypatch.setattr(ray_node, "_handed_out", set())
    assert ray_node.free_port() == 41234
