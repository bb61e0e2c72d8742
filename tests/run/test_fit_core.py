"""The fit core (raydra.run.fit) against a stand-in for Ray Train's TorchTrainer, as Ray Train tests its
controller against a dummy worker group: what Ray is asked for (the run's name and storage, the
failures allowed, the checkpoints kept, the workers and their resources), what the record says of
a result, and how a failure and a hang end the fit. No Ray: the stand-in's scripted workers speak to
the run's watch as real ones do (test_watchdog runs the same for real)."""

import time
from pathlib import Path
from types import SimpleNamespace

import pandas
import pytest
from helpers import composed

from raydra.config.spec import WorkerOutcome
from raydra.run import fit, hang_watch, recording, resolve
from raydra.run.prepare import Invocation, prepare
from raydra.worker.checkpoint_report import UNVALIDATED
from raydra.worker.watchdog import END, ENDED


class StandInTrainer:
    """Takes what fit hands Ray Train's TorchTrainer; its fit() runs the test's script."""

    made = []
    script = None

    def __init__(self, train_loop, *, train_loop_config, datasets, torch_config, scaling_config, run_config):
        self.train_loop_config, self.scaling_config, self.run_config = train_loop_config, scaling_config, run_config
        StandInTrainer.made.append(self)

    def fit(self):
        return StandInTrainer.script(self)


@pytest.fixture
def stand_in(monkeypatch):
    made = {}

    def trainer_class(placement_group_cleaner=True, autoscaling_requests=True):
        made.update(placement_group_cleaner=placement_group_cleaner, autoscaling_requests=autoscaling_requests)
        return StandInTrainer

    StandInTrainer.made = []
    monkeypatch.setattr(fit, "torch_trainer_class", trainer_class)
    # The run's watch in this process (no Ray to hold it as an actor).
    monkeypatch.setattr(fit, "Watching", lambda failure, run_dir, local, run_id: hang_watch.Watching(failure, run_dir, True, run_id))
    return made


def _spec(tmp_path, *overrides):
    cfg = prepare(composed("experiment=vit_digits_smoke", *overrides), Invocation()).config
    return resolve.resolve(cfg, tmp_path, "2026-11-27_00-00-00_run_abc123")


def _result(spec, run_path):
    """A Result as Ray Train returns it: two epochs' reports, a mid-epoch checkpoint between them."""
    checkpoint = lambda name: SimpleNamespace(path=f"{run_path}/{name}")  # noqa: E731
    history = [
        {"val/acc": 0.5, "epoch": 0, "step": 40, "mid_epoch": 0},
        {"val/acc": UNVALIDATED["max"], "epoch": 1, "step": 60, "mid_epoch": 1},
        {"val/acc": 0.4, "epoch": 1, "step": 80, "mid_epoch": 0},
    ]
    kept = [(checkpoint(f"checkpoint_{i}"), metrics) for i, metrics in enumerate(history)]
    return SimpleNamespace(
        metrics=history[-1],
        metrics_dataframe=pandas.DataFrame(history),
        best_checkpoints=kept,
        checkpoint=kept[-1][0],
        path=run_path,
        error=None,
        return_value=WorkerOutcome(test_metrics={"test/acc": 0.45}, global_step=80, epochs_completed=2, world_size=2),
    )


