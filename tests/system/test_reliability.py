"""Real faults against real runs: a worker SIGKILLed mid-run, a driver stopped with SIGTERM and
resumed, and the refusals that keep resume= from retraining or mixing runs. No mocks: the runs are
`python train.py` on the session Ray cluster with 2 CPU workers."""

import os
import signal
import statistics
from pathlib import Path

import psutil
import pytest
import yaml
from helpers import (
    EPOCHS,
    EVERY_STEP,
    RUN,
    assert_wandb_holds_the_run,
    epochs_with_val,
    ledger_of,
    logged_steps,
    resumed_at,
    run_train,
    start_train,
    summary_of,
    tensorboard_of,
    wait_for_checkpoint,
    worker_pids,
)
from probe import step_times

from raydra.records.checkpoints import checkpoint_meta

EVERY_N_STEPS = 25
SECRET = "s3cr3t-value-9f2c"


@pytest.mark.e2e
def test_a_worker_killed_after_a_mid_epoch_checkpoint_resumes_inside_the_epoch_on_the_same_batches(ray_cluster, reference, tmp_path):
    # 40 steps an epoch: every checkpoint but the last falls inside an epoch.
    driver = start_train(
        *EVERY_STEP,
        "failure.max_failures=1",
        f"checkpoint.every_n_steps={EVERY_N_STEPS}",
        "logger=[csv,wandb,tensorboard]",
        "+callbacks.step_times._target_=tests.probe.StepTimes",
        outputs=tmp_path,
        address=ray_cluster,
    )
    run_dir = wait_for_checkpoint(tmp_path, driver)
    first_group = worker_pids(run_dir)
    _kill_worker(first_group[0])
    out, _ = driver.communicate(timeout=300)
    assert driver.returncode == 0, out

    summary = summary_of(run_dir)
    assert summary["status"] == "completed"
    assert summary["epochs_completed"] == EPOCHS and summary["global_step"] == reference["global_step"]
    steps_per_epoch = reference["global_step"] // EPOCHS
    epoch, batch, of, step = resumed_at(run_dir)
    assert of == steps_per_epoch and step % EVERY_N_STEPS == 0 and 0 < batch < of
    assert step == epoch * steps_per_epoch + batch
    # Each epoch validated once, and every logged step once, in order: none trained twice or skipped.
    assert epochs_with_val(run_dir) == list(range(EPOCHS))
    assert logged_steps(run_dir) == logged_steps(Path(reference["run_dir"]))
    # TensorBoard's reader sees the same: one directory, every step once (what the killed group
    # logged after its checkpoint is purged), and each epoch's validation once.
    scalars, _ = tensorboard_of(run_dir)
    assert [step for step, _ in scalars["train/loss_step"]] == logged_steps(run_dir)
    assert len(scalars["val/acc"]) == EPOCHS
    # The rest of the interrupted epoch trained on the batches an uninterrupted run trains on, in
    # the same order, with the same RNG: the same weights, so the same validation loss.
    assert summary["metrics"]["final"]["val/loss"] == pytest.approx(reference["metrics"]["final"]["val/loss"], rel=1e-4)
    assert summary["metrics"]["final"]["val/acc"] == pytest.approx(reference["metrics"]["final"]["val/acc"], abs=1e-6)
    # Mid-epoch checkpoints hold unvalidated weights: never the best one.
    assert checkpoint_meta(run_dir / summary["checkpoints"]["best"])["global_step"] % steps_per_epoch == 0
    # W&B holds every logged step once, what the killed worker had not flushed among them (the
    # restarted rank 0 logged it from metrics.csv), and says the run finished.
    segments = assert_wandb_holds_the_run(run_dir, "completed", retrained_from=step)
    assert len(segments) == 2
    # The compute ledger's lost work is what the killed group did after the checkpoint the restart
    # went back to, as its workers timed their own steps (tests.probe.StepTimes): to within one step
    # per worker (a step ended just before the kill may not have been reported).
    (restart,) = ledger_of(summary)["restarts"]
    timed = [step_times(run_dir, pid) for pid in first_group]
    reached = [max(t["end"]) for t in timed]
    redone = sum(t["end"][last] - t["start"][step + 1] for t, last in zip(timed, reached))
    cycle = statistics.median(b - a for a, b in zip(sorted(timed[0]["end"].values()), sorted(timed[0]["end"].values())[1:]))
    assert restart["from_step"] == step and max(reached) - 1 <= restart["reached_step"] <= max(reached)
    assert restart["lost_s"] == pytest.approx(redone, abs=max(0.05 * redone, len(first_group) * cycle)), (redone, cycle, reached)


