"""The compute ledger's logic at its seams, on hand-made figures (no Ray, no training): how a run's
worker-seconds are split, what a restart loses, how a sweep's runs add up with its idle slots, and
how a worker's hooks and the Watch turn into those figures."""

import pytest

from raydra.records import summary
from raydra.records.envelope import Status
from raydra.records.ledger import BUCKETS, GroupLedger, Ledger, RankTime, Waited, group_ledger, run_cost, run_ledger
from raydra.run.hang_watch import Watch, rank_times
from raydra.worker import time_spent


def _t(**seconds):
    return {"productive": 0.0, "validation": 0.0, "test": 0.0, "data_wait": 0.0, "checkpoint_save": 0.0, "other": 0.0, **seconds}


def test_a_run_splits_its_slots_into_buckets_and_the_rest_is_other():
    # 2 workers, 100 s from the process's start; the first step at 20 s; each worker reports 75 s.
    ranks = [
        RankTime(
            rank=r, first_step_at=1020.0, totals=_t(productive=60, validation=5, test=2, data_wait=4, checkpoint_save=3, other=1), waited=w
        )
        # Rank 1 waited 2 s, 1.5 of them between its steps (at the next step's first collective).
        for r, w in ((0, Waited(0.5)), (1, Waited(2.0, between_steps=1.5)))
    ]
    ledger = run_ledger(2, False, began=1000.0, ended=1100.0, first_step_at=1020.0, attempts=[ranks])
    b = ledger.buckets
    assert list(b) == list(BUCKETS) and ledger.allocated_s == 200 and ledger.wall_s == 100
    assert b["startup"] == 40  # both workers' slots, from the process's start to the first step
    # A rank waiting for another is neither productive nor waiting for data.
    assert b["rank_wait"] == 2.5 and b["productive"] == 120 - 1.0 and b["data_wait"] == 8 - 1.5
    assert (b["validation"], b["test"], b["checkpoint_save"]) == (10, 4, 6)
    assert b["other"] == pytest.approx(200 - 40 - 150 + 2) and sum(b.values()) == pytest.approx(200)
    assert ledger.goodput == pytest.approx(119 / 200) and ledger.restarts == []
    assert ledger.sentence() == "goodput 60% of 3.3 min worker time (the rest: startup 20%, other 6%, validation 5%)"


def test_a_restart_loses_what_was_done_after_its_checkpoint():
    saved = _t(productive=10, data_wait=1, checkpoint_save=1)
    last = _t(productive=16, data_wait=1.5, checkpoint_save=1)
    first = [
        RankTime(
            rank=r,
            first_step_at=1010.0,
            totals=_t(productive=16.2, data_wait=1.5, checkpoint_save=1),  # a part-step after its last step
            last_step=37,
            last_step_at=1028.5,
            at_last_step=last,
            at_saves={25: saved},
            waited=Waited(0.4),
            waited_at_saves={25: Waited(0.3)},
        )
        for r in (0, 1)
    ]
    # The new group starts from step 25, its first step at 1040 after a 2 s restore each.
    second = [RankTime(rank=r, from_step=25, first_step_at=1040.0, restore_s=2.0, totals=_t(productive=50)) for r in (0, 1)]
    ledger = run_ledger(2, True, began=1000.0, ended=1100.0, first_step_at=1010.0, attempts=[first, second])
    (restart,) = ledger.restarts
    assert (restart.attempt, restart.from_step, restart.reached_step) == (1, 25, 37)
    # Each worker: 17.5 s to its last step less 12 s to the end of the save of step 25.
    assert restart.lost_s == pytest.approx(2 * 6.5) and ledger.buckets["lost"] == pytest.approx(13)
    # From the killed group's last step to the new group's first, on both slots, less the restores.
    assert restart.restart_s == pytest.approx(2 * 11.5)
    assert ledger.buckets["restart"] == pytest.approx(23 - 4) and ledger.buckets["checkpoint_restore"] == 4
    assert ledger.buckets["productive"] == pytest.approx(2 * (10 - 0.3) + 100) and ledger.buckets["rank_wait"] == pytest.approx(0.6)
    assert ledger.gpu and sum(ledger.buckets.values()) == pytest.approx(200)


