"""The hang watchdog (raydra.run.hang_watch, raydra.worker.watchdog): a run that stops making progress is found
within its phase's deadline, the rank that stopped is named, every worker's stacks are kept, and the
run restarts from its last checkpoint or ends recorded hung with nothing left running; a rank the
others wait for is named a straggler.

The Watch's judgement (which rank, when, stragglers, restarts) is tested at its seam with made-up
heartbeats; the whole path runs for real once per kind of run: local mode (a checkpoint save that
blocks), and two workers on the session's Ray (a user's callback that blocks one rank once, with a
straggler beside it: restarted and completed; a data module's set-up that blocks: the run ends)."""

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from helpers import RUN, compare, ledger_of, run_dirs, run_train, summary_of

from raydra.cli import main
from raydra.run import hang_watch
from raydra.worker import watchdog
from raydra.worker.watchdog import BEFORE_BACKWARD, END, ENDED, VALIDATION, Progress

FAILURE = SimpleNamespace(
    startup_timeout_s=900.0,
    step_timeout_factor=20.0,
    step_timeout_min_s=90.0,
    checkpoint_timeout_s=600.0,
    straggler_threshold=0.2,
    straggler_window=10,
)


def _beat(position, still_s=0.0, deadline_s=90.0, phase="train", step=25, steps=()):
    return {"phase": phase, "step": step, "position": list(position), "still_s": still_s, "deadline_s": deadline_s, "steps": list(steps)}


def _two_ranks(**settings):
    found = hang_watch.Watch(settings.get("threshold", 0.2), settings.get("window", 10))
    for rank in (0, 1):
        assert found.register(rank, 2, "node-a" if rank == 0 else "node-b", 100 + rank, 900.0) == 0
    return found


def test_the_rank_furthest_behind_is_named_once_a_deadline_passes_and_every_rank_is_told():
    found = _two_ranks()
    # Rank 1 stopped inside step 25's batch-end hooks; rank 0 went on to step 26's backward and waits there.
    assert found.beat(0, 0, _beat((26, BEFORE_BACKWARD, 0), still_s=50.0, step=25)) is None
    assert found.beat(1, 0, _beat((25, END, 0), still_s=60.0)) is None  # within its deadline
    assert found.beat(1, 0, _beat((25, END, 0), still_s=91.0)) == 1
    assert found.beat(0, 0, _beat((26, BEFORE_BACKWARD, 0), still_s=92.0)) == 1  # every rank learns of it
    (hang,) = found.news()["hangs"]
    assert [s["rank"] for s in hang["stopped"]] == [1] and hang["stopped"][0]["node"] == "node-b"
    assert (hang["phase"], hang["step"], hang["deadline_s"]) == ("train", 25, 90.0) and hang["waited_s"] >= 91.0
    found.stacks(1, 1, "rank 1's stacks", None)
    assert not found.all_stacks(1)
    found.stacks(1, 0, "rank 0's stacks", '{"entries": []}')
    assert found.all_stacks(1)
    # The restarted group is the next attempt: the hang stays on record, nothing else carries over.
    assert found.register(0, 2, "node-a", 200, 900.0) == 1
    assert found.beat(0, 0, _beat((30, END, 0), still_s=500.0)) is None  # the old group's worker, leaving
    assert found.beat(0, 1, _beat((1, ENDED, 0), still_s=1.0)) is None
    assert found.news()["attempt"] == 1


def test_ranks_standing_at_the_same_place_are_all_named_and_a_silent_rank_is_named_by_its_silence(monkeypatch):
    found = _two_ranks()
    found.beat(0, 0, _beat((25, ENDED, 0), still_s=10.0))
    assert found.beat(1, 0, _beat((25, ENDED, 0), still_s=95.0)) == 1
    assert [s["rank"] for s in found.news()["hangs"][0]["stopped"]] == [0, 1]

    monkeypatch.setattr(hang_watch, "SILENT_MARGIN_S", 0.0)
    found = _two_ranks()
    found.beat(0, 0, _beat((3, ENDED, 0), deadline_s=0.05))
    found.beat(1, 0, _beat((3, VALIDATION, 0), deadline_s=90.0))
    time.sleep(0.1)
    (hang,) = found.news()["hangs"]  # rank 0 has said nothing for longer than its deadline allowed
    assert [s["rank"] for s in hang["stopped"]] == [0]


def _steps(rank, lag, cycle=0.1, first=0, count=10, backward_lag=0.0):
    """`count` steps as rank `rank` reports them: its backward and the end of its hooks `lag` late."""
    t0 = 1000.0
    return [(b, b, t0 + b * cycle + 0.03 + backward_lag, t0 + b * cycle + 0.08 + lag) for b in range(first + 1, first + count + 1)]