@pytest.mark.e2e
def test_ctrl_c_stops_the_run_and_resume_latest_finishes_it_in_the_same_dir(ray_cluster, reference, tmp_path, train_here):
    """Ctrl-C (SIGINT), which Ray Train's fit answers with a handler of its own; SIGTERM on a Ray run
    is the sd_tiny test's below, and SLURM's scancel's."""
    driver = start_train(*RUN, outputs=tmp_path, address=ray_cluster)
    run_dir = wait_for_checkpoint(tmp_path, driver)
    workers = worker_pids(run_dir)
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=120)
    # The shell's code for Ctrl-C, and how to continue, as SIGTERM gives (Ray Train's own handler
    # ended the process with 0 and left summary.json "running").
    assert driver.returncode == 130, out
    assert f"continue it with resume={run_dir}" in out and "Traceback" not in out
    stopped = summary_of(run_dir)
    assert stopped["status"] == "interrupted", out
    assert (run_dir / stopped["checkpoints"]["last"]).is_file()
    # Nothing of the run keeps running on the cluster.
    _, alive = psutil.wait_procs([p for p in map(_process, workers) if p], timeout=30)
    assert not alive

    # Refusals, all before Ray is touched (in this process): a changed config, and a directory that is no run.
    changed = train_here(*RUN[:-1], "checkpoint.num_to_keep=2", "resume=latest", f"ray.address={ray_cluster}", outputs=tmp_path)
    assert changed.returncode == 1 and "checkpoint.num_to_keep: 1 -> 2" in changed.stdout + changed.stderr
    not_a_run = train_here(*RUN, f"resume={tmp_path}", f"ray.address={ray_cluster}", outputs=tmp_path)
    assert not_a_run.returncode == 1 and "is not a raydra run" in not_a_run.stdout + not_a_run.stderr

    resumed = run_train(*RUN, "resume=latest", outputs=tmp_path, address=ray_cluster)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["run_id"] == stopped["run_id"]
    assert summary["started_at"] == stopped["started_at"] and len(summary["resumed"]) == 1
    assert summary["epochs_completed"] == EPOCHS and summary["global_step"] == reference["global_step"]
    assert epochs_with_val(run_dir) == list(range(EPOCHS))
    assert summary["metrics"]["final"]["val/acc"] == pytest.approx(reference["metrics"]["final"]["val/acc"], abs=0.03)

    # A finished run is not trained again.
    again = train_here(*RUN, "resume=latest", f"ray.address={ray_cluster}", outputs=tmp_path)
    assert again.returncode == 1 and "already completed" in again.stdout + again.stderr


# sd_tiny as small as it runs: 16 steps an epoch on 2 workers, a random VAE (no fitting), 2-step
# samples, no pipeline export. Three epochs leave two to interrupt after the first checkpoint.
SD_RUN = (
    "experiment=sd_tiny",
    "data.num_samples=64",
    "data.val_samples=4",
    "data.batch_size=4",
    "trainer.max_epochs=3",
    "model.parts.vae_fit.steps=0",
    "model.sample_steps=2",
    "model.export_pipeline=false",
    "checkpoint.num_to_keep=1",
)


@pytest.mark.e2e
def test_an_sd_tiny_run_resumes_after_sigterm_and_no_secret_reaches_its_files(ray_cluster, tmp_path):
    """sd_tiny's config holds model.parts.tokenizer, a key that names no secret: it is recorded as
    it is, so resume=latest finds the config unchanged. The secrets of the environment, and one set
    through Hydra's env_set (an override Hydra records, outside what resume= compares), reach no
    file either invocation wrote."""
    secrets = {"WANDB_API_KEY": "wandb-" + SECRET, "AWS_SECRET_ACCESS_KEY": "aws-" + SECRET}
    planted = "hf_" + SECRET[::-1]
    overrides = (*SD_RUN, f"+hydra.job.env_set.HF_TOKEN={planted}")
    env = {**secrets, "HF_HUB_OFFLINE": "1"}
    driver = start_train(*overrides, outputs=tmp_path, address=ray_cluster, env=env)
    run_dir = wait_for_checkpoint(tmp_path, driver)
    workers = worker_pids(run_dir)
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=120)
    # SIGTERM ends a Ray run as Ctrl-C does: recorded, the command that continues it, code 130.
    assert driver.returncode == 130 and f"continue it with resume={run_dir}" in out, out
    stopped = summary_of(run_dir)
    assert stopped["status"] == "interrupted", out
    # Nothing of the run keeps running on the cluster.
    _, alive = psutil.wait_procs([p for p in map(_process, workers) if p], timeout=30)
    assert not alive
    # W&B holds what metrics.csv holds, though the stopped worker could not flush it, and says how the run ended.
    assert_wandb_holds_the_run(run_dir, "interrupted")
    recorded = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert recorded["model"]["parts"]["tokenizer"] == {"vocab_size": 1000, "max_length": 16}
    # Hydra recorded the planted override, and the driver masked it there.
    assert "+hydra.job.env_set.HF_TOKEN=***" in (run_dir / ".hydra" / "hydra.yaml").read_text()

    resumed = run_train(*overrides, "resume=latest", outputs=tmp_path, address=ray_cluster, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["run_id"] == stopped["run_id"]
    assert len(summary["resumed"]) == 1 and summary["epochs_completed"] == 3 and summary["global_step"] == 3 * 16
    # On two Ray workers, rank 0 drew each epoch's samples into the run directory, across the stop.
    assert summary["world_size"] == 2
    assert [p.name for p in sorted((run_dir / "samples").glob("epoch_*.png"))] == [f"epoch_{e:03d}.png" for e in range(3)]
    epoch, batch, _, step = resumed_at(run_dir)
    assert epoch >= 1 and batch == 0  # from the checkpoint the stopped run left, not from scratch
    assert_wandb_holds_the_run(run_dir, "completed", retrained_from=step)

    # Every file of both invocations (the run dir, and the resuming one's own Hydra record and
    # driver.log), W&B's offline files among them, and the consoles.
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {"config.yaml", "hydra.yaml", "overrides.yaml", "driver.log", "summary.json"} <= {p.name for p in written}
    assert len(list(tmp_path.glob("runs/*/*/.hydra/hydra.yaml"))) == 2
    assert any(p.suffix == ".wandb" for p in written)
    for secret in (*secrets.values(), planted):
        assert secret not in out + resumed.stdout + resumed.stderr
        for path in written:
            assert secret.encode() not in path.read_bytes(), f"{path} holds a secret"


def _process(pid: int):
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _kill_worker(pid: int) -> None:
    process = _process(pid)
    assert process and "RayTrainWorker" in " ".join(process.cmdline()), f"pid {pid} is not a Ray Train worker"
    os.kill(pid, signal.SIGKILL)


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
