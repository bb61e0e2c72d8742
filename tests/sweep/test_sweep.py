"""tune=: Ray Tune sweeps over runs. Fast checks of the space and its errors, then real sweeps on
the session's 2-CPU Ray cluster, judged by the sweep directory they leave."""

import csv
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO, assert_wandb_holds_the_run, base_env, resumed_at, run_train, summary_of
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from raydra.config.checks import validate
from raydra.config.schema import register_schemas
from raydra.entry import CONF_DIR
from raydra.errors import RaydraError
from raydra.records import sweep

register_schemas()

# Two clearly different learning rates, so ASHA has a trial to stop at its first rung; one worker
# per trial, so two trials fit side by side on 2 CPUs.
SMALL_SWEEP = (
    "tune=asha",
    "tune.num_samples=4",
    "tune.space={model.optimizer.lr: {choice: [1e-5, 3e-3]}, data.batch_size: {choice: [32, 64]}}",
    "scale.num_workers=1",
    "trainer.max_epochs=3",
)


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def space_of(*overrides: str):
    from raydra.sweep.space import check_samples, parse_space

    cfg = composed("tune=asha", *overrides)
    validate(cfg)
    space = parse_space(cfg)
    check_samples(cfg, space)
    return space


# ---------------------------------------------------------------------------------------------
# The space and the sweep's settings, checked before Ray starts


def test_tune_options_compose_with_their_typed_schema():
    for option, search, scheduler in [
        ("asha", "random", "asha"),
        ("random", "random", "fifo"),
        ("optuna", "optuna", "asha"),
        ("pbt", "random", "pbt"),
    ]:
        cfg = composed(f"tune={option}")
        assert (cfg.tune.search, cfg.tune.scheduler) == (search, scheduler)
        validate(cfg)
    assert composed().tune is None
    with pytest.raises(ConfigCompositionException, match="num_samplez"):
        composed("tune=asha", "tune.num_samplez=3")
    with pytest.raises(ConfigCompositionException, match="tune.num_samples=many"):
        composed("tune=asha", "tune.num_samples=many")


def test_space_keys_are_dotted_or_nested_and_the_command_line_distribution_wins():
    space = space_of(
        "tune.space={model.optimizer.lr: {choice: [1e-3, 1e-2]}, data.batch_size: null}", "+tune.space.model.dropout={uniform: [0.0, 0.3]}"
    )
    assert space == {"model.optimizer.lr": ("choice", [1e-3, 1e-2]), "model.dropout": ("uniform", [0.0, 0.3])}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+tune.space.model.optimizer.lrr={loguniform: [1e-4, 1e-1]}"],
            "tune.space: model.optimizer.lrr is not a key of the composed config",
        ),
        (
            ["tune.space={model.optimizer.lr: {logunifrom: [1e-4, 1e-1]}}"],
            "tune.space.model.optimizer.lr: logunifrom is not a distribution",
        ),
        (["tune.space={data.batch_size: {choice: [32, 33]}}"], "tune.space.data.batch_size: the value 33 makes an invalid run"),
        (["+tune.space.scale.num_workers={uniform: [1, 2]}"], "tune.space.scale.num_workers: the value 1.0 makes an invalid run"),
        (["tune.num_samples=0"], "tune.num_samples=0 must be at least 1"),
        (["tune.scheduler=hyperband"], "tune.scheduler=hyperband is not a scheduler raydra knows; use one of asha, fifo, pbt"),
        (["tune.space={model.optimizer.lr: null, data.batch_size: null}"], "tune.space leaves no key to search"),
    ],
)
def test_bad_sweep_input_names_the_key(overrides, message):
    with pytest.raises(RaydraError, match=message.replace(".", r"\.")):
        space_of(*overrides)


def test_a_bad_space_key_fails_before_ray_starts_and_leaves_a_failed_sweep(tmp_path):
    started = time.time()
    done = run_train("tune=asha", "+tune.space.model.hidden_sise={choice: [32, 64]}", outputs=tmp_path, timeout=120)
    assert done.returncode == 1
    assert "tune.space: model.hidden_sise is not a key of the composed config" in done.stdout
    assert time.time() - started < 30
    (sweep_dir,) = [p.parent for p in tmp_path.glob("sweeps/*/*/sweep.json")]
    record = sweep.read(sweep_dir)
    assert record.status == "failed" and "hidden_sise" in record.error
    assert not (sweep_dir / "trials").exists() and not (sweep_dir / "tune").exists()


# ---------------------------------------------------------------------------------------------
# Real sweeps


def _trials(sweep_dir: Path) -> dict:
    return {p.parent.name: summary_of(p.parent) for p in sweep_dir.glob("trials/*/summary.json")}


