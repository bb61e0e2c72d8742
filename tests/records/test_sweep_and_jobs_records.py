"""sweep.json and jobs.json as typed records (raydra.records.sweep, raydra.records.jobs): the files
written before they had `format` still read whole and write back, each transition settles the record
in one place, and a damaged record is refused in one sentence or read with the bad field left blank.

records_before_format/sweep/ and jobs/ hold files the code before the typed records wrote (at
9a5e479, 2026-11-27): the suite's sweep and multirun tests' records, and a sweep SIGTERMed as it ran."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raydra.records import jobs as jobs_record
from raydra.records import sweep as sweep_record
from raydra.records.envelope import RecordError
from raydra.records.jobs import JobsRecord
from raydra.records.sweep import Best, SweepRecord, TrialCounts

BEFORE = Path(__file__).parent / "records_before_format"
OLD_SWEEPS = sorted((BEFORE / "sweep").glob("*.json"))
OLD_JOBS = sorted((BEFORE / "jobs").glob("*.json"))


@pytest.mark.parametrize("path", OLD_SWEEPS, ids=[p.stem for p in OLD_SWEEPS])
def test_every_sweep_json_written_before_format_reads_whole_and_writes_back_as_format_2(path, tmp_path):
    data = json.loads(path.read_text())
    sweep = SweepRecord.from_dict(data)
    assert not sweep.problems and not sweep.extra, (sweep.problems, sweep.extra)
    assert (sweep.format, sweep.kind, sweep.status, sweep.sweep_dir) == (2, data["kind"], data["status"], data["sweep_dir"])
    assert sweep.continues_another == (data["kind"] == "tune sweep resume")
    if "best" in data:
        assert (sweep.best.trial, sweep.best.metric, sweep.best.checkpoint) == tuple(
            data["best"][k] for k in ("trial", "metric", "checkpoint")
        )
        assert sweep.trials.completed == data["trials"]["completed"]
    assert [r.from_status for r in sweep.resumed] == [r["from_status"] for r in data.get("resumed", [])]
    # Every value it held is written back as it was, with the format beside it.
    written = sweep.to_dict()
    assert {key: written[key] for key in data} == data and written["format"] == 2
    sweep_record.write(tmp_path, sweep)
    assert sweep_record.read(tmp_path) == sweep


@pytest.mark.parametrize("path", OLD_JOBS, ids=[p.stem for p in OLD_JOBS])
def test_every_jobs_json_written_before_format_reads_whole_and_writes_back_as_format_2(path, tmp_path):
    data = json.loads(path.read_text())
    record = JobsRecord.from_dict(data)
    assert not record.problems and not record.extra, (record.problems, record.extra)
    # It kept no status of its own: none is made up for it.
    assert record.format == 2 and record.status is None and list(record.jobs) == list(data["jobs"])
    for num, entry in data["jobs"].items():
        job = record.job(int(num))
        assert (job.overrides, job.dir, job.status, job.error) == (entry["overrides"], entry["dir"], entry["status"], entry.get("error"))
        assert job.return_value == entry.get("return_value")
        assert {key: value for key, value in record.to_dict()["jobs"][num].items() if key in entry} == entry
    jobs_record.write(tmp_path, record)
    assert jobs_record.read(tmp_path) == record and json.loads((tmp_path / "jobs.json").read_text())["format"] == 2


def test_a_sweeps_transitions_settle_status_error_and_times_in_one_place():
    started = time.time() - 3
    opening = SweepRecord.started(name="vit", id="2026_vit", sweep_dir="/s", metric="val/acc", mode="max")
    assert (opening.status, opening.error, opening.finished_at, opening.ended) == ("running", None, None, False)
    stopped = opening.interrupted("interrupted (Ctrl-C or SIGTERM); continue it with tune.resume=/s", started)
    assert stopped.status == "interrupted" and stopped.error.endswith("tune.resume=/s") and stopped.wall_time_s >= 3 and stopped.ended
    # The resumption names the status the sweep had (the code before recorded "running" always).
    again = stopped.resumed_from_here(log="/s2/driver.log")
    assert (again.status, again.error, again.finished_at) == ("running", None, None)
    assert [(r.from_status, r.log) for r in again.resumed] == [("interrupted", "/s2/driver.log")]
    done = again.completed(started, Best(trial="t1", metric=0.9), TrialCounts(completed=2, stopped=1))
    assert (done.status, done.error, done.best.metric, done.trials.stopped, done.resumed) == ("completed", None, 0.9, 1, again.resumed)
    failed = opening.failed("tune.space: x is not a key", started)
    assert (failed.status, failed.error) == ("failed", "tune.space: x is not a key") and failed.finished_at


def test_a_multiruns_transitions_keep_its_jobs_in_number_order_and_settle_in_one_place():
    job = jobs_record.JobEntry
    opening = JobsRecord.started().with_jobs({10: job(status="queued"), 2: job(status="running")})
    assert opening.status == "running" and list(opening.jobs) == ["2", "10"]
    stopped = opening.with_jobs({2: job(status="interrupted", error="stopped")}).interrupted("continue it with python train.py -m ...")
    assert stopped.status == "interrupted" and stopped.job(2).status == "interrupted" and stopped.job(10).status == "queued"
    resumed = stopped.resumed_from_here(log="/m/multirun.log")
    assert (resumed.status, resumed.error, [r.from_status for r in resumed.resumed]) == ("running", None, ["interrupted"])
    # A sweeper's next batch keeps the earlier batches' jobs and is no resumption.
    later = resumed.completed().next_batch().with_jobs({11: job(status="queued")})
    assert later.status == "running" and list(later.jobs) == ["2", "10", "11"] and len(later.resumed) == 1
    assert later.failed("job #11 cannot run").status == "failed"


def test_a_damaged_sweep_or_jobs_record_is_refused_in_one_sentence_and_a_bad_field_reads_blank(tmp_path):
    for module, name in ((sweep_record, "sweep.json"), (jobs_record, "jobs.json")):
        directory = tmp_path / name
        directory.mkdir()
        for content in ('{"status": "runn', "[1, 2]"):
            (directory / name).write_text(content)
            with pytest.raises(RecordError, match=f"^{directory / name} is not a readable (sweep|multirun) record"):
                module.read(directory)
    sweep = SweepRecord.from_dict({"status": "completed", "num_samples": "four", "best": {"trial": "t", "metric": 0.5}, "newer": [1]})
    assert sweep.num_samples is None and sweep.problems == ("num_samples is not a whole number ('four')",)
    assert sweep.best.metric == 0.5 and sweep.to_dict()["newer"] == [1]
    jobs = JobsRecord.from_dict({"jobs": {"0": {"status": "completed", "dir": 3}, "1": "not a job"}, "newer": True})
    # A job entry that is no object is left out; one whose field has the wrong type keeps the rest.
    assert list(jobs.jobs) == ["0"] and jobs.job(0).status == "completed" and jobs.job(0).dir is None
    assert jobs.to_dict()["newer"] is True


def test_the_records_import_neither_torch_ray_hydra_nor_omegaconf():
    # raydra compare reads records on machines without the training stack.
    code = "import sys, raydra.records.sweep, raydra.records.jobs; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'hydra', 'omegaconf'}))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