def test_a_rank_the_others_wait_for_step_after_step_is_named_a_straggler_with_its_lag():
    found = _two_ranks(window=10)
    found.beat(0, 0, _beat((10, ENDED, 0), steps=_steps(0, 0.0)))
    found.beat(1, 0, _beat((10, ENDED, 0), steps=_steps(1, 0.05)))
    news = found.news()
    (straggler,) = news["stragglers"]
    assert straggler["rank"] == 1 and straggler["node"] == "node-b"
    assert straggler["lag_s"] == pytest.approx(0.05) and straggler["step_time_s"] == pytest.approx(0.1)
    assert straggler["share"] == pytest.approx(0.5) and straggler["windows"] == 1
    assert [item["kind"] for item in news["news"]] == ["straggler"]
    # Each rank's own step time: the run's, less what it waited for the slowest.
    figures = found.figures()
    assert figures[1]["step_time_s"] == pytest.approx(0.1) and figures[0]["step_time_s"] == pytest.approx(0.05)
    # Late to its backward (slow data or forward) counts as much as late out of its hooks.
    found = _two_ranks(window=10)
    found.beat(0, 0, _beat((10, ENDED, 0), steps=_steps(0, 0.0)))
    found.beat(1, 0, _beat((10, ENDED, 0), steps=_steps(1, 0.0, backward_lag=0.04)))
    assert [s["rank"] for s in found.news()["stragglers"]] == [1]


def test_a_lag_within_the_threshold_names_no_straggler():
    found = _two_ranks(window=10)
    found.beat(0, 0, _beat((10, ENDED, 0), steps=_steps(0, 0.0)))
    found.beat(1, 0, _beat((10, ENDED, 0), steps=_steps(1, 0.01)))
    assert found.news()["stragglers"] == [] and found.figures()[1]["lag_s"] == pytest.approx(0.01)


def test_deadlines_scale_with_the_runs_own_batches_and_never_fall_below_their_floors():
    progress = Progress(FAILURE)
    assert progress.deadline("startup") == 900.0 and progress.deadline("finishing") == 900.0
    assert progress.deadline("epoch_end") == 900.0  # samples drawn, metrics gathered: not a batch
    assert progress.deadline("train") == 90.0  # nothing measured yet: the floor
    progress.intervals["train"].extend([10.0, 10.0, 12.0])
    assert progress.deadline("train") == 200.0  # 20 x the median batch
    assert progress.deadline("validation") == 200.0  # a first validation batch: training's measure
    progress.intervals["validation"].extend([0.5])
    assert progress.deadline("validation") == 90.0
    assert progress.deadline("checkpoint") == 600.0
    progress.saves.append(300.0)
    assert progress.deadline("checkpoint") == 1500.0  # 5 x the longest save


def test_the_driver_writes_each_ranks_stacks_and_the_findings_say_whether_the_group_restarted(tmp_path):
    failure = SimpleNamespace(**vars(FAILURE))
    watching = hang_watch.Watching(failure, tmp_path, local=True)
    try:
        found = watching.link.target
        for rank in (0, 1):
            found.register(rank, 2, "node", rank, 900.0)
        found.beat(0, 0, _beat((5, ENDED, 0)))
        found.beat(1, 0, _beat((4, END, 0), still_s=100.0))
        found.stacks(1, 1, "Stall._stall (probe.py:86)", '{"entries": []}')
        found.stacks(1, 0, "waiting in broadcast", None)
        watching._take_news()
        hang_dir = tmp_path / "diagnostics" / "hang-1"
        assert "Stall._stall" in (hang_dir / "rank1.stacks.txt").read_text()
        assert json.loads((hang_dir / "rank1.flight.json").read_text()) == {"entries": []}
        assert not (hang_dir / "rank0.flight.json").exists()
        found.register(0, 2, "node", 10, 900.0)  # the group restarted
    finally:
        findings = watching.close()
    (hang,) = findings.hangs
    assert hang.outcome == "restarted" and not findings.ended_by_hang and hang.diagnostics == "diagnostics/hang-1"
    assert [r.rank for r in hang.stopped] == [1]
    assert findings.watchdog["step_timeout_min_s"] == 90.0 and findings.watchdog["deadlines_s"] == {"train": 90.0}


def test_the_stacks_of_this_process_show_every_thread_where_it_waits():
    import threading

    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="waits-for-the-test", daemon=True)
    thread.start()
    try:
        stacks = watchdog.stacks_of_this_process()
    finally:
        release.set()
    assert "waits-for-the-test" in stacks and "Event.wait" in stacks
    assert "test_the_stacks_of_this_process_show_every_thread_where_it_waits" in stacks


# -- real runs --------------------------------------------------------------------------------------


