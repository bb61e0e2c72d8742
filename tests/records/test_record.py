"""summary.json as a typed record (raydra.records.summary): records of every kind written before `format`
still read, a moved or copied run finds its own checkpoints, each transition settles the record as
documented, and a damaged record is refused in one sentence or read with the bad field left blank.

The files in records_before_format/ are summary.json files the suite's runs wrote on 2026-11-27,
before the record had a format (a Ray run, local mode from a checkpoint, an elastic run in S3, a
resumed SLURM run, stopped and running trials, a failed run, an interrupted multirun job, a rerun,
an early-stopped run)."""

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path

import pytest
import yaml
from helpers import composed
from omegaconf import OmegaConf

from raydra.errors import RaydraError
from raydra.records import envelope, summary, trust
from raydra.records import jobs as jobs_record
from raydra.records import sweep as sweep_record
from raydra.records.checkpoints import locate
from raydra.records.jobs import JobsRecord
from raydra.records.summary import RunRecord
from raydra.records.sweep import Best, SweepRecord, TrialCounts

BEFORE = Path(__file__).parent / "records_before_format"
OLD_RECORDS = sorted(BEFORE.glob("*.json"))


def old(name: str) -> dict:
    return json.loads((BEFORE / f"{name}.json").read_text())


@pytest.mark.parametrize("path", OLD_RECORDS, ids=[p.stem for p in OLD_RECORDS])
def test_every_record_written_before_format_reads_whole_and_writes_back_as_format_2(path, tmp_path):
    data = json.loads(path.read_text())
    run = RunRecord.from_dict(data)
    assert not run.problems and not run.extra, (run.problems, run.extra)
    assert (run.format, run.status, run.run_id, run.name) == (2, data["status"], data["run_id"], data["name"])
    assert run.monitor.metric == data["monitor"]["metric"] and run.overrides == data["overrides"]
    assert run.metrics.final == (data.get("metrics") or {}).get("final", {})
    for which in ("best", "last"):
        recorded = (data.get("checkpoints") or {}).get(which)
        # Below its run directory or storage: relative now, and found where it was.
        assert run.checkpoint(which) == recorded
        kept = getattr(run.checkpoints, which)
        assert kept is None or not kept.startswith(("/", "s3://")), kept
    summary.write(tmp_path, run)
    again = summary.read(tmp_path)
    assert again == run and json.loads((tmp_path / "summary.json").read_text())["format"] == 2


def test_a_moved_run_loads_its_own_checkpoint_and_a_copy_never_the_originals(tmp_path):
    """summary.json held absolute paths: a copied run loaded the original's checkpoint, and a moved
    run was said to have no best checkpoint while it had one. Both for format 2 and for a record
    written before it."""
    for kind in ("format_2", "format_1"):
        original = tmp_path / kind / "original"
        checkpoint = original / "checkpoints" / "id" / "checkpoint_1" / "checkpoint.ckpt"
        checkpoint.parent.mkdir(parents=True)
        checkpoint.write_bytes(b"weights")
        data = {**old("completed_ray"), "run_dir": str(original), "checkpoints": {"best": str(checkpoint), "last": str(checkpoint)}}
        if kind == "format_2":
            data = RunRecord.from_dict(data).to_dict()
            assert data["checkpoints"]["best"] == "checkpoints/id/checkpoint_1/checkpoint.ckpt"
        (original / "summary.json").write_text(json.dumps(data))
        copy = tmp_path / kind / "copy"
        shutil.copytree(original, copy)
        assert locate(str(copy), "best") == str(copy / "checkpoints/id/checkpoint_1/checkpoint.ckpt")
        moved = tmp_path / kind / "moved"
        original.rename(moved)
        assert locate(str(moved), "last") == str(moved / "checkpoints/id/checkpoint_1/checkpoint.ckpt")


