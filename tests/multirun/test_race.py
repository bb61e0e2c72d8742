"""hydra/sweeper=race at its seam with raydra's launcher (raydra.multirun.feed): the launcher is
simulated (tests/feed_probe.py), each job's metric comes from a known curve per learning rate plus a
known noise per seed; the race's statistics are raydra.multirun.racing's (their own tests:
test_race_statistics.py). Its real run on Ray: tests/system/test_sweepers.py. No Ray, ~2 s."""

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, List

import feed_probe
import pytest
from omegaconf import OmegaConf

from hydra_plugins.raydra_sweepers.race import RaceSweeperConf
from raydra.errors import RaydraError
from raydra.multirun.race import SeedRace, configurations_of
from raydra.records import race as race_record
from raydra.records.envelope import Status

# val/acc by learning rate: 1e-4 far behind; 1e-3 and 3e-3 within noise of each other; 3e-4 a few
# noise sds behind them: not beyond noise at 2 seeds, but out of reach.
LEVELS = {1e-4: 0.20, 3e-4: 0.585, 1e-3: 0.60, 3e-3: 0.598}
LRS = "model.optimizer.lr=1e-4,3e-4,1e-3,3e-3"


def _value(overrides: List[str], key: str) -> float:
    return float(next(o for o in overrides if o.startswith(f"{key}=")).split("=", 1)[1])


def curve(overrides: List[str], epochs: int = 3) -> List[float]:
    """The job's val/acc by epoch: its learning rate's level, what its seed does to every
    configuration alike (shared), and a little noise of its own; it rises to its last epoch."""
    lr, seed = _value(overrides, "model.optimizer.lr"), int(_value(overrides, "seed"))
    shared = random.Random(seed).gauss(0, 0.02)
    own = random.Random(f"{seed}/{lr}").gauss(0, 0.004)
    final = LEVELS[lr] + shared + own
    return [final - 0.1 * (epochs - 1 - e) for e in range(epochs)]


@dataclass
class SimulatedLauncher(feed_probe.SimulatedLauncher):
    curve: Callable[[List[str]], List[float]] = curve


def _config(sweep_dir, resume: bool = False, app: bool = False) -> Any:
    config: Dict[str, Any] = {
        "hydra": {"sweep": {"dir": str(sweep_dir)}, "launcher": {"resume": resume}, "runtime": {"choices": {"model": "vit"}}},
        "model": {"_target_": "raydra.models.vit.ViTClassifier", "optimizer": {"lr": 1e-3}},
        "seed": 42,
    }
    if not app:
        config["checkpoint"] = {"monitor": "val/acc", "mode": "max"}
    return OmegaConf.create(config)


def _settings(**changed) -> Dict[str, Any]:
    """hydra.sweeper.* as Hydra hands them to the sweeper: RaceSweeperConf's defaults, less `_target_`."""
    settings = {key: value for key, value in dataclasses.asdict(RaceSweeperConf()).items() if key != "_target_"}
    return {**settings, **changed}


def _race(tmp_path, launcher: Any, sweep=(LRS,), resume=False, app=False, **settings) -> SeedRace:
    race = SeedRace(_settings(**settings), launcher, _config(tmp_path / "race", resume=resume, app=app))
    race.sweep(list(sweep))
    return race


def _lr(record: race_record.RaceRecord, config: int) -> float:
    return _value(record.configurations[config].overrides, "model.optimizer.lr")


def test_configurations_are_hydras_cartesian_product_and_the_rest_is_shared():
    configs, fixed = configurations_of(["model=vit,sd_tiny", "model.optimizer.lr=1e-3,1e-4", "trainer.max_epochs=3", "seed=7"], "seed")
    # Values as Hydra's basic sweeper writes them into each job's overrides.
    assert configs == [
        ["model=vit", "model.optimizer.lr=0.001"],
        ["model=vit", "model.optimizer.lr=0.0001"],
        ["model=sd_tiny", "model.optimizer.lr=0.001"],
        ["model=sd_tiny", "model.optimizer.lr=0.0001"],
    ]
    # A single seed= is where the race's seeds start (the composed config's): no job gets it twice.
    assert fixed == ["trainer.max_epochs=3"]


