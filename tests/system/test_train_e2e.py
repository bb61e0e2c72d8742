"""Real runs of `python train.py` on Ray with 2 CPU workers, checked through what they leave behind, and
the refusals a run gives before it starts Ray."""

import csv
import json
import time

import pytest
import yaml
from helpers import ledger_of, run_dirs, run_train, summary_of


@pytest.mark.e2e
def test_default_run_trains_the_digits_vit_and_leaves_a_self_describing_run_dir(ray_cluster, tmp_path):
    from helpers import LISTENING, store_address

    done = run_train(*LISTENING, outputs=tmp_path, address=ray_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path)
    summary = summary_of(run_dir)

    assert summary["status"] == "completed" and summary["error"] is None
    # The default recipe's promise (docs/performance.md): deterministic per seed on one machine, 0.9815
    # at seed 42 where it was measured, 0.9778 on the 2026-11-25 machine (the base commit too, with
    # either Lightning package): one test image of 270, float rounding on another CPU. At least 0.975.
    assert summary["metrics"]["final"]["test/acc"] >= 0.975
    assert summary["metrics"]["best"]["val/acc"] >= 0.95
    assert summary["epochs_completed"] == 30 and summary["world_size"] == 2
    assert summary["throughput"]["samples_per_s"] > 0
    assert summary["wall_time_s"] > 0 and summary["config_hash"].startswith("sha256:")
    # Where the time before the first step went, phase by phase, from the process's start: the
    # phases add up to it, and the workers' imports and Ray Train's start are among them.
    startup = summary["startup"]
    assert sum(p["s"] for p in startup["phases"]) == pytest.approx(startup["to_first_step_s"], abs=0.1)
    assert {"Ray Train sets up the worker group; the worker imports torch, Lightning, the model's libraries"} <= {
        p["phase"] for p in startup["phases"]
    }
    assert startup["worker_imports_s"] > 0
    assert 0 < startup["to_first_step_s"] < summary["wall_time_s"] + 10
    # Where the workers' time went: start-up is the phases above, on both workers; most of the rest
    # is training, and the closing summary says the goodput.
    ledger = ledger_of(summary)
    assert ledger["workers"] == 2 and ledger["buckets"]["startup"] == pytest.approx(2 * startup["to_first_step_s"], abs=0.05)
    assert ledger["buckets"]["productive"] > ledger["buckets"]["validation"] > 0 and ledger["buckets"]["test"] > 0
    assert ledger["buckets"]["lost"] == 0 and ledger["restarts"] == []
    assert f"goodput {ledger['buckets']['productive'] / ledger['allocated_s']:.0%}" in done.stdout + done.stderr
    assert {"ray", "torch", "lightning", "hydra-core"} <= set(summary["versions"])

    # What was asked: Hydra's record of the composed config and the overrides.
    asked = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert asked["model"]["_target_"] == "raydra.models.vit.ViTClassifier"
    assert f"ray.address={ray_cluster}" in yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())

    # Every logged metric by step and epoch.
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    val_acc = [float(r["val/acc"]) for r in rows if r.get("val/acc")]
    assert len(val_acc) == 30
    assert val_acc[-1] == pytest.approx(summary["metrics"]["final"]["val/acc"], abs=1e-6)
    assert any(r.get("train/samples_per_s") for r in rows)

    # Ray kept the best num_to_keep=2 checkpoints, plus the latest (to resume from) when it is not
    # among them, inside the run directory.
    kept = sorted(run_dir.glob("checkpoints/*/checkpoint_*/checkpoint.ckpt"))
    assert 2 <= len(kept) <= 3
    # Named relative to the run directory, so a copied or moved run finds its own.
    assert run_dir / summary["checkpoints"]["best"] in kept
    assert run_dir / summary["checkpoints"]["last"] in kept

    # The last checkpoint loads back into a plain module that scores what the run's test measured.
    from helpers import digits_test_accuracy

    import raydra

    module = raydra.load(run_dir, "last")
    assert digits_test_accuracy(module) == pytest.approx(summary["metrics"]["final"]["test/acc"], abs=1e-6)
    assert summary["strategy"]["name"] == "ddp" and len(summary["memory_per_worker"]) == 2

    # W&B ran offline, kept its files in the run dir, and its run file holds the logged values
    # (wandb stores each history value as the JSON text of the number).
    (wandb_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    recorded = wandb_file.read_bytes()
    assert b"val/acc" in recorded and b"test/acc" in recorded
    assert json.dumps(summary["metrics"]["final"]["val/acc"]).encode() in recorded
    assert "wandb sync" in done.stdout

    # The process group meets on the address of rank 0's node alone (a cluster's: not loopback).
    assert store_address(run_dir) == ray_cluster.rpartition(":")[0]

    # A quiet console: rank-0 progress and a final summary, not Ray's or Lightning's notices.
    assert "epoch 30/30" in done.stdout and "done in" in done.stdout
    for noise in ("RayTrainWorker pid", "TrainController", "Tip:", "deduplicates logs", "Reporting training result"):
        assert noise not in done.stdout + done.stderr
    # ... which still land in the run directory's logs.
    assert "TrainController" in (run_dir / "logs" / "ray.log").read_text()


@pytest.mark.e2e
def test_a_request_larger_than_the_cluster_fails_in_seconds(ray_cluster, tmp_path):
    started = time.time()
    done = run_train("scale.num_workers=8", "data.batch_size=64", outputs=tmp_path, address=ray_cluster, timeout=120)
    assert time.time() - started < 30
    assert done.returncode == 1
    assert "asks for 8 workers x {CPU: 1} = {CPU: 8}" in done.stdout
    assert "cluster has {CPU: 2}" in done.stdout
    (run_dir,) = run_dirs(tmp_path)
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and "asks for 8 workers" in summary["error"]
    assert not (run_dir / "checkpoints").exists()


@pytest.mark.e2e
def test_gpu_workers_on_a_cluster_without_gpus_fail_clearly(ray_cluster, tmp_path):
    done = run_train("scale.use_gpu=true", outputs=tmp_path, address=ray_cluster, timeout=120)
    assert done.returncode == 1
    assert "scale.use_gpu=true but the Ray cluster has no GPU" in done.stdout


def test_a_wrong_type_fails_before_anything_is_written(tmp_path):
    # A typed key (scale.num_workers takes a count or [min, max], which only raydra's own check types).
    done = run_train("scale.cpus_per_worker=abc", outputs=tmp_path, timeout=60)
    assert done.returncode == 1
    assert "scale.cpus_per_worker=abc" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_an_unreachable_cluster_is_named(tmp_path):
    done = run_train(outputs=tmp_path, address="127.0.0.1:1", timeout=120, env={"RAY_AUTH_MODE": "disabled"})
    assert done.returncode == 1
    assert "could not reach the Ray cluster at ray.address=127.0.0.1:1" in done.stdout


@pytest.mark.e2e
@pytest.mark.gpu
def test_gpu_workers_train_with_bf16_by_default(tmp_path):
    done = run_train("scale=gpu", "logger=csv", "trainer.max_epochs=5", "data.batch_size=256", "model.optimizer.lr=3e-3", outputs=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path)
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["precision"] == "bf16-mixed"
    assert 0 < summary["throughput"]["mfu"] < 1
