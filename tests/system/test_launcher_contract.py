"""Hydra's launcher contract for `hydra/launcher=raydra`: Hydra's own three conformance suites
(tests/hydra_launcher_suites.py), run in a pytest process of their own on the session's cluster."""

import re
import subprocess
import sys

import pytest
from helpers import REPO, base_env

from raydra.records import jobs


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


APP = """
import os
from pathlib import Path

import hydra
from omegaconf import OmegaConf

OmegaConf.register_new_resolver("plus_one", lambda x: int(x) + 1)


@hydra.main(version_base=None, config_path=".", config_name="config")
def app(cfg):
    # Every time a job runs, a line in the file of its x: what a resumed multirun reruns shows there.
    with open(Path(os.environ["RUNS_DIR"]) / f"x{cfg.x}.txt", "a") as runs:
        runs.write("ran\\n")
    if str(cfg.x) == os.environ.get("FAIL_X"):
        raise RuntimeError(f"x={cfg.x} fails this time")
    return cfg.y


if __name__ == "__main__":
    app()
"""


@pytest.mark.e2e
def test_an_apps_multirun_keeps_its_completed_jobs_and_reruns_the_failed_one_when_resumed(ray_cluster, tmp_path):
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "config.yaml").write_text("x: 0\ny: ${plus_one:${x}}\n")
    runs = tmp_path / "runs"
    runs.mkdir()
    sweep_dir = tmp_path / "sweep"
    # A job is a Ray task: it has its Ray node's environment, plus what hydra.job.env_set gives it.
    args = [
        sys.executable,
        "app.py",
        "-m",
        "hydra/launcher=raydra",
        "x=1,2,3",
        f"+hydra.job.env_set.RUNS_DIR={runs}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    env = {**base_env(), "RAY_ADDRESS": ray_cluster}
    first = subprocess.run([*args, "+hydra.job.env_set.FAIL_X=2"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    out = first.stdout + first.stderr
    assert first.returncode == 1, out
    # Hydra reports the failed job's own exception, with its traceback from the job's process.
    assert "RuntimeError: x=2 fails this time" in out and "in app\n    raise RuntimeError" in out, out
    assert "1 of 3 jobs did not complete: #1 (x=2) failed" in first.stdout
    record = jobs.read(sweep_dir)
    assert [record.job(n).status for n in (0, 1, 2)] == ["completed", "failed", "completed"]
    assert [record.job(n).return_value for n in (0, 2)] == [2, 4]  # the script's resolver, in each job

    # Resumed: only the failed job runs again; the others are kept with their return values.
    again = subprocess.run([*args, "hydra.launcher.resume=true"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert {p.name: p.read_text().count("ran") for p in runs.iterdir()} == {"x1.txt": 1, "x2.txt": 2, "x3.txt": 1}
    assert "2 completed before, kept" in again.stdout
    record = jobs.read(sweep_dir)
    assert [(record.job(n).status, record.job(n).return_value) for n in (0, 1, 2)] == [("completed", 2), ("completed", 3), ("completed", 4)]

    # A job too large for any node is refused before any job starts.
    big = subprocess.run(
        [*args[:-1], f"hydra.sweep.dir={tmp_path / 'big'}", "hydra.launcher.cpus_per_job=3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert big.returncode == 1
    assert (
        "a job asks for {CPU: 3} (hydra.launcher.cpus_per_job, gpus_per_job, resources_per_job) but no node of the Ray cluster has that much"
        in big.stdout
    )
    assert {p.name: p.read_text().count("ran") for p in runs.iterdir()} == {"x1.txt": 1, "x2.txt": 2, "x3.txt": 1}