def test_a_restart_to_an_older_checkpoint_loses_all_the_group_did():
    failed = [
        RankTime(
            rank=0,
            from_step=40,
            first_step_at=1050.0,
            totals=_t(productive=8),
            last_step=45,
            last_step_at=1058.0,
            at_last_step=_t(productive=8),
        )
    ]
    first = [RankTime(rank=0, first_step_at=1010.0, totals=_t(productive=30), at_saves={40: _t(productive=30)})]
    after = [RankTime(rank=0, from_step=40, first_step_at=1070.0, totals=_t(productive=20))]
    ledger = run_ledger(1, False, 1000.0, 1100.0, 1010.0, [first, failed, after])
    assert [r.lost_s for r in ledger.restarts] == [0.0, 8.0]
    assert ledger.buckets["productive"] == 50 and ledger.buckets["lost"] == 8


def test_time_beyond_the_slots_shows_and_other_is_never_negative():
    ranks = [RankTime(rank=0, first_step_at=1010.0, totals=_t(productive=120))]
    ledger = run_ledger(1, False, 1000.0, 1100.0, 1010.0, [ranks])
    assert ledger.buckets["other"] == 0 and sum(ledger.buckets.values()) == 130  # a test's "adds up within 2%" catches it


def test_a_resumed_runs_restore_is_apart_from_its_start_up():
    ranks = [RankTime(rank=0, from_step=80, first_step_at=1030.0, restore_s=4.0, totals=_t(productive=60))]
    ledger = run_ledger(1, False, 1000.0, 1100.0, 1030.0, [ranks])
    assert (ledger.buckets["startup"], ledger.buckets["checkpoint_restore"]) == (26, 4)


def test_a_run_that_never_stepped_was_all_start_up():
    ledger = run_ledger(4, False, 1000.0, 1030.0, None, [])
    assert ledger.buckets["startup"] == 120 and ledger.goodput == 0


def test_a_group_adds_up_its_runs_idle_slots_and_unfinished_runs():
    def record(status, allocated=None, wall=None, workers=1):
        ledger = (
            Ledger(workers=workers, allocated_s=allocated, buckets={"startup": 10.0, "productive": allocated - 10.0}) if allocated else None
        )
        return summary.RunRecord(status=Status(status), ledger=ledger, wall_time_s=wall, world_size=workers)

    costs = [
        run_cost("0", record("completed", 40.0)),
        run_cost("1", record("completed", 50.0)),
        run_cost("2", record("stopped", wall=12.0, workers=2)),  # ended by Tune in its process: no ledger
        run_cost("3", record("failed", 20.0)),
    ]
    group = group_ledger(costs, slots=2, wall_s=70.0, best="1")
    assert group.runs == 4 and group.allocated_s == 140 and group.runs_s == 134
    assert group.idle_s == 6 and group.allocated_s == pytest.approx(group.runs_s + group.idle_s)
    assert group.not_completed_s == {"stopped": 24.0, "failed": 20.0} and group.best_s == 50
    assert group.buckets["startup"] == 30 and group.buckets["other"] == 24 and group.buckets["productive"] == 80
    assert group.goodput == pytest.approx(80 / 140)


def test_old_records_have_no_ledger_and_ledgers_read_back(tmp_path):
    summary.write(tmp_path, summary.RunRecord(status=Status.COMPLETED))
    assert summary.read(tmp_path).ledger is None
    ranks = [RankTime(rank=0, first_step_at=5.0, totals=_t(productive=3))]
    written = summary.RunRecord(status=Status.COMPLETED, ledger=run_ledger(1, False, 0.0, 10.0, 5.0, [ranks]))
    summary.write(tmp_path, written)
    assert summary.read(tmp_path).ledger == written.ledger
    from raydra.records import jobs

    group = jobs.JobsRecord(ledger=GroupLedger(runs=2, slots=2, idle_s=1.5))
    assert jobs.JobsRecord.from_dict(group.to_dict()).ledger == group.ledger


