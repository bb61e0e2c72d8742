"""The run's W&B run at raydra's seams (raydra.records.wandb_run, raydra.worker.wandb_logger): what a run
directory's W&B files hold, completing a run whose worker never flushed, the checkpoints log_model
sends, the keys logger.wandb takes, and the name, job type, mode and group a run logs under. W&B
writes its real files here, offline; they are read back with W&B's own reader (helpers.wandb_segments).
The real runs that end every way (a worker SIGKILLed and restarted, SIGTERM then resume=, a trial
ASHA stopped) are in test_reliability.py and test_sweep.py."""

import csv
import inspect
from pathlib import Path

import pytest
from helpers import assert_wandb_holds_the_run, composed, wandb_segments

from raydra.private_apis.wandb import wandb_records
from raydra.records import summary, wandb_run
from raydra.records.summary import Checkpoints, Monitor, RunRecord
from raydra.records.wandb_run import RunSettings
from raydra.run import resolve
from raydra.run.prepare import Invocation, prepare

MONITOR = "val/acc"
# metrics.csv as Lightning's CSV writer leaves it: a row per log call, the epoch in each.
CSV_ROWS = [
    {"epoch": 0, "step": 9, "train/loss_step": 2.3},
    {"epoch": 0, "step": 19, "train/loss_step": 2.1},
    {"epoch": 0, "step": 19, "val/acc": 0.40, "val/loss": 1.9},
    {"epoch": 1, "step": 29, "train/loss_step": 1.7},
    {"epoch": 1, "step": 39, "train/loss_step": 1.2},
    {"epoch": 1, "step": 39, "val/acc": 0.75, "val/loss": 1.1},
    {"epoch": 2, "step": 49, "train/loss_step": 1.0},
    {"epoch": 2, "step": 59, "val/acc": 0.70, "val/loss": 1.2},
]