def test_each_transition_settles_status_error_and_times_in_one_place():
    started = time.time() - 2.0
    opening = RunRecord.started(name="digits", run_id="r1", run_dir="/runs/r1", overrides=["seed=1"])
    assert (opening.status, opening.ended, opening.format) == ("running", False, 2) and opening.started_at

    failed = opening.failed("data.root=/x does not exist; point it at the data.", started)
    assert (failed.status, failed.error, failed.ended) == ("failed", "data.root=/x does not exist; point it at the data.", True)
    assert failed.finished_at and failed.wall_time_s >= 2.0 and opening.status == "running"  # a new value

    stopped = opening.interrupted("interrupted; continue it with resume=/runs/r1", started, "checkpoints/r1/checkpoint_3/checkpoint.ckpt")
    assert stopped.status == "interrupted" and stopped.checkpoint("last") == "/runs/r1/checkpoints/r1/checkpoint_3/checkpoint.ckpt"
    assert stopped.relative("/runs/r1/checkpoints/a/checkpoint.ckpt") == "checkpoints/a/checkpoint.ckpt"
    assert stopped.relative("/elsewhere/checkpoint.ckpt") == "/elsewhere/checkpoint.ckpt"  # outside the run: kept whole

    again = RunRecord.started(name="digits", run_id="fresh", run_dir="/runs/fresh").resumed_from(stopped, log="/runs/fresh/driver.log")
    assert (again.run_id, again.run_dir, again.started_at, again.status) == ("r1", "/runs/r1", opening.started_at, "running")
    assert [(r.from_status, r.log) for r in again.resumed] == [("interrupted", "/runs/fresh/driver.log")]

    done = again.with_start(config_hash="sha256:x").completed(
        started, metrics=summary.Metrics(final={"val/acc": 0.5}, best={"val/acc": 0.75})
    )
    assert (done.status, done.error, done.config_hash) == ("completed", None, "sha256:x")
    assert done.with_start(monitor=summary.Monitor("val/acc", "max")).best_value() == 0.75
    trial = opening.stopped("the asha scheduler after 1 epoch(s)", 3.5, epochs_completed=1)
    assert (trial.status, trial.stopped_by, trial.wall_time_s, trial.ended) == ("stopped", "the asha scheduler after 1 epoch(s)", 3.5, True)