def _ended_in_tune_state(outputs: Path) -> set:
    """The trials the newest experiment state Tune saved in the sweep directory records as ended
    (TERMINATED: run to the end or stopped early): what a resumed sweep keeps."""
    states = sorted(outputs.glob("sweeps/*/*/tune/experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    if not states:
        return set()
    try:
        trials = [json.loads(state) for state, _ in json.loads(states[-1].read_text())["trial_data"]]
    except (ValueError, KeyError):
        return set()  # caught while Tune writes it
    return {trial["trial_id"] for trial in trials if trial["status"] == "TERMINATED"}


@pytest.mark.e2e
def test_asha_sweep_killed_and_resumed_finishes_without_redoing_trials_and_its_best_config_reruns(ray_cluster, tmp_path):
    """One sweep for the whole life cycle, to keep the suite short: run, SIGKILL the driver once
    a trial has finished, resume, then compose best_config.yaml into the best trial's run."""
    args = [
        sys.executable,
        str(REPO / "train.py"),
        f"paths.outputs={tmp_path}",
        f"ray.address={ray_cluster}",
        "logger=[csv,wandb]",
        *SMALL_SWEEP,
    ]
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=base_env())
    # Kill once a trial has run to the end while at least two are still to finish, and once Tune's
    # experiment state (saved every 5 s) records every trial that ended, so they are on record.
    deadline = time.time() + 400
    while time.time() < deadline:
        printed = (tmp_path / "first.log").read_text()
        ended = printed.count(" done after ") + printed.count(" stopped early after ")
        if " done after " in printed and ended <= 2 and len(_ended_in_tune_state(tmp_path)) >= ended:
            break
        assert first.poll() is None and ended <= 2, printed
        time.sleep(0.5)
    else:
        pytest.fail(f"no trial finished and reached Tune's experiment state in 400 s:\n{printed}")
    (sweep_dir,) = [p.parent for p in tmp_path.glob("sweeps/*/*/sweep.json")]
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = _trials(sweep_dir)
    # What resume keeps is what Tune's saved state had ended. A trial that ended in the seconds
    # between that save and the kill has a finished record yet runs again from its last checkpoint.
    # A trial ASHA stopped is recorded by the sweep's driver as the sweep settles (its process was
    # ended by Tune): stopped before the kill, its record still says running, and the resumed sweep
    # records it stopped without training it again.
    ended = _ended_in_tune_state(tmp_path)
    kept = {t: (before[t]["status"], before[t]["finished_at"]) for t in ended if before[t]["status"] != "running"}
    unsettled = {t for t in ended if before[t]["status"] == "running"}
    assert "completed" in {status for status, _ in kept.values()}, (kept, before)
    assert sweep.read(sweep_dir).status == "running"
    assert not (sweep_dir / "best_config.yaml").exists()

    # ~70 s here: a resumed sweep that runs past 300 s has hung (CI once waited out 600 s on one).
    done = run_train(*SMALL_SWEEP, "logger=[csv,wandb]", f"tune.resume={sweep_dir}", outputs=tmp_path, address=ray_cluster, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    record = sweep.read(sweep_dir)
    assert record.status == "completed" and len(record.resumed) == 1

    trials = _trials(sweep_dir)
    assert len(trials) == 4
    for trial, (status, finished_at) in kept.items():
        assert (trials[trial]["status"], trials[trial]["finished_at"]) == (status, finished_at) and not trials[trial]["resumed"]
    for trial in unsettled:
        assert trials[trial]["status"] == "stopped" and not trials[trial]["resumed"], trials[trial]
    statuses = sorted(s["status"] for s in trials.values())
    assert "stopped" in statuses and "completed" in statuses and "failed" not in statuses
    for summary in trials.values():
        if summary["status"] == "stopped":
            assert summary["epochs_completed"] < 3 and "val/acc" in summary["metrics"]["final"]
        else:  # a Tune trial was watched for hangs: its deadlines are on record (tests/run/test_watchdog.py)
            deadlines = summary["watchdog"]["deadlines_s"]
            assert deadlines and not summary["hangs"], summary["watchdog"]
            # A trial resumed at its last epoch may train for less than one heartbeat (1 s): no train deadline then.
            assert deadlines.get("train", 90.0) >= 90.0 and ("train" in deadlines or summary["resumed"]), summary
    # Trials ran side by side: two trials' lifetimes overlap.
    spans = sorted((s["started_at"], s["finished_at"]) for s in trials.values())
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
    # One W&B group, named after the sweep, for all trials; each trial its own run.
    groups = {yaml.safe_load((sweep_dir / "trials" / t / ".hydra" / "config.yaml").read_text())["logger"]["wandb"]["group"] for t in trials}
    assert groups == {record.id}
    # A trial cut off by the kill runs again under its W&B run id, in a second offline-run folder
    # (W&B makes one per process; `wandb sync` joins them by id): count runs by id, per trial.
    wandb_ids = {
        t: {re.sub(r"^offline-run-\d{8}_\d{6}-", "", p.name) for p in (sweep_dir / "trials" / t).glob("wandb/offline-run-*")}
        for t in trials
    }
    assert all(len(ids) == 1 for ids in wandb_ids.values()), wandb_ids
    assert len(set.union(*wandb_ids.values())) == 4
    # Each trial's W&B run holds what its metrics.csv holds and says how it ended: a trial ASHA
    # stopped too, whose process Tune ended before W&B flushed (the sweep's driver completed it).
    for trial, summary in trials.items():
        trial_dir = sweep_dir / "trials" / trial
        retrained = resumed_at(trial_dir)[3] if "resumed from" in (trial_dir / "logs" / "worker_0.log").read_text() else None
        segments = assert_wandb_holds_the_run(trial_dir, summary["status"], retrained_from=retrained)
        # Named for what it sampled, as a trial of its sweep's group.
        sampled = ",".join(f"{k}={v}" for k, v in summary["trial"]["sampled"].items())
        assert {(s["run"]["name"], s["run"]["job_type"], s["run"]["group"]) for s in segments if s["run"]} == {
            (sampled, "trial", record.id)
        }

    # The compute ledger: the sweep's worker slots over its two invocations are its trials'
    # worker-seconds and the slots' idle time; what the trials ASHA stopped cost, and the best alone.
    spent = record.ledger
    stopped = [s for s in trials.values() if s["status"] == "stopped"]
    assert spent.runs == 4 and spent.slots == record.max_concurrent and spent.best == record.best.trial
    assert spent.runs_s <= spent.allocated_s * 1.02 and spent.allocated_s == pytest.approx(spent.runs_s + spent.idle_s, rel=0.02)
    assert spent.not_completed_s == {"stopped": pytest.approx(sum(s["wall_time_s"] for s in stopped), rel=1e-3)}
    assert spent.best_s == trials[record.best.trial]["ledger"]["allocated_s"] and "compute  " in done.stdout

    rows = list(csv.DictReader((sweep_dir / "trials.csv").open()))
    assert len(rows) == 4 and {"model.optimizer.lr", "data.batch_size", "val/acc", "status", "wall_s"} <= set(rows[0])
    best = record.best
    assert trials[best.trial]["status"] == "completed"
    assert best.metric == max(s["metrics"]["final"]["val/acc"] for s in trials.values() if s["status"] == "completed")
    assert (sweep_dir / "best_checkpoint.ckpt").resolve() == Path(best.checkpoint).resolve()

    # raydra compare reads the sweep as its trials, the sampled keys as what differs.
    table = subprocess.run(
        [sys.executable, "-m", "raydra", "compare", str(sweep_dir), "--format", "json"], capture_output=True, text=True, check=True
    ).stdout
    assert len(json.loads(table)) == 4 and "model.optimizer.lr" in json.loads(table)[0]

    # best_config.yaml reruns the best trial: Hydra composes it into what that trial trained, as a
    # single run (no tune section, no resume), its place in the sweep aside (its W&B group, its
    # paths). Composed, not trained: a run of a composed config is every other test's, and a seed's
    # run is deterministic on one machine (test_train_e2e.py).
    shown = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "--config-path", str(sweep_dir), "--config-name", "best_config", "--cfg", "job"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=base_env(),
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    again = yaml.safe_load(shown.stdout)
    trained = yaml.safe_load((sweep_dir / "trials" / best.trial / ".hydra" / "config.yaml").read_text())
    assert again["tune"] is None and again["resume"] is None
    place = ("tune", "resume", "logger", "paths")
    assert {k: v for k, v in again.items() if k not in place} == {k: v for k, v in trained.items() if k not in place}
    assert again["model"]["optimizer"]["lr"] == best.sampled["model.optimizer.lr"]


@pytest.mark.e2e
def test_a_metric_no_trial_reports_fails_after_the_first_report(ray_cluster, tmp_path):
    done = run_train(
        *SMALL_SWEEP, "tune.num_samples=1", "tune.metric=val/accuracy", "logger=csv", outputs=tmp_path, address=ray_cluster, timeout=300
    )
    assert done.returncode == 1
    assert "tune.metric=val/accuracy is not among the metrics the trials report" in done.stdout
    (sweep_dir,) = [p.parent for p in tmp_path.glob("sweeps/*/*/sweep.json")]
    assert sweep.read(sweep_dir).status == "failed"
    assert not (sweep_dir / "best_config.yaml").exists()