def _run_dir(tmp_path: Path, ended: RunRecord, log_model=False) -> Path:
    """A run directory as a run's processes leave it: summary.json, metrics.csv, the W&B settings
    the worker started its W&B run with."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary.write(run_dir, ended)
    with (run_dir / "metrics.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=sorted({k for row in CSV_ROWS for k in row}))
        writer.writeheader()
        writer.writerows(CSV_ROWS)
    settings = {"project": "raydra", "mode": "offline", "group": "g", "job_type": "run", "name": ended.run_id, "log_model": log_model}
    RunSettings.of(settings, ["smoke"], {"model": {"lr": 0.1}}, MONITOR, "max").save(run_dir)
    return run_dir


def _worker_segment_cut_short(run_dir: Path, rows: int) -> None:
    """A worker's segment that logged every row of metrics.csv and was killed with only the first
    `rows` on disk: written whole by W&B, then cut inside the next record (what a kill leaves)."""
    settings = RunSettings.read(run_dir)
    segment = wandb_run.started(settings, "r1", run_dir, wandb_run.Held())
    for number, row in enumerate(wandb_run.rows(run_dir)):
        wandb_run.log_row(segment, row, settings, number)
    wandb_run.finish(segment, 0)
    (path,) = wandb_run.segments(run_dir)
    kept = sum(1 for r in wandb_records(path) if r.WhichOneof("record_type") == "history")
    assert kept == len(CSV_ROWS)
    data = path.read_bytes()
    # The offset of the (rows + 1)-th history row: W&B's own reader tells where records lie.
    cut, seen = None, 0
    for offset in range(len(data), 0, -64):
        path.write_bytes(data[:offset])
        seen = sum(1 for r in wandb_records(path) if r.WhichOneof("record_type") == "history")
        if seen <= rows:
            cut = offset
            break
    assert cut is not None and seen == rows


def test_a_run_whose_worker_was_killed_before_it_flushed_is_completed_once_with_how_it_ended(tmp_path):
    ended = RunRecord.started(run_id="r1", run_dir=str(tmp_path / "run"), monitor=Monitor(MONITOR, "max")).failed("the worker died")
    run_dir = _run_dir(tmp_path, ended)
    _worker_segment_cut_short(run_dir, rows=3)
    # raydra reads the cut file as wandb 0.29's DataStore does (wandb 0.31 ships no reader): up to the cut.
    (theirs,) = wandb_segments(run_dir)
    assert [row["trainer/global_step"] for row in theirs["history"]] == [9, 19, 19] and theirs["exit_code"] is None
    held = wandb_run.held(run_dir)
    assert held.logged == {(9, "train/loss_step"), (19, "train/loss_step"), (19, "val/acc"), (19, "val/loss")}
    assert held.last_step == 2 and held.exit_code is None and held.has_config
    with pytest.raises(AssertionError, match="in no W&B file"):
        assert_wandb_holds_the_run(run_dir, "failed")

    assert wandb_run.complete(run_dir) is True
    segments = assert_wandb_holds_the_run(run_dir, "failed")
    closing = segments[-1]
    # The closing segment holds only what was missing, numbered on from W&B's last row.
    assert [row["_step"] for row in closing["history"]] == [3, 4, 5, 6, 7]
    assert closing["summary"]["raydra/error"] == "the worker died"
    assert closing["summary"]["best/val/acc"] == 0.75 and closing["summary"]["best/step"] == 39
    assert closing["run"]["id"] == "r1" and closing["run"]["group"] == "g" and closing["run"]["tags"] == ["smoke"]
    # Nothing more to say: a second driver (a resume= that is refused, a settled sweep) adds nothing.
    assert wandb_run.complete(run_dir) is False
    assert len(wandb_run.segments(run_dir)) == 2


def test_log_model_true_sends_the_best_and_last_checkpoints_as_the_run_s_model_artifact(tmp_path):
    checkpoints = tmp_path / "run" / "checkpoints"
    ended = RunRecord.started(run_id="r1", run_dir=str(tmp_path / "run"), monitor=Monitor(MONITOR, "max")).completed(
        0.0, checkpoints=Checkpoints(best="checkpoints/best/checkpoint.ckpt", last="checkpoints/last/checkpoint.ckpt")
    )
    run_dir = _run_dir(tmp_path, ended, log_model=True)
    for name in ("best", "last"):
        (checkpoints / name).mkdir(parents=True)
        (checkpoints / name / "checkpoint.ckpt").write_bytes(name.encode())
    assert wandb_run.complete(run_dir) is True
    (segment,) = wandb_segments(run_dir)
    # W&B gives each version it logs "latest" too; the last one logged keeps it.
    logged = [(a["name"], a["type"], sorted(a["aliases"])) for a in segment["artifacts"]]
    assert logged == [("model-r1", "model", ["best", "latest"]), ("model-r1", "model", ["latest"])]
    assert segment["exit_code"] == 0 and segment["summary"]["raydra/status"] == "completed"


@pytest.mark.parametrize(
    "settings, sentence",
    [
        ({"api_key": "abc123456"}, "logger.wandb.api_key cannot be set: set the WANDB_API_KEY environment variable"),
        ({"id": "x"}, "logger.wandb.id cannot be set: raydra gives each run"),
        ({"sync_tensorboard": True}, "logger.wandb.sync_tensorboard cannot be set: it would make W&B's x-axis TensorBoard's"),
        ({"projet": "x"}, "logger.wandb.projet is not an argument of W&B's logger; use one of"),
        ({"log_model": "best"}, "logger.wandb.log_model=best must be false, true"),
        ({"add_file_policy": "copy"}, "logger.wandb.add_file_policy=copy must be mutable or immutable"),
    ],
)
def test_a_logger_wandb_key_w_and_b_would_not_take_is_refused_in_one_sentence(settings, sentence):
    (said,) = wandb_run.problems({"project": "raydra", **settings})
    assert said.startswith(sentence) and said.endswith(".") and "abc123456" not in said


def test_every_logger_wandb_key_is_an_argument_of_w_and_b_s_logger_or_of_wandb_init():
    """The keys raydra passes on, acts on or refuses, against the installed wandb and Lightning:
    an upgrade that renames one fails here."""
    import wandb

    from raydra.lightning import pl

    taken = set(inspect.signature(wandb.init).parameters) | set(inspect.signature(pl.loggers.WandbLogger.__init__).parameters)
    assert set(wandb_run.INIT_KEYS) <= set(inspect.signature(wandb.init).parameters)
    assert set(wandb_run.OWN_KEYS) - {"log_model", "checkpoint_name", "add_file_policy", "prefix"} <= set(
        inspect.signature(wandb.init).parameters
    )
    assert set(wandb_run.REFUSED_KEYS) - {"api_key"} <= taken
    left = taken - {"self", "kwargs"} - set(wandb_run.OWN_KEYS) - set(wandb_run.INIT_KEYS) - set(wandb_run.REFUSED_KEYS)
    assert not left, f"arguments of W&B's logger raydra neither passes nor refuses: {left}"


@pytest.mark.parametrize(
    "kind, label, overrides, name, job_type",
    [
        ("run", None, (), "r1", "run"),
        ("job", "model.optimizer.lr=0.01", (), "model.optimizer.lr=0.01", "job"),
        ("trial", "model.optimizer.lr=0.003", ("logger.wandb.name=mine", "+logger.wandb.job_type=ablation"), "mine", "ablation"),
    ],
)
def test_a_run_job_or_trial_logs_to_w_and_b_under_what_sets_it_apart_with_the_mode_and_group_it_ran_with(
    tmp_path, monkeypatch, kind, label, overrides, name, job_type
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = prepare(composed("scale.num_workers=2", *overrides), Invocation()).config
    spec = resolve.resolve(cfg, tmp_path, "r1", wandb_group="sweep-7", kind=kind, label=label)
    decided = {"mode": "offline", "group": "sweep-7", "name": name, "job_type": job_type}
    assert {k: spec.logger["wandb"][k] for k in decided} == decided
    # The config W&B (and every logger) records says so too, not the null that meant "decide".
    assert {k: spec.place.logged_config["logger"]["wandb"][k] for k in decided} == decided


def test_a_restarted_rank_0_catches_w_and_b_up_and_logs_each_step_once_and_log_model_all_each_checkpoint(tmp_path):
    """The segment a restarted (or resumed) rank 0 starts: what no earlier segment holds of
    metrics.csv first, then only (step, metric) pairs no segment holds, W&B's _step going on."""
    from raydra.worker.wandb_logger import segment_logger

    ended = RunRecord.started(run_id="r1", run_dir=str(tmp_path / "run"), monitor=Monitor(MONITOR, "max")).failed("killed")
    run_dir = _run_dir(tmp_path, ended, log_model="all")
    _worker_segment_cut_short(run_dir, rows=3)
    logger = segment_logger(RunSettings.read(run_dir), "r1", run_dir)
    # Lightning logs step 59 again (trained again from a checkpoint at 49), then a new step.
    logger.log_metrics({"val/acc": 0.7, "val/loss": 1.2, "epoch": 2}, step=59)
    logger.log_metrics({"train/loss_step": 0.9, "epoch": 3}, step=69)
    checkpoint = tmp_path / "checkpoint.ckpt"
    checkpoint.write_bytes(b"weights")
    logger.checkpoint_saved(checkpoint, {"val/acc": 0.75, "step": 70, "epoch": 3, "mid_epoch": 0})
    logger.end(exit_code=0, status="completed")
    segments = wandb_segments(run_dir)
    restarted = segments[-1]
    steps = [(row["_step"], row["trainer/global_step"]) for row in restarted["history"]]
    assert steps == [(3, 29), (4, 39), (5, 39), (6, 49), (7, 59), (8, 69)]
    assert [(a["name"], sorted(a["aliases"])) for a in restarted["artifacts"]] == [("model-r1", ["best", "latest"])]
    assert restarted["summary"]["best/val/acc"] == 0.75 and restarted["summary"]["raydra/status"] == "completed"
