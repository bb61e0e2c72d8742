"""The batch system seam (raydra.cluster.batch_system): SLURM is found through its entry point by the job's
environment, no module outside raydra.slurm imports it, and a run takes any batch system's stop
notice the same way. A stand-in system here plays SLURM's part without a SLURM: its notice has
come before the run starts, so the run trains nothing and ends interrupted with the system's words.
SLURM's own notice, requeue and cluster are tests/system/test_slurm.py's, on a real SLURM."""

import ast
import json

from helpers import REPO, StandInBatchSystem, run_dirs

from raydra.cluster import batch_system
from raydra.slurm import SYSTEM as SLURM

SRC = REPO / "src" / "raydra"


def test_slurm_is_found_by_its_entry_point_and_by_the_jobs_environment():
    assert batch_system.installed()["slurm"] is SLURM
    assert batch_system.named("slurm") is SLURM and batch_system.named("auto") is None and batch_system.named(None) is None
    assert batch_system.current({"SLURM_JOB_ID": "17"}) is SLURM and batch_system.current({}) is None
    restarted = {"SLURM_JOB_ID": "17", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "n1"}
    assert batch_system.requeued(restarted) == "17" and batch_system.requeued({"SLURM_JOB_ID": "17"}) is None
    assert batch_system.job_record({}) is None and batch_system.job_record(restarted)["job_id"] == "17"
    # Outside a batch job the notice never comes, and acting on it is a no-op.
    none = batch_system.NO_NOTICE
    with none.on_notice(lambda: True), none.run_stops_on_notice():
        assert not none.noticed() and not none.watched()


def test_no_module_outside_raydra_slurm_imports_it_but_the_cli():
    importers = []
    for path in SRC.rglob("*.py"):
        if "slurm" in path.relative_to(SRC).parts or path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            if any(module.startswith("raydra.slurm") for module in modules):
                importers.append(str(path.relative_to(SRC)))
    assert importers == []


def test_a_run_takes_a_batch_systems_stop_notice_and_ends_interrupted_with_its_words(train_here, tmp_path, monkeypatch):
    stand_in = StandInBatchSystem()
    monkeypatch.setattr(batch_system, "installed", lambda: {"standin": stand_in})
    monkeypatch.setitem(batch_system._watched, "system", None)
    done = train_here("scale.num_workers=0", "logger=csv", "ray.address=standin", outputs=tmp_path)
    assert done.returncode == 130 and stand_in.watching, done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"].startswith("interrupted: the stand-in batch system's job is ending")
    assert f"continue it with resume={run_dir}" in summary["error"] and summary["global_step"] is None
