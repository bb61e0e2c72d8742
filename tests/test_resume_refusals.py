"""resume= refused, and the run it names left as it was: a run that completed while this resume=
waited for its driver to let go. Seams: a run directory made on the spot as a stopped run leaves
it, no training, no Ray."""

import logging
import threading
import time

import yaml
from helpers import composed
from omegaconf import OmegaConf

from raydra import driver, run_record, summary, trust
from raydra import record as record_module
from raydra.errors import RaydraError

OVERRIDES = ["experiment=vit_digits_smoke", "logger=csv", "scale.num_workers=1"]


def stopped_run(outputs):
    """A run directory as a run interrupted after its first epoch leaves it."""
    run_dir = outputs / "runs" / "2026-11-27" / "10-53-19_vit_digits_smoke"
    (run_dir / ".hydra").mkdir(parents=True)
    cfg = composed(*OVERRIDES, f"paths.outputs={outputs}")
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(OVERRIDES))
    opening = summary.new_summary(cfg, run_dir, "2026-11-27_10-53-19_vit_digits_smoke_abc123", OVERRIDES)
    record_module.write(run_dir, opening.with_start(config_hash="c0ffee").interrupted("interrupted (Ctrl-C or SIGTERM)", time.time() - 30))
    (run_dir / "metrics.csv").write_text("epoch,step,train/loss\n0,9,1.5\n")
    trust.mark_run(run_dir)  # made on this machine: what is checked is its record and files
    return run_dir


def test_a_run_that_completed_while_resume_waited_for_its_driver_is_refused_and_its_record_kept(tmp_path, monkeypatch, caplog):
    # Its status was read before the lock was taken: the second driver then "resumed" the completed
    # run, overwriting its wall time, emptying its throughput and adding a `resumed` entry.
    run_dir = stopped_run(tmp_path)
    cfg = composed(*OVERRIDES, f"paths.outputs={tmp_path}", f"resume={run_dir}")
    fresh = tmp_path / "runs" / "2026-11-27" / "10-54-02_vit_digits_smoke"
    opening = summary.new_summary(cfg, fresh, "2026-11-27_10-54-02_vit_digits_smoke_def456", [])
    first = run_record.hold(run_dir, "the first driver")
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
        record_module.write(run_dir, record_module.read(run_dir).completed(time.time() - 86.8, throughput={"samples_per_s": 512.0}))
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
    run_record.hold(run_dir, "a later driver")()  # the refused driver let go of the run
