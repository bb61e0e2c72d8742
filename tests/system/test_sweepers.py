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


def _epochs(job: Path, metric: str = "val/acc") -> list:
    """The epochs whose `metric` the job's metrics.csv holds."""
    import csv

    with (job / "metrics.csv").open() as file:
        return sorted({int(row["epoch"]) for row in csv.DictReader(file) if row.get(metric)})


def _killed_when(args: list, sweep_dir: Path, ready) -> tuple:
    """`args` (a `python train.py -m` multirun) started, and killed with SIGKILL (a lost driver) once
    `ready` holds of its jobs' statuses in jobs.json by number; returns its output and those statuses."""
    import subprocess
    import time

    from helpers import REPO, base_env

    from raydra.records import jobs as jobs_record

    driver = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=base_env())
    try:
        deadline = time.time() + 240
        while True:
            assert driver.poll() is None and time.time() < deadline, driver.communicate()[0]
            record = jobs_record.read(sweep_dir) if (sweep_dir / "jobs.json").is_file() else None
            states = {n: job.status for n, job in record.jobs.items()} if record else {}
            if ready(states):
                break
            time.sleep(0.3)
        driver.kill()
        return driver.communicate(timeout=60)[0], states
    finally:
        if driver.poll() is None:
            driver.kill()


@pytest.mark.e2e
def test_the_asynchronous_optuna_sweeper_asks_as_slots_free_prunes_within_an_epoch_and_resumes_after_its_driver_is_killed(
    ray_cluster, tmp_path
):
    import json
    import sys
    import time

    import optuna
    from helpers import REPO

    from raydra.records import jobs as jobs_record

    sweep_dir = tmp_path / "sweep"
    command = (
        "-m",
        "experiment=vit_digits_smoke",
        "trainer.test=false",
        "scale.num_workers=1",
        "trainer.max_epochs=3",
        "hydra/sweeper=optuna_async",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.sampler.seed=0",
        # A user's own pruner: trial 1 is pruned at its first epoch, whenever it comes.
        "hydra.sweeper.pruner={_target_: tests.optuna_probe.PruneTrials, trials: [1], at_epoch: 0}",
        "model.optimizer.lr=tag(log,interval(1e-3,1e-2))",
        f"hydra.sweep.dir={sweep_dir}",
    )
    args = [sys.executable, str(REPO / "train.py"), *command[:1], f"paths.outputs={tmp_path}", *command[1:], f"ray.address={ray_cluster}"]
    # Killed (kill -9: a lost driver) once trial 0 has completed and trial 2, asked for as trial 1's
    # slot freed, is training.
    first, _ = _killed_when(
        args,
        sweep_dir,
        lambda states: states.get("0") == "completed" and states.get("2") == "running" and (sweep_dir / "2" / "metrics.csv").is_file(),
    )

    # Trial 1 was pruned at epoch 0 and stopped within an epoch of it; recorded pruned, not failed.
    pruned = summary_of(sweep_dir / "1")
    assert pruned["status"] == "pruned" and pruned["stopped_by"].startswith("Optuna's PruneTrials at epoch 0"), pruned
    assert max(_epochs(sweep_dir / "1")) <= 1
    assert "[1] pruned at epoch 0" in first
    # Trial 2 took the first slot to free at once, not after a batch: before the other job ended.
    from datetime import datetime

    record = jobs_record.read(sweep_dir)
    first, last = sorted(datetime.fromisoformat(record.jobs[n].released_at).timestamp() for n in ("0", "1"))
    started = datetime.fromisoformat(record.jobs["2"].started_at).timestamp()
    assert 0 <= started - first < 3 and started < last, (first, last, started)
    completed_0 = (sweep_dir / "0" / "summary.json").read_bytes()

    # Its running job stops as the driver's job server goes, recording itself interrupted.
    deadline = time.time() + 180
    while summary_of(sweep_dir / "2")["status"] == "running":
        assert time.time() < deadline, (sweep_dir / "2" / "console.log").read_text()[-2000:]
        time.sleep(1)

    # The same command with resume: trial 2 continues in its directory, no ended trial runs again.
    done = run_train(*command, "hydra.launcher.resume=true", outputs=tmp_path, address=ray_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[0] started" not in done.stdout and "[1] started" not in done.stdout and "[2] started" in done.stdout
    assert (sweep_dir / "0" / "summary.json").read_bytes() == completed_0
    continued = summary_of(sweep_dir / "2")
    assert continued["status"] == "completed" and continued["resumed"][0]["from_status"] == "interrupted"
    study = optuna.load_study(
        study_name=sweep_dir.name,
        storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(sweep_dir / "optuna_study.journal"))),
    )
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "PRUNED", "COMPLETE"], states
    # Each completed trial's value is its run's best val/acc; the pruned one keeps its last.
    assert study.trials[0].value == pytest.approx(summary_of(sweep_dir / "0")["metrics"]["best"]["val/acc"])
    assert study.trials[1].value == pytest.approx(study.trials[1].intermediate_values[0])
    best = json.loads(json.dumps(yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())))
    assert best["best_value"] == pytest.approx(study.best_value)
    assert f"best val/acc {study.best_value:.4g} by trial #{study.best_trial.number}" in done.stdout


