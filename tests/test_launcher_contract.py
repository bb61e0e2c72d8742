"""Hydra's launcher contract for `hydra/launcher=raydra`: Hydra's own three conformance suites
(tests/hydra_launcher_suites.py), run in a pytest process of their own on the session's cluster."""

import re
import subprocess
import sys

import pytest
from conftest import REPO, base_env


@pytest.mark.e2e
def test_hydras_launcher_conformance_suites_pass_against_the_raydra_launcher(ray_cluster, tmp_path):
    env = {**base_env(), "RAY_ADDRESS": ray_cluster}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(REPO / "tests" / "hydra_launcher_suites.py"),
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'suites'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-8000:]
    # Every test of the three suites ran and passed (21 in Hydra 1.3): none skipped or deselected.
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"=* ?21 passed in [\d.]+s.*", last), out[-3000:]
