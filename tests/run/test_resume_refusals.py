"""resume= refused, and the run it names left as it was: a run that completed while this resume=
waited for its driver to let go, a metrics.csv that cannot be read back; the refused invocation's
own directory left holding nothing that looks like a run, and a run continued in its own directory
keeping its record. Seams and the entry in this process: a run directory made on the spot as a
stopped run leaves it, no training, no Ray."""

import json
import logging
import threading
import time

import pytest
import yaml
from helpers import composed, run_dirs
from omegaconf import OmegaConf

from raydra.errors import RaydraError
from raydra.records import lock, summary, trust
from raydra.run import driver, recording, resume

OVERRIDES = ["experiment=vit_digits_smoke", "logger=csv", "scale.num_workers=1"]


def stopped_run(outputs):
    """A run directory as a run interrupted after its first epoch leaves it."""
    run_dir = outputs / "runs" / "2026-11-27" / "10-53-19_vit_digits_smoke"
    (run_dir / ".hydra").mkdir(parents=True)
    cfg = composed(*OVERRIDES, f"paths.outputs={outputs}")
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(OVERRIDES))
    opening = recording.new_summary(cfg, run_dir, "2026-11-27_10-53-19_vit_digits_smoke_abc123", OVERRIDES)
    summary.write(run_dir, opening.with_start(config_hash="c0ffee").interrupted("interrupted (Ctrl-C or SIGTERM)", time.time() - 30))
    (run_dir / "metrics.csv").write_text("epoch,step,train/loss\n0,9,1.5\n")
    trust.mark_run(run_dir)  # made on this machine: what is checked is its record and files
    return run_dir


def test_a_run_that_completed_while_resume_waited_for_its_driver_is_refused_and_its_record_kept(tmp_path, monkeypatch, caplog):
    # Its status was read before the lock was taken: the second driver then "resumed" the completed
    # run, overwriting its wall time, emptying its throughput and adding a `resumed` entry.
    run_dir = stopped_run(tmp_path)
    cfg = composed(*OVERRIDES, f"paths.outputs={tmp_path}", f"resume={run_dir}")
    fresh = tmp_path / "runs" / "2026-11-27" / "10-54-02_vit_digits_smoke"
    opening = recording.new_summary(cfg, fresh, "2026-11-27_10-54-02_vit_digits_smoke_def456", [])
    first = lock.hold(run_dir, "the first driver")
    outcome = []

    def second_driver():
        try:
            outcome.append(driver._continue(cfg, opening, fresh))
        except RaydraError as error:
            outcome.append(error)

    caplog.set_level(logging.INFO, logger="raydra")
    waiting = threading.Thread(target=second_driver)
    waiting.start()
    try:
        deadline = time.time() + 10
        while "is held by another driver" not in caplog.text:
            assert time.time() < deadline and waiting.is_alive(), caplog.text
            time.sleep(0.02)
        # The first driver completes the run, then lets go of it.
        summary.write(run_dir, summary.read(run_dir).completed(time.time() - 86.8, throughput={"samples_per_s": 512.0}))
        completed = (run_dir / "summary.json").read_bytes()
        first()
        waiting.join(timeout=10)
    finally:
        for taken in outcome:
            if isinstance(taken, tuple):  # taken over: let go, so the test's end does not wait on it
                taken[1]()
    (refusal,) = outcome
    assert isinstance(refusal, RaydraError), refusal
    assert str(refusal) == f"resume={run_dir}: {run_dir} already completed; start a new run instead of resuming it."
    assert (run_dir / "summary.json").read_bytes() == completed
    lock.hold(run_dir, "a later driver")()  # the refused driver let go of the run


def test_resume_refuses_a_metrics_csv_the_worker_could_not_read_back(tmp_path):
    run_dir = stopped_run(tmp_path)
    cfg = composed(*OVERRIDES, f"paths.outputs={tmp_path}", "resume=latest")
    for content, why in [
        (b"epoch,step,val/acc\n0,9," + b"7" * 200_000 + b"\n", "not CSV: field larger than field limit (131072)"),
        (b"epoch,step,val/acc\nzero,9,0.5\n", "row 2's epoch is 'zero', not a number"),
        (b"epoch,step,val/acc\n0,9,0.5\n0,nan,0.5\n", "row 3's step is 'nan', not a number"),
    ]:
        (run_dir / "metrics.csv").write_bytes(content)
        with pytest.raises(RaydraError) as refused:
            resume.find(cfg)
        assert str(refused.value).startswith(f"resume=latest: {run_dir / 'metrics.csv'} cannot be read back as the run's metrics ({why}); ")
    # What the worker keeps of it is read alike: an empty value and a float-written number are fine.
    (run_dir / "metrics.csv").write_bytes(b"epoch,step,val/acc\n0,9,\n1.0,19,0.5\n")
    assert resume.find(cfg) == run_dir


def test_a_damaged_metrics_csv_is_refused_in_one_sentence_leaving_the_run_and_no_other_run_behind(train_here, tmp_path):
    # `head -c 2000 /dev/urandom > <run>/metrics.csv`: a 52-line UnicodeDecodeError from the worker,
    # once the run had been taken over, left `failed`; and the refused invocation's directory held a
    # `failed` summary.json of its own.
    run_dir = stopped_run(tmp_path)
    metrics = run_dir / "metrics.csv"
    metrics.write_bytes(bytes(range(128, 256)) * 16)
    before = {name: (run_dir / name).read_bytes() for name in ("summary.json", "metrics.csv")}
    done = train_here(*OVERRIDES, f"resume={run_dir}", outputs=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in said, said
    sentence = (
        f"error: resume={run_dir}: {metrics} cannot be read back as the run's metrics (not UTF-8 text: invalid start byte); "
        "move it aside (e.g. to metrics.csv.damaged) and resume again: the run logs its metrics anew from its checkpoint on, "
        "the earlier ones staying in the moved file."
    )
    assert said.strip().splitlines() == [sentence], said
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    assert json.loads(before["summary.json"])["status"] == "interrupted"
    # The refused invocation's own directory: its driver.log, with the refusal; nothing of a run.
    assert run_dirs(tmp_path) == [run_dir]
    (own,) = [p for p in (tmp_path / "runs").glob("*/*") if p != run_dir]
    assert sorted(p.name for p in own.iterdir()) == ["driver.log"]
    assert sentence in (own / "driver.log").read_text()


def test_a_run_continued_in_its_own_directory_that_is_refused_keeps_its_record_and_says_why_there(train_here, tmp_path):
    # A resumed multirun's job continues its run in the run's own directory, and its launcher reads
    # the job's outcome from there. A refusal before the takeover replaced the run's record with a
    # new one (another run id, no history, no checkpoints), which a later resume could not continue.
    run_dir = stopped_run(tmp_path)
    (run_dir / "metrics.csv").write_bytes(b"epoch,step,val/acc\nzero,9,0.5\n")
    before = json.loads((run_dir / "summary.json").read_text())
    # Hydra writes this invocation's config over the run's .hydra/ in place, and this machine's mark
    # was made over the run's: trusted, so that what is refused is its metrics.csv.
    done = train_here(*OVERRIDES, f"resume={run_dir}", f"hydra.run.dir={run_dir}", "resume_trusted=true", outputs=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    after = json.loads((run_dir / "summary.json").read_text())
    assert after["status"] == "failed" and f"{run_dir / 'metrics.csv'} cannot be read back as the run's metrics" in after["error"]
    kept = ("run_id", "started_at", "wall_time_s", "config_hash", "resumed", "checkpoints")
    assert {key: after[key] for key in kept} == {key: before[key] for key in kept}