def test_hooks_and_the_watch_give_the_ledger_its_figures():
    """A worker's TimeSpent switched by the hooks, reported with its heartbeats, and the Watch's
    waits from two ranks' step times: the RankTimes the ledger is built from."""
    clock = [100.0]

    def at(seconds):
        clock[0] = seconds

    spent = time_spent.TimeSpent(clock=lambda: clock[0])
    spent.switch("validation")  # the sanity check, before the first step: start-up's
    at(101.0)
    spent.first_step(0)
    at(101.5)
    spent.step_ended(1)
    at(101.6)
    spent.switch("productive")
    at(102.0)
    spent.switch("checkpoint_save")
    at(103.0)
    spent.saved(2, "productive")
    at(103.2)
    spent.step_ended(2)
    at(104.0)
    spent.switch("validation")
    at(105.0)
    report = spent.report()
    assert report["totals"] == {**_t(productive=0.5 + 0.4 + 0.2, data_wait=0.1 + 0.8, checkpoint_save=1.0, validation=1.0)}
    assert report["last_step"][:2] == [2, 103.2] and report["saves"][0][0] == 2

    watch = Watch(straggler_threshold=0.5, straggler_window=100)
    for rank in (0, 1):
        watch.register(rank, 2, "node", 1, 60.0)
    beat = {"phase": "train", "step": 2, "position": [2, 0, 0], "still_s": 0.0, "deadline_s": 60.0}
    # Rank 1 reaches each step's end 0.2 s after rank 0: rank 0 waits 0.2 s a step for it.
    watch.beat(0, 0, {**beat, "steps": [(1, 1, None, 101.5), (2, 2, None, 103.2)], "spent": report})
    watch.beat(1, 0, {**beat, "steps": [(1, 1, None, 101.7), (2, 2, None, 103.4)], "spent": report})
    # Rank 0 ended each step first and waited for rank 1 at the next step's first collective.
    (attempt,) = rank_times(watch.news()["time"])
    assert [r.rank for r in attempt] == [0, 1]
    assert attempt[0].waited == Waited(pytest.approx(0.4), pytest.approx(0.4)) and attempt[1].waited == Waited(0.0, 0.0)
    assert (
        attempt[0].waited_at_saves[2] == Waited(pytest.approx(0.4), pytest.approx(0.4)) and attempt[0].at_saves[2]["checkpoint_save"] == 1.0
    )
    # Then rank 1 reaches its backward 0.3 s late and both end together: rank 0 waited inside its step.
    watch.beat(0, 0, {**beat, "steps": [(3, 3, 104.0, 104.5)]})
    watch.beat(1, 0, {**beat, "steps": [(3, 3, 104.3, 104.5)]})
    (attempt,) = rank_times(watch.news()["time"])
    assert attempt[0].waited == Waited(pytest.approx(0.7), pytest.approx(0.4))
    assert attempt[0].first_step_at == 101.0 and attempt[0].last_step == 2


def test_a_killed_workers_last_step_outlives_it_and_reaches_the_watch(tmp_path, monkeypatch):
    """The end of a worker's last step, kept in shared memory (LastStep), is read by whoever comes
    after it on its node, once, and is fresher at the Watch than the worker's last heartbeat."""
    # The test's own folder, not /dev/shm.
    monkeypatch.setattr(time_spent, "_path", lambda run_id, attempt, rank: str(tmp_path / f"raydra-ledger-{run_id}-a{attempt}-r{rank}"))
    kept = time_spent.LastStep("run[1]", attempt=0, rank=1)
    for step in (37, 38, 39):
        kept.write(step, 1000.0 + step, tuple(float(step) for _ in range(6)))
    # A worker of another run on the node, and one of this run's next group (starting beside the
    # reader, whose own group's files are not its to take).
    time_spent.LastStep("other-run", attempt=0, rank=1).write(5, 1.0, tuple(0.0 for _ in range(6)))
    time_spent.LastStep("run[1]", attempt=1, rank=0).write(26, 2.0, tuple(0.0 for _ in range(6)))
    (left,) = time_spent.last_words("run[1]", before=1)
    assert (left["attempt"], left["rank"], left["last_step"][:2]) == (0, 1, [39, 1039.0])
    assert left["last_step"][2]["productive"] == 39.0 and time_spent.last_words("run[1]", before=1) == []
    assert [w["attempt"] for w in time_spent.last_words("run[1]")] == [1]  # the driver's, at the end: all

    watch = Watch(straggler_threshold=0.5, straggler_window=100)
    watch.register(1, 2, "node", 1, 60.0)
    report = {"from_step": 25, "first_step_at": 990.0, "restore_s": 0.0, "totals": {}, "last_step": [30, 1030.0, {}], "saves": []}
    watch.spent(1, 0, report)
    watch.last_words([left, {**left, "attempt": 3}])  # an attempt that never reported a step is the restart's
    (attempt,) = rank_times(watch.news()["time"])
    assert (attempt[0].last_step, attempt[0].last_step_at, attempt[0].at_last_step["productive"]) == (39, 1039.0, 39.0)
