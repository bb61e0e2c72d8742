"""raydra.cluster: the local Ray a run starts for itself."""

import json
import subprocess
import sys

from conftest import own_local_ray_env

# Starts a local Ray through raydra.cluster.connect, told it has no use for the dashboard, and says
# whether raydra pointed Ray's processes at a State API and how many of the dashboard's module
# processes run. (With the dashboard, as by default, the State API answers: test_private_apis's
# helper-actor test asks it.)
LOCAL_RAY = """
import json, os, time
import psutil
from raydra.cluster import connect

connect(None, 1, False, dashboard=False)
time.sleep(3)  # the dashboard's module processes, were any started, are up by now
modules = [p for p in psutil.Process().children(recursive=True) if "ray-dashboard-" in " ".join(p.cmdline())]
print(json.dumps({"state_api": os.environ.get("RAY_API_SERVER_ADDRESS"), "dashboard_modules": len(modules)}))
"""


def test_a_local_ray_for_a_run_whose_process_ends_with_it_starts_no_dashboard():
    """Only Ray Train's placement-group cleaner asks the dashboard's State API, and such a run starts
    no cleaner (fit.fit_and_record's process_ends_with_run): its processes took ~1 s of the start."""
    done = subprocess.run([sys.executable, "-c", LOCAL_RAY], env=own_local_ray_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"state_api": None, "dashboard_modules": 0}