def test_a_checkpoint_save_that_blocks_in_local_mode_is_recorded_hung_with_its_stack(train_here, tmp_path, capfd):
    done = train_here(
        *RUN,
        "scale.num_workers=0",
        "trainer.max_epochs=2",
        "+callbacks.stall._target_=tests.probe.Stall",
        "+callbacks.stall.rank=0",
        "+callbacks.stall.where=save",
        "failure.checkpoint_timeout_s=3",
        outputs=tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path)
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and summary["error"].startswith("hung: rank 0")
    (hang,) = summary["hangs"]
    assert hang["phase"] == "checkpoint" and hang["outcome"] == "ended" and hang["deadline_s"] == 3.0
    # waited_s is rounded to a tenth: a hang declared 0.04 s past its deadline records 3.0.
    assert 3.0 <= hang["waited_s"] < 30.0
    stacks = (run_dir / hang["diagnostics"] / "rank0.stacks.txt").read_text()
    assert "Stall.on_save_checkpoint" in stacks and "TimedReport" in stacks
    assert "made no progress in checkpoint" in done.stdout + done.stderr
    # raydra show tells where, how long, and where the stacks are.
    assert main(["show", str(run_dir)]) == 0
    shown = capfd.readouterr().out
    assert re.search(r"^status\s+failed: hung: rank 0", shown, re.M)
    assert re.search(r"hang 1 .*: checkpoint after step \d+, waited [\d.]+ s of a 3 s deadline", shown)
    assert "stacks in diagnostics/hang-1" in shown and str(run_dir / "diagnostics") in shown


@pytest.mark.e2e
def test_a_rank_that_blocks_once_is_named_its_stacks_kept_and_the_run_restarts_and_completes_beside_a_straggler(
    ray_cluster, tmp_path, capsys
):
    once = tmp_path / "stalled-once"
    done = run_train(
        *RUN,
        "trainer.max_epochs=3",
        "failure.max_failures=1",
        "checkpoint.every_n_steps=10",
        "+callbacks.stall._target_=tests.probe.Stall",
        "+callbacks.stall.rank=1",
        "+callbacks.stall.step=25",
        f"+callbacks.stall.once={once}",
        "+callbacks.stall.slow_rank=1",
        "+callbacks.stall.sleep_s=0.1",
        "failure.step_timeout_min_s=10",
        "failure.straggler_window=10",
        outputs=tmp_path / "out",
        address=ray_cluster,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path / "out")
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["epochs_completed"] == 3
    (hang,) = summary["hangs"]
    assert [(r["rank"], r["phase"], r["step"]) for r in hang["stopped"]] == [(1, "train", 25)]
    assert hang["outcome"] == "restarted" and 10.0 <= hang["waited_s"] < 120.0
    stalled_pid = int(once.read_text())
    assert hang["stopped"][0]["pid"] == stalled_pid and not psutil.pid_exists(stalled_pid)
    diagnostics = run_dir / hang["diagnostics"]
    assert "Stall._stall" in (diagnostics / "rank1.stacks.txt").read_text()
    # Rank 0 waited in a collective for rank 1; torch's flight record shows its collectives.
    assert "broadcast" in (diagnostics / "rank0.stacks.txt").read_text()
    assert json.loads((diagnostics / "rank0.flight.json").read_text())["entries"]
    (straggler,) = summary["stragglers"]
    assert straggler["rank"] == 1 and straggler["lag_s"] == pytest.approx(0.1, abs=0.05)
    assert "straggler: rank 1" in done.stdout + done.stderr and "hung: rank 1" in done.stdout + done.stderr
    header = Path(run_dir, "metrics.csv").read_text().splitlines()[0]
    assert "train/step_time_s_rank1" in header and "train/lag_s_rank1" in header
    code, out, _ = compare(capsys, run_dir)
    assert code == 0 and "completed (hung 1x, restarted; straggler: rank 1)" in out
    # The compute ledger: the restart went back to step 20, so both workers' steps 21-25 were done
    # again; the hang's wait is the restart's; rank 0 waited ~0.1 s a step for the straggler.
    ledger = ledger_of(summary)
    (restart,) = ledger["restarts"]
    assert (restart["from_step"], restart["reached_step"]) == (20, 25)
    assert restart["lost_s"] == pytest.approx(2 * 5 * straggler["step_time_s"], rel=0.3)
    assert restart["restart_s"] >= 2 * hang["waited_s"] and ledger["buckets"]["lost"] == restart["lost_s"]
    assert ledger["buckets"]["rank_wait"] >= 0.05 * summary["global_step"]


@pytest.mark.e2e
def test_a_data_module_that_blocks_its_set_up_ends_the_run_hung_with_nothing_left_running(ray_cluster, tmp_path):
    done = run_train(
        *RUN,
        "data._target_=tests.probe.StallInSetup",
        "+data.rank=0",
        "failure.startup_timeout_s=10",
        outputs=tmp_path,
        address=ray_cluster,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path)
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and "start-up" in summary["error"]
    (hang,) = summary["hangs"]
    assert hang["phase"] == "startup" and hang["outcome"] == "ended"
    assert [r["rank"] for r in hang["stopped"]] == [0]
    assert "StallInSetup.setup" in (run_dir / hang["diagnostics"] / "rank0.stacks.txt").read_text()
    for rank in hang["stopped"]:
        assert not psutil.pid_exists(rank["pid"])
