"""Local mode, `scale.num_workers=0`: the same worker function in the driver's own process, no Ray.

What a researcher debugging relies on: the run directory is the one a Ray run leaves (summary.json,
metrics.csv, checkpoints that load and resume), Ctrl-C/SIGTERM records the run as interrupted, and
what needs workers is refused by name.
"""

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO, base_env, held_at_last_epoch, run_dirs, run_train, running_best, summary_of, tensorboard_of

from raydra.worker.checkpoint_report import LocalCheckpoints

LOCAL = ("scale.num_workers=0", "logger=csv")


def _val_epochs(run_dir: Path) -> list:
    return [int(r["epoch"]) for r in csv.DictReader((run_dir / "metrics.csv").open()) if r.get("val/acc")]


@pytest.mark.e2e
def test_a_local_mode_run_leaves_the_run_directory_a_ray_run_leaves_without_starting_ray(train_here, tmp_path):
    done = train_here(
        "scale.num_workers=0", "logger=[csv,tensorboard]", "trainer.max_epochs=3", "checkpoint.num_to_keep=1", outputs=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path)
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["epochs_completed"] == 3 and summary["world_size"] == 0
    assert _val_epochs(run_dir) == [0, 1, 2]
    assert summary["metrics"]["best"]["val/acc"] == max(
        float(r["val/acc"]) for r in csv.DictReader((run_dir / "metrics.csv").open()) if r.get("val/acc")
    )
    assert "test/acc" in summary["metrics"]["final"]

    # Checkpoints where Ray keeps them: the best one (num_to_keep=1) and the latest, complete.
    kept = sorted(run_dir.glob("checkpoints/*/checkpoint_*/checkpoint.ckpt"))
    assert 1 <= len(kept) <= 2 and not list(run_dir.glob("checkpoints/*/.checkpoint_*"))
    # Named relative to the run directory, so a copied or moved run finds its own.
    assert run_dir / summary["checkpoints"]["best"] in kept and run_dir / summary["checkpoints"]["last"] == kept[-1]
    from helpers import digits_test_accuracy

    import raydra

    module = raydra.load(run_dir, "last")
    assert digits_test_accuracy(module) == pytest.approx(summary["metrics"]["final"]["test/acc"], abs=1e-6)

    # The Hugging Face export, the conv stem's code in it: transformers, given scikit-learn's own
    # images, predicts what raydra.load's best module predicts on a batch of the test split.
    import torch
    from helpers import digits_test_images, hf_loaded

    best = raydra.load(run_dir)
    model, processor = hf_loaded(run_dir / "hf", trust_remote_code=True)
    seen, raw = digits_test_images()
    pixels = processor(images=raw[:64, None], return_tensors="pt")["pixel_values"]
    assert torch.equal(pixels, seen[:64]) and model.config.id2label[7] == "7"
    with torch.no_grad():
        assert torch.allclose(model(pixel_values=pixels).logits, best(seen[:64]), atol=1e-5)

    # No Ray: nothing started one, and the console is the driver's own, without worker prefixes.
    driver_log = (run_dir / "driver.log").read_text()
    assert "local mode" in driver_log and "Ray with" not in driver_log and not (run_dir / "logs" / "ray.log").exists()
    assert "epoch 3/3" in done.stdout and "[raydra]" not in done.stdout and "Running in local mode" not in done.stdout
    assert "GPU available" in (run_dir / "logs" / "worker_0.log").read_text()  # Lightning's notices: the file only
    assert summary["startup"]["to_first_step_s"] > 0

    # Each logger's hyperparameters are the run's config, nested, and nothing else: the digits data
    # module's save_hyperparameters() (batch_size, num_workers, ...) is not added again at the top.
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    hparams = yaml.safe_load((run_dir / "hparams.yaml").read_text())
    assert set(hparams) == set(config) and hparams["data"]["batch_size"] == config["data"]["batch_size"]
    scalars, tensorboard_hparams = tensorboard_of(run_dir)
    assert {key.split("/")[0] for key in tensorboard_hparams} <= set(config)  # (empty nodes, callbacks: {}, are left out)
    assert "data/num_workers" in tensorboard_hparams and "scale/num_workers" in tensorboard_hparams
    assert "num_workers" not in tensorboard_hparams and "batch_size" not in tensorboard_hparams
    # TensorBoard's hp_metric is the best val/acc so far, at each epoch's validation step.
    val_acc = scalars["val/acc"]
    assert [step for step, _ in scalars["hp_metric"]] == [step for step, _ in val_acc] and len(val_acc) == 3
    assert [value for _, value in scalars["hp_metric"]] == running_best([value for _, value in val_acc], "max")
    assert scalars["hp_metric"][-1][1] == pytest.approx(summary["metrics"]["best"]["val/acc"], abs=1e-6)


