"""hydra/sweeper=optuna_async's study at its seam with raydra's launcher (raydra.multirun.feed): the
launcher is simulated here (jobs whose epochs come from a known curve, two at a time), the study is
Optuna's own, in its journal file. Its real run on Ray: tests/system/test_sweepers.py. No Ray, ~2 s."""

from dataclasses import dataclass
from typing import Any, Callable, Dict, List

import feed_probe
import optuna
import pytest
import yaml
from omegaconf import OmegaConf

from raydra.errors import RaydraError
from raydra.multirun.feed import JobEnd
from raydra.multirun.optuna_sweeper import OptunaSweep, space_of
from raydra.records.envelope import Status


def _config(sweep_dir, resume: bool = False, app: bool = False) -> Any:
    config = {
        "hydra": {"sweep": {"dir": str(sweep_dir)}, "launcher": {"resume": resume}, "runtime": {"choices": {"model": "vit"}}},
        "model": {"optimizer": {"lr": 1e-3}},
        "trainer": {"max_epochs": 4},
    }
    if not app:
        config["checkpoint"] = {"monitor": "val/acc", "mode": "max"}
    return OmegaConf.create(config)


def _settings(**changed) -> Dict[str, Any]:
    return {
        "n_trials": 8,
        "direction": None,
        "sampler": optuna.samplers.RandomSampler(seed=0),
        "pruner": None,
        "params": None,
        "max_failure_rate": 0.0,
        "n_jobs": 2,
        **changed,
    }


def _lr(overrides: List[str]) -> float:
    return float(next(o for o in overrides if o.startswith("model.optimizer.lr=")).split("=", 1)[1])


def curve(overrides: List[str], epochs: int = 4) -> List[float]:
    """val/acc by epoch: the larger the learning rate (up to 1e-2), the faster it learns."""
    return [0.1 + 20 * _lr(overrides) * (epoch + 1) for epoch in range(epochs)]


@dataclass
class SimulatedLauncher(feed_probe.SimulatedLauncher):
    curve: Callable[[List[str]], List[float]] = curve


def _sweep(tmp_path, launcher: Any, space=("model.optimizer.lr=tag(log,interval(1e-4,1e-2))",), resume=False, **settings) -> OptunaSweep:
    sweep = OptunaSweep(_settings(**settings), launcher, _config(tmp_path / "sweep", resume=resume))
    sweep.sweep(list(space))
    return sweep


def _study(tmp_path) -> Any:
    path = tmp_path / "sweep" / "optuna_study.journal"
    return optuna.load_study(
        study_name="sweep", storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    )


def test_a_space_in_hydras_override_grammar_becomes_optunas_distributions():
    space, fixed = space_of(
        ["opt=sgd,adam", "n=range(1,5)", "x=interval(0.1,1.0)", "lr=tag(log,interval(1e-4,1e-2))", "w=range(0.5,2.0,0.5)", "seed=3"]
    )
    dist = optuna.distributions
    assert space["opt"] == dist.CategoricalDistribution(["sgd", "adam"])
    # Hydra's range leaves out its stop, as Python's does.
    assert space["n"] == dist.IntDistribution(1, 4)
    assert space["x"] == dist.FloatDistribution(0.1, 1.0)
    assert space["lr"] == dist.FloatDistribution(1e-4, 1e-2, log=True)
    assert space["w"] == dist.FloatDistribution(0.5, 1.5, step=0.5)
    assert fixed == ["seed=3"]