def test_a_race_spends_seeds_where_they_decide_stops_a_dropped_configurations_job_and_records_its_verdict(tmp_path):
    launcher = SimulatedLauncher()
    _race(tmp_path, launcher)
    record = race_record.read(tmp_path / "race")
    assert record.status == Status.COMPLETED and record.seeds == [42, 43, 44, 45, 46]
    by_lr = {_lr(record, c): config for c, config in enumerate(record.configurations)}
    # 1e-4 is beaten beyond noise at the first look, on its two seeds; 1e-3 and 3e-3 are within noise: both reach max_seeds.
    assert by_lr[1e-4].standing == "dropped" and by_lr[1e-4].against_leader.seeds == 2 and sorted(by_lr[1e-4].results) == ["42", "43"]
    assert by_lr[1e-4].against_leader.p <= 0.05 and by_lr[1e-4].against_leader.ci[0] > 0
    # 3e-4 is not beaten beyond noise at 2 seeds, but has less than futility's 10% chance of ending 5 seeds ahead: it leaves too.
    out = by_lr[3e-4].against_leader
    assert by_lr[3e-4].standing == "out of reach" and out.seeds == 2 and len(by_lr[3e-4].results) == 2
    assert out.p > 0.05 and out.overtake < 0.1 and record.futility == 0.1
    assert record.looks[0].out_of_reach == [1] and record.looks[0].dropped == [0]
    assert {by_lr[1e-3].standing, by_lr[3e-3].standing} == {"winner", "undecided"} and not record.decided
    assert len(by_lr[1e-3].results) == len(by_lr[3e-3].results) == 5
    assert record.configurations[record.winner].standing == "winner"
    assert by_lr[1e-3 if by_lr[1e-3].standing == "undecided" else 3e-3].against_leader.p > 0.05
    # Paid for: fewer jobs than the grid's 20, and every job asked for is in the record once.
    assert record.grid_jobs == 20 and record.jobs_started == len(launcher.asked) < 20
    assert sorted(int(n) for n in record.jobs) == launcher.asked == list(range(len(launcher.asked)))
    # A job whose configuration was dropped while it ran was stopped (pruned), and its result is not the race's.
    for end in launcher.ended:
        job = record.jobs[str(end.num)]
        if end.status == Status.PRUNED:
            assert job.status == Status.PRUNED and record.configurations[job.config].standing in ("dropped", "out of reach")
            assert str(record.seeds[job.seed]) not in record.configurations[job.config].results
    # Looks came at levels, the first at min_seeds.
    assert [look.level for look in record.looks] == list(range(2, 2 + len(record.looks)))


def test_a_race_record_that_does_not_say_its_settings_reads_them_unset_and_compare_shows_them_unknown(tmp_path):
    import json

    from raydra.compare.race_text import race_lines

    _race(tmp_path, SimulatedLauncher())
    path = tmp_path / "race" / "race.json"
    said = json.loads(path.read_text())
    for key in ("min_seeds", "max_seeds", "alpha", "futility", "seed_name"):
        del said[key]
    path.write_text(json.dumps(said))
    record = race_record.read(tmp_path / "race")
    # Unset, not the sweeper's defaults made up for it, and compare says it does not know.
    assert (record.min_seeds, record.max_seeds, record.alpha, record.futility, record.seed_name) == (None,) * 5
    header, *_, columns = race_lines(record, "race")[:3]
    assert header.endswith("configurations, ? 42-46 (min_seeds ?, max_seeds ?), alpha ?, futility ?"), header
    assert "leader's advantage [CI]" in columns and "p (adjusted)" in columns


def test_a_race_whose_driver_was_killed_resumes_from_its_finished_jobs_and_reaches_the_same_verdict(tmp_path):
    whole = SimulatedLauncher()
    _race(tmp_path / "whole", whole)
    expected = race_record.read(tmp_path / "whole" / "race")

    lost = SimulatedLauncher(lost_after=5)
    with pytest.raises(SystemExit):
        _race(tmp_path, lost)
    completed = {end.num: end.value for end in lost.ended if end.status == Status.COMPLETED}
    resumed = SimulatedLauncher(kept=completed)
    _race(tmp_path, resumed, resume=True)
    record = race_record.read(tmp_path / "race")
    # No finished job ran again: each was asked for again and kept at once.
    ran_again = [end.num for end in resumed.ended if end.num in completed]
    assert ran_again == [] and set(completed) <= set(resumed.asked)
    assert record.status == Status.COMPLETED and len(record.resumed) == 1
    assert record.winner == expected.winner and [c.standing for c in record.configurations] == [c.standing for c in expected.configurations]
    assert [(look.level, look.leader, look.dropped, look.out_of_reach) for look in record.looks] == [
        (look.level, look.leader, look.dropped, look.out_of_reach) for look in expected.looks
    ]

    # Resumed with other configurations: refused, naming what the race ran.
    with pytest.raises(RaydraError, match="resume with the command that started it"):
        _race(tmp_path, SimulatedLauncher(), sweep=("model.optimizer.lr=1e-4,3e-4",), resume=True)