@pytest.mark.e2e
def test_sigterm_in_local_mode_records_the_run_interrupted_and_resume_finishes_it_exactly(tmp_path):
    # Held at its last epoch (helpers.held_at_last_epoch) so that the signal finds it training.
    epochs, held = 4, held_at_last_epoch(tmp_path / "release")
    local = ("scale.num_workers=0", "logger=[csv,tensorboard]")
    args = [sys.executable, str(REPO / "train.py"), f"paths.outputs={tmp_path}", *local, f"trainer.max_epochs={epochs}", *held]
    driver = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=base_env())
    deadline = time.time() + 120
    while not list(tmp_path.glob("runs/*/*/checkpoints/*/checkpoint_*/checkpoint.ckpt")):
        assert driver.poll() is None and time.time() < deadline, driver.communicate()[0]
        time.sleep(0.2)
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=60)
    # Lightning turns the interrupt into its own sys.exit(1): the driver must still get to record it.
    assert driver.returncode == 130, out
    (run_dir,) = run_dirs(tmp_path)
    stopped = summary_of(run_dir)
    assert stopped["status"] == "interrupted" and (run_dir / stopped["checkpoints"]["last"]).is_file(), out
    assert f"resume={run_dir}" in out and "Traceback" not in out

    (tmp_path / "release").touch()
    resumed = run_train(*local, f"trainer.max_epochs={epochs}", *held, "resume=latest", outputs=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["run_id"] == stopped["run_id"] and summary["epochs_completed"] == epochs
    assert "resumed from" in (run_dir / "logs" / "worker_0.log").read_text()
    assert _val_epochs(run_dir) == list(range(epochs))  # every epoch validated once: none retrained, none lost
    # TensorBoard too: both attempts in the run's one directory, each step once, hp_metric the best so far.
    scalars, _ = tensorboard_of(run_dir)
    steps = [step for step, _ in scalars["train/loss_step"]]
    assert steps == sorted(set(steps)) and len(scalars["val/acc"]) == epochs
    assert [step for step, _ in scalars["hp_metric"]] == [step for step, _ in scalars["val/acc"]]
    assert [value for _, value in scalars["hp_metric"]] == running_best([value for _, value in scalars["val/acc"]], "max")


@pytest.mark.e2e
def test_fast_dev_run_in_local_mode_runs_a_batch_of_each_split_and_stops(train_here, tmp_path):
    done = train_here(*LOCAL, "trainer.fast_dev_run=true", outputs=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = summary_of(run_dirs(tmp_path)[0])
    assert summary["status"] == "completed" and summary["global_step"] == 1 and "test/acc" in summary["metrics"]["final"]
    assert "epoch 1/1" in done.stdout


@pytest.mark.parametrize(
    "override, named",
    [("strategy=fsdp", "strategy=fsdp"), ("tune=random", "Tune sweep"), ("paths.storage=/tmp/elsewhere", "paths.storage")],
)
def test_what_needs_workers_is_refused_in_local_mode_with_one_sentence(train_here, tmp_path, override, named):
    done = train_here(*LOCAL, override, outputs=tmp_path)
    assert done.returncode == 1
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("error:")]
    assert "scale.num_workers=0 (local mode)" in line and named in line


def _ckpt(directory: Path, name: str) -> str:
    path = directory / name
    path.mkdir(parents=True)
    (path / "checkpoint.ckpt").write_text(name)
    return str(path)


def test_local_checkpoints_keep_the_best_by_the_monitor_and_the_latest(tmp_path):
    keeper = LocalCheckpoints(tmp_path / "ckpts", num_to_keep=2, monitor="val/acc", mode="max")
    for i, acc in enumerate([0.5, 0.9, 0.7, float("nan"), 0.6]):
        keeper.keep(_ckpt(tmp_path / "scratch", str(i)), {"val/acc": acc, "step": i})
    record = keeper.record()
    kept = {Path(c["path"], "checkpoint.ckpt").read_text(): c["metrics"]["val/acc"] for c in record["checkpoints"]}
    # The two best (0.9, 0.7) and the latest (0.6); the unvalidated NaN never outranks a score.
    assert kept == {"1": 0.9, "2": 0.7, "4": 0.6}
    assert Path(record["last"], "checkpoint.ckpt").read_text() == "4"
    assert len(record["history"]) == 5 and sorted(p.name.startswith("checkpoint_") for p in (tmp_path / "ckpts").iterdir()) == [True] * 3


def test_a_fit_leaves_the_run_spec_as_it_was_made(tmp_path):
    """The spec is resolved once and never written into: what the fit learns (the restore point,
    the outcome) comes back as values, so a local-mode fit leaves it equal to a copy taken before."""
    import copy
    import dataclasses

    from helpers import composed

    from raydra.run import fit, recording, resolve

    cfg = composed(
        *LOCAL, f"paths.outputs={tmp_path}", "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=2"
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    spec = resolve.resolve(cfg, run_dir, "spec_run")
    before = copy.deepcopy(spec)
    record = recording.record_start(spec, recording.new_summary(cfg, run_dir, "spec_run", []))
    record = fit.fit_and_record(spec, record, time.time())
    assert record.status == "completed" and spec == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.place = None
    assert (type(spec.trainer).__name__, type(spec.strategy).__name__) == ("TrainerConfig", "DDPConfig")


def test_a_run_that_a_driver_trains_is_not_taken_by_a_second_one(train_here, tmp_path, monkeypatch):
    """Two drivers given the same resume= both trained the run. The one that trains it holds it
    (run_record.hold, the kernel's lock, gone with its process however it ends): the second is told
    which process has it, before it writes anything; once that one is gone, the same command resumes."""
    import json
    import os

    from raydra.records import lock

    quick = (*LOCAL, "trainer.max_epochs=2", "trainer.limit_train_batches=2", "trainer.limit_val_batches=2")
    assert train_here(*quick, outputs=tmp_path).returncode == 0
    (run_dir,) = run_dirs(tmp_path)
    # As a driver whose machine went down mid-run would have left it.
    record = summary_of(run_dir)
    (run_dir / "summary.json").write_text(json.dumps({**record, "status": "interrupted"}))
    before = (run_dir / "summary.json").read_bytes()

    release = lock.hold(run_dir, "the first driver")  # the first driver, still training it
    # A second driver waits this long for the first to let go (30 s by default: a driver that has
    # recorded its run interrupted still leaves Ray for a few seconds).
    monkeypatch.setattr("raydra.run.driver.RUN_LOCK_WAIT_S", 1.0)
    try:
        second = train_here(*quick, f"resume={run_dir}", outputs=tmp_path)
    finally:
        release()
    assert second.returncode == 1
    assert f"{run_dir} is held by another driver (pid {os.getpid()} on " in second.stdout  # said while it waits
    assert f"error: resume={run_dir}: {run_dir} is being trained by another driver (pid {os.getpid()} on " in second.stdout
    assert (run_dir / "summary.json").read_bytes() == before  # the run's record as it was

    again = train_here(*quick, f"resume={run_dir}", outputs=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert summary_of(run_dir)["status"] == "completed" and len(summary_of(run_dir)["resumed"]) == 1
