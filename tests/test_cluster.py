"""raydra.cluster: the local Ray a run starts for itself."""

import json
import subprocess
import sys
import tempfile

from conftest import base_env

# Starts a local Ray through raydra.cluster.connect, with or without its dashboard, and says whether
# Ray's State API answers where raydra points Ray's processes (RAY_API_SERVER_ADDRESS) and how many
# of the dashboard's module processes run.
LOCAL_RAY = """
import json, os, sys, time
import psutil
from raydra.cluster import connect

connect(None, 1, False, dashboard=sys.argv[1] == "1")
answers = False
if os.environ.get("RAY_API_SERVER_ADDRESS"):
    from ray.util.state import list_actors

    list_actors(limit=1)  # as Ray Train's cleaner asks it: through RAY_API_SERVER_ADDRESS
    answers = True
time.sleep(2)  # the dashboard's module processes, if any, are up by now
modules = [p for p in psutil.Process().children(recursive=True) if "ray-dashboard-" in " ".join(p.cmdline())]
print(json.dumps({"state_api": answers, "dashboard_modules": len(modules)}))
"""


def _local_ray(dashboard: bool) -> dict:
    env = {k: v for k, v in base_env().items() if not k.startswith("RAY_AUTH") and k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rayc-", dir="/tmp")  # Ray's socket paths must stay short
    done = subprocess.run(
        [sys.executable, "-c", LOCAL_RAY, "1" if dashboard else "0"], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_local_ray_serves_the_state_api_ray_trains_cleaner_asks_unless_told_it_has_no_use_for_it():
    """A local Ray for runs that take turns in one process (Hydra's basic launcher, Tune) keeps its
    dashboard: Ray Train's placement-group cleaner asks its State API. One for a run whose process
    ends with it starts none of the dashboard's processes."""
    with_it, without = _local_ray(dashboard=True), _local_ray(dashboard=False)
    assert with_it["state_api"] and with_it["dashboard_modules"] > 0
    assert without == {"state_api": False, "dashboard_modules": 0}
