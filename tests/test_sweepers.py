"""Hydra sweeper plugins on top of raydra's multirun launcher: `python train.py -m hydra/sweeper=<plugin>`
as a user types it. The sweeper asks its optimizer for a batch of points, raydra's launcher runs the
batch side by side on the Ray cluster, and each job's JobReturn.return_value (its best
checkpoint.monitor, val/acc here) is the objective the sweeper reads. Checked only through what the
run leaves: the jobs' summary.json and .hydra/config.yaml, and the sweeper's result file.

(Optuna's sweeper has its test in tests/test_multirun.py.)"""

from datetime import datetime
from pathlib import Path

import pytest
import yaml
from conftest import run_dirs, run_train, summary_of

# One worker each: two jobs fit the session cluster's 2 CPUs side by side.
SMALL = ("experiment=vit_digits_smoke", "trainer.max_epochs=1", "trainer.test=false", "scale.num_workers=1")


def _overlap(a: dict, b: dict) -> bool:
    start_a, end_a = datetime.fromisoformat(a["started_at"]), datetime.fromisoformat(a["finished_at"])
    start_b, end_b = datetime.fromisoformat(b["started_at"]), datetime.fromisoformat(b["finished_at"])
    return start_a < end_b and start_b < end_a


@pytest.mark.e2e
def test_the_nevergrad_sweeper_drives_jobs_side_by_side_maximising_each_jobs_metric(ray_cluster, tmp_path):
    sweeper = (
        "hydra/sweeper=nevergrad",
        # One batch of two points: num_workers is how many candidates the optimizer hands the
        # launcher at once.
        "hydra.sweeper.optim.budget=2",
        "hydra.sweeper.optim.num_workers=2",
        "hydra.sweeper.optim.maximize=true",  # val/acc, checkpoint.mode=max
        "hydra.sweeper.optim.seed=0",
        "model.optimizer.lr=tag(log,interval(1e-4,1e-2))",
    )
    done = run_train("-m", *SMALL, *sweeper, outputs=tmp_path, address=ray_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = run_dirs(tmp_path, kind="sweeps")
    assert [p.name for p in jobs] == ["0", "1"]
    summaries = [summary_of(p) for p in jobs]
    assert [s["status"] for s in summaries] == ["completed", "completed"], done.stdout
    # The optimizer's batch of two ran side by side.
    assert _overlap(*summaries), [(s["started_at"], s["finished_at"]) for s in summaries]

    # Each job trained at the learning rate Nevergrad proposed, inside the interval.
    lrs = [yaml.safe_load((Path(s["run_dir"]) / ".hydra" / "config.yaml").read_text())["model"]["optimizer"]["lr"] for s in summaries]
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs) and lrs[0] != lrs[1]

    # Nevergrad was told each job's best val/acc (maximised, so the larger) and recorded the better job.
    results = yaml.safe_load((jobs[0].parent / "optimization_results.yaml").read_text())
    assert results["name"] == "nevergrad"
    best_value = max(s["metrics"]["best"]["val/acc"] for s in summaries)
    assert results["best_evaluated_result"] == pytest.approx(best_value)
    (best_job,) = [s for s, lr in zip(summaries, lrs) if lr == pytest.approx(results["best_evaluated_params"]["model.optimizer.lr"])]
    assert best_job["metrics"]["best"]["val/acc"] == pytest.approx(best_value)
