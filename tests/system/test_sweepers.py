"""Hydra sweeper plugins on top of raydra's multirun launcher: `python train.py -m hydra/sweeper=<plugin>`
as a user types it. The sweeper asks its optimizer for a batch of points, raydra's launcher runs the
batch side by side on the Ray cluster, and each job's JobReturn.return_value (its best
checkpoint.monitor, val/acc here) is the objective the sweeper reads. Checked only through what the
run leaves: the jobs' summary.json and .hydra/config.yaml, and the sweeper's result file."""

from pathlib import Path

import pytest
import yaml
from helpers import SMALL_JOB, ran_side_by_side, run_dirs, run_train, summary_of


def _one_batch_of_two(sweeper: tuple, outputs: Path, address: str) -> tuple:
    """Run a sweep the sweeper hands the launcher as one batch of two jobs; returns the jobs'
    directories, their summaries and the learning rate each trained at, once both completed side
    by side."""
    done = run_train("-m", *SMALL_JOB, *sweeper, "model.optimizer.lr=tag(log,interval(1e-4,1e-2))", outputs=outputs, address=address)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = run_dirs(outputs, kind="sweeps")
    assert [p.name for p in jobs] == ["0", "1"]
    summaries = [summary_of(p) for p in jobs]
    assert [s["status"] for s in summaries] == ["completed", "completed"], done.stdout
    assert ran_side_by_side(*summaries), [(s["started_at"], s["finished_at"]) for s in summaries]
    # Each job trained at the learning rate the sweeper proposed, inside the interval.
    lrs = [yaml.safe_load((job / ".hydra" / "config.yaml").read_text())["model"]["optimizer"]["lr"] for job in jobs]
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs) and lrs[0] != lrs[1]
    return jobs, summaries, lrs


@pytest.mark.e2e
def test_the_optuna_sweeper_drives_jobs_side_by_side_with_each_jobs_metric_as_its_objective(ray_cluster, tmp_path):
    sweeper = (
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.n_jobs=2",  # the batch size
        "hydra.sweeper.direction=maximize",  # val/acc, checkpoint.mode=max
        "hydra.sweeper.sampler.seed=0",
    )
    jobs, summaries, lrs = _one_batch_of_two(sweeper, tmp_path, ray_cluster)

    # Optuna received each job's best val/acc (checkpoint.monitor) and picked the better job.
    results = yaml.safe_load((jobs[0].parent / "optimization_results.yaml").read_text())
    best = max(range(2), key=lambda i: summaries[i]["metrics"]["best"]["val/acc"])
    assert results["best_value"] == pytest.approx(summaries[best]["metrics"]["best"]["val/acc"])
    assert results["best_params"]["model.optimizer.lr"] == pytest.approx(lrs[best])


@pytest.mark.e2e
def test_the_nevergrad_sweeper_drives_jobs_side_by_side_maximising_each_jobs_metric(ray_cluster, tmp_path):
    sweeper = (
        "hydra/sweeper=nevergrad",
        "hydra.sweeper.optim.budget=2",
        "hydra.sweeper.optim.num_workers=2",  # the batch size: candidates handed to the launcher at once
        "hydra.sweeper.optim.maximize=true",
        "hydra.sweeper.optim.seed=0",
    )
    jobs, summaries, lrs = _one_batch_of_two(sweeper, tmp_path, ray_cluster)

    # Nevergrad was told each job's best val/acc (maximised, so the larger) and recorded the better job.
    results = yaml.safe_load((jobs[0].parent / "optimization_results.yaml").read_text())
    assert results["name"] == "nevergrad"
    best_value = max(s["metrics"]["best"]["val/acc"] for s in summaries)
    assert results["best_evaluated_result"] == pytest.approx(best_value)
    (best_job,) = [s for s, lr in zip(summaries, lrs) if lr == pytest.approx(results["best_evaluated_params"]["model.optimizer.lr"])]
    assert best_job["metrics"]["best"]["val/acc"] == pytest.approx(best_value)