def test_a_study_asks_as_jobs_end_prunes_with_optunas_pruner_and_resumes_without_running_an_ended_trial_again(tmp_path):
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    lost = SimulatedLauncher(lost_after=5)
    with pytest.raises(SystemExit):
        _sweep(tmp_path, lost, pruner=pruner)
    # Numbered in the order asked; the driver was lost as the fifth ended, before its slot was refilled.
    assert lost.asked == list(range(6))
    pruned = [end for end in lost.ended if end.status == Status.PRUNED]
    assert pruned, "the median pruner stopped no trial that stays near chance"
    for end in pruned:
        # Pruned at the decision's epoch, with that epoch's metric as the trial's value.
        assert _study(tmp_path).trials[end.num].value == pytest.approx(end.value)
    before = {t.number: (t.state, t.value) for t in _study(tmp_path).trials}
    running = sorted(n for n, (state, _) in before.items() if state == optuna.trial.TrialState.RUNNING)
    assert running == sorted(set(lost.asked) - {end.num for end in lost.ended}) and len(running) == 1

    # A new sweep in the same directory is refused; resumed, its running trials continue first.
    with pytest.raises(RaydraError, match="already holds an Optuna study"):
        _sweep(tmp_path, SimulatedLauncher(), pruner=pruner)
    resumed = SimulatedLauncher()
    _sweep(tmp_path, resumed, pruner=pruner, resume=True)
    assert resumed.asked[:1] == running and sorted(resumed.asked) == [*running, 6, 7]
    after = _study(tmp_path).trials
    assert len(after) == 8 and all(t.state.is_finished() for t in after)
    for number, (state, value) in before.items():
        if state.is_finished():
            assert (after[number].state, after[number].value) == (state, value)
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    best = max((t for t in after if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.value)
    assert results["best_value"] == pytest.approx(best.value) and results["best_params"] == best.params

    # Resumed with another space: refused, naming what the study searched.
    with pytest.raises(RaydraError, match="resume with the command that started it"):
        _sweep(tmp_path, SimulatedLauncher(), space=("model.optimizer.lr=interval(1e-4,1e-2)",), resume=True)


def test_a_failed_trial_over_the_failure_rate_ends_the_asking_and_the_running_ones_still_end(tmp_path):
    class FailingLauncher(SimulatedLauncher):
        def launch_as_slots_free(self, feed: Any) -> List[Any]:
            job = feed.next_job()
            feed.job_ended(JobEnd(num=job.num, status=Status.FAILED, error="ValueError: boom"))
            return super().launch_as_slots_free(feed)

    launcher = FailingLauncher()
    _sweep(tmp_path, launcher)
    # One failure of one ended trial is over max_failure_rate=0.0: nothing more is asked.
    assert launcher.asked == []
    assert [t.state.name for t in _study(tmp_path).trials] == ["FAIL"]


def test_misuse_is_refused_in_one_sentence_before_any_job(tmp_path):
    class NoJobs:
        def launch_as_slots_free(self, feed: Any) -> None:
            raise AssertionError("no job may start")

    def refused(space=("model.optimizer.lr=interval(1e-4,1e-2)",), app=False, resume=False, **settings) -> str:
        sweep = OptunaSweep(_settings(**settings), NoJobs(), _config(tmp_path / "sweep", resume=resume, app=app))
        with pytest.raises(RaydraError) as refusal:
            sweep.sweep(list(space))
        return str(refusal.value)

    assert "names model.optimizer.lrr, which the composed config does not have" in refused(space=("model.optimizer.lrr=1e-3,1e-2",))
    assert "no space to search" in refused(space=("model.optimizer.lr=1e-3",))
    assert "hydra.sweeper.n_trials=0" in refused(n_trials=0)
    assert "works against checkpoint.mode=max" in refused(direction="minimize")
    assert "hydra.sweeper.pruner needs jobs that log their metric per epoch" in refused(app=True, pruner=optuna.pruners.MedianPruner())
    assert "holds no Optuna study to continue" in refused(resume=True)
    # A config group and a key added with + are a space too.
    for space in (("model=vit,sd_tiny",), ("+model.extra=1,2",)):
        with pytest.raises(AssertionError, match="no job may start"):
            OptunaSweep(_settings(), NoJobs(), _config(tmp_path / f"ok{len(space[0])}")).sweep(list(space))


def test_with_another_launcher_trials_run_in_hydras_batches(tmp_path):
    launcher = feed_probe.BatchLauncher(curve)
    _sweep(tmp_path, launcher, n_trials=5, n_jobs=2)
    assert launcher.batches == [(0, 2), (2, 2), (4, 1)]
    assert [t.state.name for t in _study(tmp_path).trials] == ["COMPLETE"] * 5


def test_without_a_pruner_no_trial_is_pruned_and_every_epoch_is_still_in_the_study(tmp_path):
    # Optuna's own default pruner is its MedianPruner: hydra.sweeper.pruner=null must mean none.
    launcher = SimulatedLauncher()
    _sweep(tmp_path, launcher, n_trials=8)
    assert {end.status for end in launcher.ended} == {Status.COMPLETED}
    assert all(len(t.intermediate_values) == 4 for t in _study(tmp_path).trials)