def test_a_race_recorded_before_out_of_reach_drops_resumes_as_it_raced_without_them(tmp_path):
    import json

    with pytest.raises(SystemExit):
        _race(tmp_path, SimulatedLauncher(lost_after=5), futility=0.0)
    path = tmp_path / "race" / "race.json"
    said = json.loads(path.read_text())
    del said["futility"]
    path.write_text(json.dumps(said))
    with pytest.raises(RaydraError, match="'futility': 0.0"):
        _race(tmp_path, SimulatedLauncher(), resume=True)
    _race(tmp_path, SimulatedLauncher(), resume=True, futility=0.0)
    record = race_record.read(tmp_path / "race")
    assert record.status == Status.COMPLETED and not any(look.out_of_reach for look in record.looks)


def test_a_failed_job_stops_the_asking_lets_the_running_one_end_and_the_race_says_how_to_continue(tmp_path):
    launcher = SimulatedLauncher(failing={1})
    _race(tmp_path, launcher)
    record = race_record.read(tmp_path / "race")
    # Nothing asked for after job 1 failed; job 0, running beside it, ran to its end (a resumed race uses it).
    assert launcher.asked == [0, 1] and [(e.num, e.status) for e in launcher.ended] == [(1, Status.FAILED), (0, Status.COMPLETED)]
    assert record.jobs["0"].status == Status.COMPLETED and record.jobs["1"].status == Status.FAILED
    assert record.winner is None and record.status == Status.FAILED
    assert "job #1" in record.stopped and "ValueError: boom" in record.stopped and "hydra.launcher.resume=true" in record.stopped


def test_misuse_is_refused_in_one_sentence_before_any_job(tmp_path):
    class NoJobs:
        def launch_as_slots_free(self, feed: Any) -> None:
            raise AssertionError("no job may start")

    def refused(sweep=(LRS,), **settings) -> str:
        with pytest.raises(RaydraError) as error:
            _race(tmp_path, NoJobs(), sweep=sweep, **settings)
        assert "\n" not in str(error.value)
        return str(error.value)

    assert "only one" in refused(sweep=("model.optimizer.lr=choice(1e-3)",))
    assert "sweeps none" in refused(sweep=("trainer.max_epochs=3",))
    assert "leave seed out of the sweep" in refused(sweep=(LRS, "seed=1,2,3"))
    assert "min_seeds=6 is more than hydra.sweeper.max_seeds=5" in refused(min_seeds=6)
    assert "min_seeds=1 must be a whole number of at least 2" in refused(min_seeds=1)
    assert "not an interval" in refused(sweep=("model.optimizer.lr=interval(1e-4,1e-2)",))
    assert "hydra.sweeper.metric=val/accuracy is not a metric ViTClassifier logs" in refused(metric="val/accuracy")
    assert "hydra.sweeper.mode=maximize must be min or max" in refused(mode="maximize")
    assert "alpha=0 must be a probability" in refused(alpha=0)
    assert "futility=1 must be a probability from 0" in refused(futility=1)
    assert "the composed config does not have" in refused(sweep=("model.optimizer.lrr=1e-4,1e-3",))
    assert "holds no race to continue" in refused(resume=True)
    with pytest.raises(RaydraError, match="mode must be min or max for this app's jobs"):
        _race(tmp_path, NoJobs(), app=True)
    # Nothing was written by a refusal.
    assert not (tmp_path / "race" / "race.json").exists()


def test_another_metric_becomes_the_jobs_checkpoint_monitor(tmp_path):
    launcher = SimulatedLauncher()
    seen: List[List[str]] = []
    launcher.curve = lambda overrides: seen.append(overrides) or [1.0 - v for v in curve(overrides)]
    _race(tmp_path, launcher, metric="val/loss", mode="min")
    assert all("checkpoint.monitor=val/loss" in o and "checkpoint.mode=min" in o for o in seen)
    record = race_record.read(tmp_path / "race")
    assert record.metric == "val/loss" and record.mode == "min" and _lr(record, record.winner) in (1e-3, 3e-3)


def test_with_another_launcher_jobs_run_in_hydras_batches(tmp_path):
    launcher = feed_probe.BatchLauncher(curve)
    _race(tmp_path, launcher)
    record = race_record.read(tmp_path / "race")
    assert launcher.batches[0] == (0, 2) and all(size <= 2 for _, size in launcher.batches)
    assert record.status == Status.COMPLETED and record.winner is not None
    assert record.jobs_started == sum(size for _, size in launcher.batches)