def test_ray_is_asked_for_the_runs_name_storage_failures_checkpoints_and_workers_and_the_record_reads_its_result(stand_in, tmp_path):
    spec = _spec(
        tmp_path,
        "scale.num_workers=2",
        "failure.max_failures=3",
        "checkpoint.num_to_keep=1",
        "ledger.price_per_hour=3",
        "ledger.price_per_cpu_hour=0.5",
    )
    run_path = str(tmp_path / "checkpoints" / spec.place.id)
    StandInTrainer.script = lambda trainer: _result(spec, run_path)
    started = recording.record_start(spec, recording.new_summary(composed("experiment=vit_digits_smoke"), tmp_path, spec.place.id, []))
    done = fit.fit_and_record(spec, started, 0.0, process_ends_with_run=True)

    (trainer,) = StandInTrainer.made
    run = trainer.run_config
    assert run.name == spec.place.id and Path(run.storage_path) == tmp_path / "checkpoints"
    assert run.failure_config.max_failures == 3 and run.failure_config.controller_failure_limit != 0
    assert (run.checkpoint_config.num_to_keep, run.checkpoint_config.checkpoint_score_attribute) == (1, "val/acc")
    assert trainer.scaling_config.num_workers == 2 and trainer.scaling_config.resources_per_worker == {"CPU": 1.0}
    assert trainer.train_loop_config["spec"].place.id == spec.place.id and trainer.train_loop_config["watch"] is not None
    assert stand_in == {"placement_group_cleaner": False, "autoscaling_requests": True}
    # The record: the best epoch-end checkpoint (never the mid-epoch one, whose monitor is unvalidated),
    # relative to the run's directory; the last report's metrics with the test's; the watchdog's settings.
    assert done.status == "completed" and done.checkpoints.best == f"checkpoints/{spec.place.id}/checkpoint_0/checkpoint.ckpt"
    assert done.checkpoints.last == f"checkpoints/{spec.place.id}/checkpoint_2/checkpoint.ckpt"
    assert done.metrics.final["test/acc"] == 0.45 and done.metrics.best["val/acc"] == 0.5
    assert done.global_step == 80 and done.hangs == [] and done.watchdog["step_timeout_min_s"] == 90.0
    # Its compute ledger, with the price of a CPU run's worker-hour (ledger.price_per_cpu_hour wins).
    assert done.ledger.workers == 2 and done.ledger.price_per_hour == 0.5


def test_the_hugging_face_export_is_written_from_the_best_checkpoint_before_the_record_says_completed(stand_in, tmp_path, monkeypatch):
    """Rank 0 says what the export holds; the driver writes it with the best checkpoint's weights
    (what raydra.load gives), not the last one's, and the record says completed once it is there."""
    import torch
    from safetensors.torch import load_file

    from raydra.records import hf_export, summary
    from raydra.records.hf_export import HFExport

    spec = _spec(tmp_path, "scale.num_workers=2")
    run_path = tmp_path / "checkpoints" / spec.place.id
    for i in range(3):  # each checkpoint's weights hold its number
        (run_path / f"checkpoint_{i}").mkdir(parents=True)
        weights = {"net.w": torch.full((2,), float(i)), "loss.x": torch.zeros(1)}
        torch.save({"state_dict": weights}, run_path / f"checkpoint_{i}" / "checkpoint.ckpt")
    result = _result(spec, str(run_path))
    result.return_value = WorkerOutcome(hf_export=HFExport(config='{"model_type": "vit"}\n', weights=("net.",), strip="net."), world_size=2)
    StandInTrainer.script = lambda trainer: result
    status_as_written = []
    write = hf_export.write
    monkeypatch.setattr(hf_export, "write", lambda *args: status_as_written.append(summary.read(tmp_path).status) or write(*args))

    started = recording.record_start(spec, recording.new_summary(composed("experiment=vit_digits_smoke"), tmp_path, spec.place.id, []))
    done = fit.fit_and_record(spec, started, 0.0)
    assert done.checkpoints.best == f"checkpoints/{spec.place.id}/checkpoint_0/checkpoint.ckpt"
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    assert list(exported) == ["w"] and torch.equal(exported["w"], torch.zeros(2))
    assert (tmp_path / "hf" / "config.json").read_text() == '{"model_type": "vit"}\n'
    assert status_as_written == ["running"] and summary.read(tmp_path).status == "completed"