@pytest.mark.e2e
def test_a_seed_race_names_its_winner_resumes_after_its_driver_is_killed_and_compare_shows_its_verdict(ray_cluster, tmp_path, capsys):
    """Two learning rates, two seeds each (min_seeds = max_seeds = 2: one look, the fewest jobs a
    real race can take; its statistics, more seeds, out-of-reach drops and the stopping of a dropped
    configuration's jobs are test_race.py's and test_race_statistics.py's), 1-worker jobs two at a
    time: 1e-5 barely learns in two epochs, 3e-4 does; the driver is killed once two jobs have
    completed, and the resumed race keeps them and reaches its verdict, which raydra compare shows.
    Three learning rates, killed and resumed, are benchmarks/race_real.py's (experiments/race.md)."""
    import sys
    import time

    from helpers import REPO, compare

    from raydra.records import race as race_record

    sweep_dir = tmp_path / "race"
    command = (
        "-m",
        "experiment=vit_digits_smoke",
        "trainer.test=false",
        "scale.num_workers=1",
        "trainer.max_epochs=2",
        "hydra/sweeper=race",
        "hydra.sweeper.max_seeds=2",
        "model.optimizer.lr=1e-5,3e-4",
        f"hydra.sweep.dir={sweep_dir}",
    )
    args = [sys.executable, str(REPO / "train.py"), *command[:1], f"paths.outputs={tmp_path}", *command[1:], f"ray.address={ray_cluster}"]
    _, states = _killed_when(args, sweep_dir, lambda states: list(states.values()).count("completed") >= 2)
    kept = {n: (sweep_dir / n / "summary.json").read_bytes() for n, status in states.items() if status == "completed"}
    # Its running jobs stop as the driver's job server goes, recording themselves interrupted.
    deadline = time.time() + 180
    while any(summary_of(p.parent)["status"] == "running" for p in sweep_dir.glob("*/summary.json")):
        assert time.time() < deadline
        time.sleep(1)

    done = run_train(*command, "hydra.launcher.resume=true", outputs=tmp_path, address=ray_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    # No finished job ran again.
    assert all(f"[{n}] started" not in done.stdout for n in kept)
    assert all((sweep_dir / n / "summary.json").read_bytes() == before for n, before in kept.items())
    record = race_record.read(sweep_dir)
    assert record.status == "completed" and len(record.resumed) == 1 and record.winner is not None, record
    standing = {c.overrides[0]: c for c in record.configurations}
    slow = standing["model.optimizer.lr=1e-05"]
    assert record.configurations[record.winner].overrides[0] == "model.optimizer.lr=0.0003"
    # Beaten beyond noise needs a gap of 12.7 se on the one look's 1 residual df: dropped, or undecided at max_seeds.
    assert slow.standing in ("dropped", "undecided") and slow.against_leader.seeds == 2 and sorted(slow.results) == ["42", "43"]
    assert slow.against_leader.advantage > 0 and slow.against_leader.p is not None
    # Each result is its run's best val/acc.
    for num, job in record.jobs.items():
        if job.status == "completed":
            assert job.value == pytest.approx(summary_of(sweep_dir / num)["metrics"]["best"]["val/acc"])
    assert record.jobs_started == record.grid_jobs == 4 and sorted(record.jobs) == [str(n) for n in range(4)]
    # The verdict closes the multirun and shows in raydra compare.
    assert "race of" in done.stdout and "winner  model.optimizer.lr=" in done.stdout
    code, out, _ = compare(capsys, sweep_dir)
    assert code == 0 and "race of" in out and "winner  model.optimizer.lr=0.0003" in out, out