def test_a_damaged_record_is_refused_in_one_sentence_and_a_bad_field_reads_blank(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for content, says in (('{"status": "completed", "metrics": {', "cut short"), ("[1, 2]", "holds a JSON list")):
        (run_dir / "summary.json").write_text(content)
        with pytest.raises(envelope.RecordError) as error:
            summary.read(run_dir)
        message = str(error.value)
        assert message.startswith(f"{run_dir / 'summary.json'} is not a readable run record") and says in message
        assert "\n" not in message and isinstance(error.value, RaydraError)
        assert summary.try_read(run_dir) is None
    # A field of the wrong type reads as unset, and says so; a key of a newer raydra's is kept.
    data = {**old("completed_ray"), "wall_time_s": "long", "monitor": ["val/acc"], "format": 3, "energy_kwh": 1.5}
    run = RunRecord.from_dict(data)
    assert run.wall_time_s is None and run.monitor == summary.Monitor() and run.status == "completed"
    assert [p.split(" ")[0] for p in run.problems] == ["wall_time_s", "monitor"]
    assert run.to_dict()["energy_kwh"] == 1.5


def _strict(text: str) -> dict:
    """JSON as a reader other than Python's parses it: no NaN, Infinity or -Infinity."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_number_that_is_not_finite_is_written_as_strict_json_and_read_back_as_that_number(tmp_path):
    """A diverged loss is a legitimate NaN: summary.json, sweep.json and jobs.json stay JSON that
    any reader parses (Python wrote NaN and Infinity, which JSON has not), and read back, in
    `raydra compare` too, as the numbers they were."""
    from raydra.compare.recorded_run import load_run

    nan, inf = math.nan, math.inf
    metrics = summary.Metrics(final={"train/loss": nan, "val/acc": 0.5}, best={"train/loss": -inf})
    run = dataclasses.replace(RunRecord.from_dict(old("completed_ray")), metrics=metrics, wall_time_s=inf)
    summary.write(tmp_path, run)
    written = _strict((tmp_path / "summary.json").read_text())
    assert written["metrics"]["final"] == {"train/loss": "NaN", "val/acc": 0.5} and written["wall_time_s"] == "Infinity"
    assert written["metrics"]["best"] == {"train/loss": "-Infinity"}
    for again in (summary.read(tmp_path), load_run(str(tmp_path), notes := []).record):
        assert math.isnan(again.metrics.final["train/loss"]) and again.metrics.final["val/acc"] == 0.5
        assert again.metrics.best["train/loss"] == -inf and again.wall_time_s == inf and not again.problems
    assert not [note for note in notes if "summary.json" in note], notes

    sweep = SweepRecord.started(name="s").completed(time.time(), Best(trial="t1", metric=nan), TrialCounts(completed=1))
    sweep_record.write(tmp_path, sweep)
    assert _strict((tmp_path / "sweep.json").read_text())["best"]["metric"] == "NaN"
    assert math.isnan(sweep_record.read(tmp_path).best.metric)
    jobs = JobsRecord.started().with_jobs({0: jobs_record.JobEntry(status="completed", return_value=inf)})
    jobs_record.write(tmp_path, jobs)
    assert _strict((tmp_path / "jobs.json").read_text())["jobs"]["0"]["return_value"] == "Infinity"
    assert jobs_record.read(tmp_path).job(0).return_value == inf


def test_resume_of_a_run_recorded_before_format_passes_its_config_check(tmp_path):
    """`resume=` of an interrupted run whose summary.json predates `format` finds it and its config
    unchanged, as before (raydra.run.resume.find, the driver's check before it takes the run over)."""
    from raydra.run import resume

    overrides = ["experiment=vit_digits_smoke", "trainer.max_epochs=50", "scale.num_workers=1", "model.optimizer.lr=0.001"]
    run_dir = tmp_path / "runs" / "2026-11-27" / "10-53-19_vit_digits_smoke"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(composed(*overrides, f"paths.outputs={tmp_path}")))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run_dir / "summary.json").write_text(json.dumps({**old("interrupted_multirun_job"), "run_dir": str(run_dir)}))
    trust.mark_run(run_dir)  # made on this machine (raydra.records.trust): what is checked here is its record and config
    for asked in (str(run_dir), "latest"):
        cfg = composed(*overrides, f"paths.outputs={tmp_path}", f"resume={asked}")
        assert resume.find(cfg) == run_dir
    changed = composed(*overrides[:-1], "model.optimizer.lr=0.1", f"paths.outputs={tmp_path}", f"resume={run_dir}")
    with pytest.raises(RaydraError, match=r"model.optimizer.lr: 0.001 -> 0.1"):
        resume.find(changed)


@pytest.mark.parametrize("content", ['{"status": "completed", "checkpoints": {', '"a string"'], ids=["truncated", "not_an_object"])
def test_resume_ckpt_path_and_load_of_a_damaged_record_say_so_in_one_sentence_naming_it(content, tmp_path, train_here):
    """Were a JSONDecodeError, an AttributeError or torch's "corrupted" with no path; refused now
    before anything trains or is written into the damaged run."""
    import raydra

    damaged = tmp_path / "damaged"
    (damaged / ".hydra").mkdir(parents=True)
    (damaged / ".hydra" / "config.yaml").write_text("name: vit_digits\n")
    (damaged / "summary.json").write_text(content)
    trust.mark_run(damaged)  # made on this machine: what is refused is its record
    named = f"{damaged / 'summary.json'} is not a readable run record"
    for asked in (f"resume={damaged}", f"ckpt_path={damaged}"):
        done = train_here("scale.num_workers=0", "logger=csv", asked, outputs=tmp_path / "outputs")
        assert done.returncode == 1 and named in done.stdout + done.stderr, done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr
    with pytest.raises(RaydraError, match=named):
        raydra.load(str(damaged))
    assert (damaged / "summary.json").read_text() == content
