"""Real faults against real runs: a worker SIGKILLed mid-run, a driver stopped with SIGTERM and
resumed, and the refusals that keep resume= from retraining or mixing runs. No mocks: the runs are
`python train.py` on the session Ray cluster with 2 CPU workers."""

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO, base_env, run_dirs, run_train, summary_of

EPOCHS = 4
RUN = ("experiment=vit_digits_smoke", f"trainer.max_epochs={EPOCHS}", "trainer.test=false", "checkpoint.num_to_keep=1")
SECRET = "s3cr3t-value-9f2c"
WORKER_LINE = re.compile(r"\(RayTrainWorker pid=(\d+)\)")


@pytest.fixture(scope="module")
def reference(ray_cluster, tmp_path_factory):
    """The same run without faults: what a faulted run must end up matching."""
    outputs = tmp_path_factory.mktemp("reference")
    done = run_train(*RUN, outputs=outputs, address=ray_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(outputs)
    return summary_of(run_dir)


@pytest.mark.e2e
def test_a_killed_worker_restarts_from_the_last_checkpoint_and_loses_no_epoch(ray_cluster, reference, tmp_path):
    driver = _start(*RUN, "failure.max_failures=1", f"tags=[{SECRET}]", outputs=tmp_path, address=ray_cluster,
                    env={"RAYDRA_TEST_TOKEN": SECRET})
    run_dir = _wait_for_checkpoint(tmp_path, driver)
    victim = _worker_pids(run_dir)[0]
    _kill_worker(victim)
    out, _ = driver.communicate(timeout=300)
    assert driver.returncode == 0, out

    summary = summary_of(run_dir)
    assert summary["status"] == "completed"
    assert summary["epochs_completed"] == EPOCHS and summary["global_step"] == reference["global_step"]
    # A new worker group trained on: other pids than the one killed.
    assert set(_worker_pids(run_dir)) - {victim}
    assert _epochs_with_val(run_dir) == list(range(EPOCHS))  # each epoch once: none lost, none repeated
    assert summary["metrics"]["final"]["val/acc"] == pytest.approx(reference["metrics"]["final"]["val/acc"], abs=0.03)

    # The secret from the environment reached no file the run wrote, nor the console.
    assert SECRET not in out
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"{path} holds the secret"


@pytest.mark.e2e
def test_sigterm_stops_the_run_and_resume_latest_finishes_it_in_the_same_dir(ray_cluster, reference, tmp_path):
    driver = _start(*RUN, outputs=tmp_path, address=ray_cluster)
    run_dir = _wait_for_checkpoint(tmp_path, driver)
    workers = _worker_pids(run_dir)
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode != 0
    stopped = summary_of(run_dir)
    assert stopped["status"] == "interrupted", out
    assert Path(stopped["checkpoints"]["last"]).is_file()
    # Nothing of the run keeps running on the cluster.
    _, alive = psutil.wait_procs([p for p in map(_process, workers) if p], timeout=30)
    assert not alive

    # Refusals, all before Ray is touched: a changed config, and a directory that is no run.
    changed = run_train(*RUN[:-1], "checkpoint.num_to_keep=2", "resume=latest", outputs=tmp_path, address=ray_cluster)
    assert changed.returncode == 1 and "checkpoint.num_to_keep: 1 -> 2" in changed.stdout + changed.stderr
    not_a_run = run_train(*RUN, f"resume={tmp_path}", outputs=tmp_path, address=ray_cluster)
    assert not_a_run.returncode == 1 and "is not a raydra run" in not_a_run.stdout + not_a_run.stderr

    resumed = run_train(*RUN, "resume=latest", outputs=tmp_path, address=ray_cluster)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["run_id"] == stopped["run_id"]
    assert summary["started_at"] == stopped["started_at"] and len(summary["resumed"]) == 1
    assert summary["epochs_completed"] == EPOCHS and summary["global_step"] == reference["global_step"]
    assert _epochs_with_val(run_dir) == list(range(EPOCHS))
    assert summary["metrics"]["final"]["val/acc"] == pytest.approx(reference["metrics"]["final"]["val/acc"], abs=0.03)

    # A finished run is not trained again.
    again = run_train(*RUN, "resume=latest", outputs=tmp_path, address=ray_cluster)
    assert again.returncode == 1 and "already completed" in again.stdout + again.stderr


def _start(*overrides, outputs, address, env=None):
    args = [sys.executable, str(REPO / "train.py"), f"paths.outputs={outputs}", *overrides, f"ray.address={address}"]
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**base_env(), **(env or {})})


def _wait_for_checkpoint(outputs: Path, driver: subprocess.Popen, timeout: float = 240) -> Path:
    """The run dir once its first checkpoint is reported and a worker pid is in its logs."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert driver.poll() is None, driver.communicate()[0]
        for ckpt in outputs.glob("runs/*/*/checkpoints/*/checkpoint_*/checkpoint.ckpt"):
            run_dir = ckpt.parents[3]
            if _worker_pids(run_dir):
                return run_dir
        time.sleep(0.2)
    driver.kill()
    pytest.fail("the run reported no checkpoint in time")


def _worker_pids(run_dir: Path) -> list:
    log = run_dir / "logs" / "ray.log"
    text = log.read_text() if log.exists() else ""
    return list(dict.fromkeys(int(pid) for pid in WORKER_LINE.findall(text)))


def _process(pid: int):
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _kill_worker(pid: int) -> None:
    process = _process(pid)
    assert process and "RayTrainWorker" in " ".join(process.cmdline()), f"pid {pid} is not a Ray Train worker"
    os.kill(pid, signal.SIGKILL)


def _epochs_with_val(run_dir: Path) -> list:
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    return [int(r["epoch"]) for r in rows if r.get("val/acc")]


def test_redact_masks_secret_env_values_keys_and_key_overrides(monkeypatch):
    from raydra.redact import redact

    monkeypatch.setenv("HF_TOKEN", "hf_abcdef123")
    record = {
        "overrides": ["trainer.max_epochs=3", "+logger.wandb.api_key=abc123secret", "tags=[hf_abcdef123]"],
        "logger": {"wandb": {"password": "pw-987654", "project": "raydra"}},
        "error": "could not log in with hf_abcdef123",
    }
    assert redact(record) == {
        "overrides": ["trainer.max_epochs=3", "+logger.wandb.api_key=***", "tags=[***]"],
        "logger": {"wandb": {"password": "***", "project": "raydra"}},
        "error": "could not log in with ***",
    }