def test_a_tune_trial_asks_for_a_group_that_fails_rather_than_waits(stand_in, tmp_path):
    spec = _spec(tmp_path, "scale.num_workers=1")
    StandInTrainer.script = lambda trainer: _result(spec, str(tmp_path / "c"))
    fit.fit_and_record(spec, recording.new_summary(composed(), tmp_path, spec.place.id, []), 0.0, tune_trial=True)
    (trainer,) = StandInTrainer.made
    assert trainer.run_config.failure_config.controller_failure_limit == 0
    assert stand_in["placement_group_cleaner"] is True


def _workers_hang(trainer, rank_behind=1):
    """Two scripted workers: both report, then `rank_behind` stops past its deadline and every rank
    hands over its stacks, as the workers' watchdogs do."""
    link = trainer.train_loop_config["watch"]
    attempt = [link("register", rank, 2, f"node-{rank}", 100 + rank, 900.0) for rank in (0, 1)][0]
    beat = lambda position, still: {"phase": "train", "step": 25, "position": position, "still_s": still, "deadline_s": 90.0}  # noqa: E731
    link("beat", 1 - rank_behind, attempt, beat([26, END, 0], 80.0))
    number = link("beat", rank_behind, attempt, beat([25, END, 0], 95.0))
    for rank in (0, 1):
        link("stacks", number, rank, f"rank {rank}'s stacks", None)
    return link


def test_a_hang_in_the_last_worker_group_ends_the_fit_hung_and_one_in_an_earlier_group_is_recorded_restarted(stand_in, tmp_path):
    spec = _spec(tmp_path, "scale.num_workers=2", "failure.max_failures=1")
    opening = recording.new_summary(composed(), tmp_path, spec.place.id, [])

    def hang_then_restart(trainer):
        link = _workers_hang(trainer)
        attempt = link("register", 0, 2, "node-0", 200, 900.0)  # the restarted group
        link("beat", 0, attempt, {"phase": "train", "step": 30, "position": [5, ENDED, 0], "still_s": 0.1, "deadline_s": 90.0})
        return _result(spec, str(tmp_path / "c"))

    StandInTrainer.script = hang_then_restart
    done = fit.fit_and_record(spec, opening, 0.0)
    (hang,) = done.hangs
    assert done.status == "completed" and hang.outcome == "restarted" and [r.rank for r in hang.stopped] == [1]
    assert (tmp_path / "diagnostics" / "hang-1" / "rank1.stacks.txt").read_text() == "rank 1's stacks"

    def hang_then_die(trainer):
        _workers_hang(trainer, rank_behind=0)
        raise RuntimeError("Worker group failed: the actor died unexpectedly")  # Ray Train, of the ended workers

    StandInTrainer.script = hang_then_die
    with pytest.raises(hang_watch.RunHung) as ended:
        fit.fit_and_record(spec, opening, 0.0, marks={"run_began": time.time() - 10.0})
    record = recording.failure(opening, ended.value, 0.0)
    # What the hung run cost is on its record: both workers' slots for its 10 s, no step taken.
    assert record.ledger.workers == 2 and record.ledger.buckets["startup"] == record.ledger.allocated_s == pytest.approx(20, abs=1)
    assert record.status == "failed" and record.error.startswith("hung: rank 0 (node-0) made no progress in train after step 25")
    assert record.hangs[-1].outcome == "ended"


def test_a_failure_without_a_hang_is_the_fits_own_error(stand_in, tmp_path):
    spec = _spec(tmp_path, "scale.num_workers=2")
    result = _result(spec, str(tmp_path / "c"))
    result.error = RuntimeError("CUDA error: an illegal memory access")
    StandInTrainer.script = lambda trainer: result
    with pytest.raises(RuntimeError, match="illegal memory access") as failed:
        fit.fit_and_record(
            spec, recording.new_summary(composed(), tmp_path, spec.place.id, []), 0.0, marks={"run_began": time.time() - 5.0}
        )
    # The error carries the run's compute ledger to the record its ending writes (RunSequence.fit).
    assert fit.ledger_of(failed.value).allocated_s == pytest.approx(10, abs=1)
