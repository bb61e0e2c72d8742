"""`python train.py -m ...`: jobs side by side on the Ray cluster through raydra's Hydra launcher
(src/hydra_plugins/raydra_launcher), Hydra's basic launcher one after another, what Hydra promises
each job, resuming a multirun, and a run submitted as a Ray job (sweeper plugins: test_sweepers.py). Real runs of train.py, checked through what they leave."""

import json
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from helpers import (
    LISTENING,
    REPO,
    SMALL_JOB,
    base_env,
    own_local_ray_env,
    ran_side_by_side,
    run_dirs,
    run_train,
    store_address,
    summary_of,
)

from raydra.records import jobs as jobs_record


def _when(summary: dict, key: str) -> datetime:
    return datetime.fromisoformat(summary[key])


def _job_dirs(outputs: Path) -> list:
    return sorted(p for p in outputs.glob("sweeps/*/*/*") if p.is_dir())


def _placement_group_cleaners(address: str) -> int:
    """How many of Ray Train's PlacementGroupCleaner actors the cluster has seen, live or gone."""
    script = (
        "import sys, ray; from ray.util.state import list_actors; ray.init(address=sys.argv[1]); "
        "print('CLEANERS', len(list_actors(address=sys.argv[1], filters=[('class_name', '=', 'PlacementGroupCleaner')], limit=10000)))"
    )
    done = subprocess.run([sys.executable, "-c", script, address], capture_output=True, text=True, timeout=120, env=base_env())
    assert "CLEANERS " in done.stdout, done.stdout + done.stderr[-3000:]
    return int(done.stdout.split("CLEANERS ")[-1])


# Secrets a multirun is given: an override's value, and inside the values of a task's and a Hydra override.
SECRETS = {"key": "mrKey5150abc", "nested": "mrNested6160", "hook": "mrHook7170"}
WITH_SECRETS = (
    f"ray.runtime_env={{env_vars: {{MY_API_TOKEN: {SECRETS['nested']}}}}}",
    f"+ray.runtime_env.env_vars.WANDB_API_KEY={SECRETS['key']}",
    f"++hydra.job.env_set={{HOOK_AUTH: {SECRETS['hook']}}}",
)


@pytest.mark.e2e
def test_jobs_run_side_by_side_as_the_cluster_allows_and_a_failed_job_stops_no_other(ray_cluster, tmp_path):
    # lr=-1 fails on the worker (the optimizer refuses it), after the job has started.
    one_fails = ("model.optimizer.lr=1e-3,-1,3e-3,1e-2", "logger=[csv,wandb]", "logger.wandb.mode=disabled")
    cleaners = _placement_group_cleaners(ray_cluster)
    done = run_train("-m", *SMALL_JOB, *one_fails, *WITH_SECRETS, outputs=tmp_path, address=ray_cluster)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    # No secret on the console or in any file of the multirun (multirun.yaml, multirun.log, jobs.json,
    # each job's records and logs); where they were, *** says so.
    assert [line for line in out.splitlines() if any(s in line for s in SECRETS.values())] == []
    assert [p for p in tmp_path.rglob("*") if p.is_file() and any(s.encode() in p.read_bytes() for s in SECRETS.values())] == []
    assert "every job  " in done.stdout and "ray.runtime_env={env_vars:{MY_API_TOKEN:***}}" in done.stdout
    jobs = run_dirs(tmp_path, kind="sweeps")
    assert [p.name for p in jobs] == ["0", "1", "2", "3"]
    sweep_dir = jobs[0].parent
    first, failed, third, fourth = (summary_of(p) for p in jobs)
    assert [first["status"], failed["status"], third["status"], fourth["status"]] == ["completed", "failed", "completed", "completed"]

    # The cluster holds two 1-worker runs: jobs 0 and 1 ran side by side, job 2 waited for a free slot.
    assert ran_side_by_side(first, failed)
    assert _when(third, "started_at") >= min(_when(first, "finished_at"), _when(failed, "finished_at"))
    assert "up to 2 at a time" in done.stdout
    assert "[1] started  model.optimizer.lr=-1  (2 running, 2 queued)" in done.stdout

    # The compute ledger: the multirun's 2 worker slots over its wall are its jobs' worker-seconds
    # (each job's ledger; the failed one's workers x wall) and the slots' idle time, which is real
    # (the launcher's checks before the first job, a slot free while the last job ran).
    spent = jobs_record.read(sweep_dir).ledger
    # The failed job's record has its ledger too: its workers' time until it failed.
    assert (spent.runs, spent.slots) == (4, 2) and spent.best in {"0", "2", "3"}
    assert spent.runs_s == pytest.approx(sum(s["ledger"]["allocated_s"] for s in (first, failed, third, fourth)), rel=1e-3)
    assert spent.runs_s <= spent.allocated_s * 1.02 and spent.allocated_s == pytest.approx(spent.runs_s + spent.idle_s, rel=0.02)
    assert spent.idle_s > 0 and spent.not_completed_s == {"failed": pytest.approx(failed["ledger"]["allocated_s"], rel=1e-3)}
    assert sum(spent.buckets.values()) == pytest.approx(spent.runs_s, rel=1e-3) and "compute: 4 jobs used" in done.stdout

    # Each job is a single run of its own: its overrides, the multirun's cluster, one W&B group. Its
    # recorded config is what the user typed (the group is raydra's addition, in summary.json).
    for job, lr in zip(jobs, (0.001, -1, 0.003, 0.01), strict=True):
        config = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
        assert config["model"]["optimizer"]["lr"] == lr
        assert config["ray"]["address"] == ray_cluster
        assert config["logger"]["wandb"]["group"] is None
        assert summary_of(job)["wandb"]["group"] == f"{sweep_dir.parent.name}_{sweep_dir.name}"
        assert (job / "console.log").is_file() and (job / "driver.log").is_file()

    # The closing table is `raydra compare <sweep dir>`'s, and the failed job is named.
    table = subprocess.run([sys.executable, "-m", "raydra", "compare", str(sweep_dir)], capture_output=True, text=True, check=True).stdout
    assert table.strip() in done.stdout
    assert "1 of 4 jobs did not complete: #1 (model.optimizer.lr=-1) failed" in done.stdout
    # The command that continues it shows where each secret goes, and says to put it back.
    (command,) = [line.strip() for line in done.stdout.splitlines() if "hydra.launcher.resume=true" in line]
    assert "'+ray.runtime_env.env_vars.WANDB_API_KEY=***'" in command and "'++hydra.job.env_set={HOOK_AUTH:***}'" in command, command
    (left_out,) = [line for line in done.stdout.splitlines() if "*** stands for a secret, which nothing records: put each back" in line]
    assert "ray.runtime_env" in left_out and "+ray.runtime_env.env_vars.WANDB_API_KEY" in left_out, left_out
    assert "multirun job #1 (model.optimizer.lr=-1) failed" in done.stderr
    assert "Traceback" not in done.stderr  # one sentence per failed job, as Hydra prints a compact error
    assert "[0] completed in" in done.stdout and "best val/acc" in done.stdout

    # Each job's process ends with its run, which removes its placement group: Ray Train's cleaner
    # for it (a process of its own per run) is not started.
    assert _placement_group_cleaners(ray_cluster) == cleaners


@pytest.mark.e2e
def test_the_basic_launcher_still_runs_jobs_one_after_another_in_one_process(tmp_path):
    done = run_train(
        "-m", "hydra/launcher=basic", "trainer.max_epochs=1,2", "logger=csv", "trainer.test=false", *LISTENING, outputs=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = run_dirs(tmp_path, kind="sweeps")
    assert [p.name for p in jobs] == ["0", "1"]
    summaries = [summary_of(p) for p in jobs]
    assert [s["epochs_completed"] for s in summaries] == [1, 2]
    assert all(s["status"] == "completed" for s in summaries)
    # Each multirun job was watched for hangs: its deadlines are on record (tests/run/test_watchdog.py).
    assert all(s["watchdog"]["deadlines_s"]["train"] >= 90.0 and not s["hangs"] for s in summaries)
    assert _when(summaries[1], "started_at") >= _when(summaries[0], "finished_at")
    # The second job's start-up counts from the first's end, not from the process's launch.
    began = _when(summaries[1], "started_at") - timedelta(seconds=summaries[1]["startup"]["phases"][0]["s"])
    assert began >= _when(summaries[0], "finished_at") - timedelta(seconds=1)  # summary times are whole seconds
    assert "started a local Ray" in (jobs[0] / "driver.log").read_text()
    assert "reusing the Ray" in (jobs[1] / "driver.log").read_text()
    # The local Ray's process group meets on the loopback address alone, as Ray's own processes listen.
    assert store_address(jobs[0]) == "127.0.0.1"

    # raydra compare on the real sweep: only the swept key differs, metrics come from summary.json.
    table = subprocess.run(
        [sys.executable, "-m", "raydra", "compare", str(jobs[0].parent), "--format", "json", "--metric", "val/acc"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = json.loads(table)
    assert [row["trainer.max_epochs"] for row in rows] == [1, 2]
    assert not [key for key in rows[0] if key.startswith(("model.", "data.", "scale."))]
    for row, job in zip(rows, jobs, strict=True):
        assert row["final val/acc"] == pytest.approx(summary_of(job)["metrics"]["final"]["val/acc"])


@pytest.mark.e2e
def test_a_job_that_cannot_run_refuses_the_multirun_before_any_job_starts(ray_cluster, tmp_path):
    started = time.time()
    done = run_train("-m", *SMALL_JOB[:-1], "scale.num_workers=1,4", outputs=tmp_path, address=ray_cluster, timeout=120)
    assert time.time() - started < 60
    assert done.returncode == 1, done.stdout + done.stderr
    # The single run's sentence, naming the job it is about.
    assert "multirun job #1 (scale.num_workers=4) cannot run, so no job was started:" in done.stdout
    assert "the run asks for 4 workers x {CPU: 1} = {CPU: 4}" in done.stdout and "cluster has {CPU: 2}" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert not _job_dirs(tmp_path)  # no job directory: no job started

    # A config that a single run would refuse refuses the multirun too, before Ray starts.
    done = run_train("-m", *SMALL_JOB, "trainer.precision=32,16-mixed", outputs=tmp_path, timeout=60)
    assert done.returncode == 1
    assert "multirun job #1 (trainer.precision=16-mixed) cannot run" in done.stdout
    assert "trainer.precision=16-mixed needs GPU workers" in done.stdout
    done = run_train("-m", *SMALL_JOB, "hydra.launcher.max_concurrent=0", outputs=tmp_path, timeout=60)
    assert done.returncode == 1 and "hydra.launcher.max_concurrent=0 must be a whole number" in done.stdout
    assert not _job_dirs(tmp_path)


@pytest.mark.e2e
def test_sigterm_stops_every_job_each_recorded_interrupted_with_its_resume_command(tmp_path):
    # No ray.address: the launcher starts a local Ray (2 CPUs, as the session cluster has) that the
    # jobs join by its address.
    args = [
        sys.executable,
        str(REPO / "train.py"),
        "-m",
        f"paths.outputs={tmp_path}",
        "ray.num_cpus=2",
        "experiment=vit_digits_smoke",
        "trainer.max_epochs=50",
        "trainer.test=false",
        "scale.num_workers=1",
        "model.optimizer.lr=1e-3,2e-3,3e-3",
    ]
    multirun = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=base_env())
    try:
        # Both running jobs have trained an epoch: their drivers handle SIGTERM by then.
        deadline = time.time() + 240
        while len([p for p in tmp_path.glob("sweeps/*/*/*/console.log") if "epoch 1/50" in p.read_text()]) < 2:
            assert multirun.poll() is None and time.time() < deadline, multirun.communicate()[0]
            time.sleep(1)
        multirun.send_signal(signal.SIGTERM)
        out, _ = multirun.communicate(timeout=180)
    finally:
        if multirun.poll() is None:
            multirun.kill()
    assert multirun.returncode == 130, out
    assert "started a local Ray with 2 CPUs" in out
    jobs = _job_dirs(tmp_path)
    assert [p.name for p in jobs] == ["0", "1"]  # job 2 was still queued: never started
    for job in jobs:
        summary = summary_of(job)
        assert summary["status"] == "interrupted" and f"resume={job}" in summary["error"], summary["error"]
        assert "joined the Ray cluster at" in (job / "driver.log").read_text()
    assert "#2 (model.optimizer.lr=0.003) not started" in out
    # The command that continues the multirun: the same one as typed, in its sweep directory.
    sweep_dir = jobs[0].parent
    (command,) = [line.strip() for line in out.splitlines() if line.strip().startswith("python ") and "hydra.launcher.resume=true" in line]
    assert command.startswith("python train.py -m ") and "model.optimizer.lr=1e-3,2e-3,3e-3" in command, command
    assert f"hydra.sweep.dir={sweep_dir}" in command, command
    record = jobs_record.read(sweep_dir)
    assert [record.job(n).status for n in (0, 1, 2)] == ["interrupted", "interrupted", "not started"]


def _epochs_logged(job: Path) -> list:
    """The epochs metrics.csv holds a validation row for, in order."""
    import csv

    with (job / "metrics.csv").open() as file:
        return [int(row["epoch"]) for row in csv.DictReader(file) if row.get("val/acc")]


@pytest.mark.e2e
def test_a_multirun_whose_launcher_is_lost_resumes_keeping_completed_jobs_and_continuing_the_others(ray_cluster, tmp_path):
    # Job 0 trains 1 epoch, job 1 ten, job 2 two (it waits for a free slot): the launcher is
    # killed (a lost driver: kill -9, no chance to stop its jobs) once job 0 has completed and job 1
    # has checkpointed two epochs (in a CI run it had one when job 0 completed, at ~2 s an epoch).
    sweep = ("trainer.max_epochs=1,10,2",)
    args = [sys.executable, str(REPO / "train.py"), "-m", f"paths.outputs={tmp_path}", *SMALL_JOB, *sweep, f"ray.address={ray_cluster}"]
    launcher = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=base_env())
    try:
        deadline = time.time() + 240
        while True:
            assert launcher.poll() is None and time.time() < deadline, launcher.communicate()[0]
            jobs = {p.name: p for p in _job_dirs(tmp_path)}
            done0 = "0" in jobs and (jobs["0"] / "summary.json").is_file() and summary_of(jobs["0"])["status"] == "completed"
            if done0 and "1" in jobs and (jobs["1"] / "metrics.csv").is_file() and len(_epochs_logged(jobs["1"])) >= 2:
                break
            time.sleep(0.5)
        launcher.kill()
        launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    jobs = _job_dirs(tmp_path)
    sweep_dir = jobs[0].parent
    # Its jobs stop as the launcher's job server goes, each recording itself interrupted.
    deadline = time.time() + 180
    while any(summary_of(j)["status"] == "running" for j in jobs if (j / "summary.json").is_file()):
        assert time.time() < deadline, [(summary_of(j)["status"], (j / "console.log").read_text()[-2000:]) for j in jobs]
        time.sleep(1)
    assert summary_of(jobs[1])["status"] == "interrupted"
    # Job 2 may have been killed before it wrote anything (it starts as job 0 ends).
    completed_before = {
        j.name: (j / "summary.json").read_bytes() for j in jobs if (j / "summary.json").is_file() and summary_of(j)["status"] == "completed"
    }
    assert "0" in completed_before

    # The same command again, resuming in the multirun's directory.
    done = run_train(
        "-m", *SMALL_JOB, *sweep, f"hydra.sweep.dir={sweep_dir}", "hydra.launcher.resume=true", outputs=tmp_path, address=ray_cluster
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p.name for p in _job_dirs(tmp_path)] == ["0", "1", "2"]  # the same job numbers and directories
    for name, before in completed_before.items():
        # A completed job is kept as it was: not trained again.
        assert (sweep_dir / name / "summary.json").read_bytes() == before
        assert f"[{name}] started" not in done.stdout
    assert f"{len(completed_before)} completed before, kept" in done.stdout
    continued = summary_of(sweep_dir / "1")
    assert continued["status"] == "completed" and continued["epochs_completed"] == 10
    assert continued["resumed"][0]["from_status"] == "interrupted"
    # From its last checkpoint: every epoch trained once.
    assert _epochs_logged(sweep_dir / "1") == list(range(10))
    assert summary_of(sweep_dir / "2")["status"] == "completed"
    record = jobs_record.read(sweep_dir)
    assert {n: job.status for n, job in record.jobs.items()} == {"0": "completed", "1": "completed", "2": "completed"}

    # Without resume, the directory's runs are never overwritten.
    again = run_train("-m", *SMALL_JOB, *sweep, f"hydra.sweep.dir={sweep_dir}", outputs=tmp_path, address=ray_cluster, timeout=120)
    assert again.returncode == 1
    assert f"hydra.sweep.dir={sweep_dir} already holds this multirun's runs" in again.stdout
    assert "hydra.launcher.resume=true" in again.stdout


MY_TRAIN = """
# A researcher's entry script: a resolver registered at import, then raydra's command.
from omegaconf import OmegaConf

from raydra.entry import hydra_main

OmegaConf.register_new_resolver("times_ten", lambda x: int(x) * 10)

if __name__ == "__main__":
    hydra_main()
"""

MY_CALLBACKS = """
import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback


class JobMarker(Callback):
    # Hydra calls these in the job's own process, around the task function.
    def on_job_start(self, config, **kwargs):
        hydra = HydraConfig.get()
        Path(hydra.runtime.output_dir, "job_start.json").write_text(
            json.dumps({"mode": str(hydra.mode), "num": hydra.job.num, "id": hydra.job.id, "override_dirname": hydra.job.override_dirname})
        )

    def on_job_end(self, config, job_return, **kwargs):
        Path(HydraConfig.get().runtime.output_dir, "job_end.json").write_text(
            json.dumps({"status": job_return.status.name, "return_value": job_return.return_value})
        )
"""


OVERRIDE_DIRNAME = (
    r"experiment=vit_digits_smoke,model.optimizer.lr=LR,name=job$\{hydra\:job.num\},"
    r"scale.num_workers=1,seed=$\{times_ten\:4\},trainer.max_epochs=1,trainer.test=False"
)


@pytest.mark.e2e
def test_each_job_is_the_job_hydra_promises_and_a_finished_job_reruns_from_its_record(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_train.py").write_text(MY_TRAIN)
    (project / "my_callbacks.py").write_text(MY_CALLBACKS)
    outputs = tmp_path / "outputs"
    # No ray.address: the launcher starts a local Ray, gone once the multirun ends.
    args = [
        sys.executable,
        "my_train.py",
        "-m",
        f"paths.outputs={outputs}",
        *SMALL_JOB,
        "model.optimizer.lr=1e-3,2e-3",
        # The sweep directory named here: the default one reads `name`, which the multirun itself
        # resolves (Hydra's sweepers do, outside any job), where no job number exists.
        f"hydra.sweep.dir={outputs / 'sweep'}",
        "name=job${hydra:job.num}",
        "seed=${times_ten:4}",
        "hydra.sweep.subdir=job_${hydra.job.num}",
        "+hydra.callbacks.marker._target_=my_callbacks.JobMarker",
    ]
    done = subprocess.run(args, cwd=project, capture_output=True, text=True, timeout=600, env=own_local_ray_env())
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = sorted(p for p in (outputs / "sweep").glob("job_*") if p.is_dir())
    assert [p.name for p in jobs] == ["job_0", "job_1"]
    for num, job in enumerate(jobs):
        hydra = yaml.safe_load((job / ".hydra" / "hydra.yaml").read_text())["hydra"]
        assert hydra["mode"] == "MULTIRUN" and hydra["job"]["num"] == num and str(hydra["job"]["id"]) == str(num)
        summary = summary_of(job)
        assert summary["status"] == "completed"
        assert summary["name"] == f"job{num}"  # ${hydra:job.num} inside the job's config
        config = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
        # The script's resolver, in the job's process (the record keeps the interpolation as typed).
        assert config["seed"] == "${times_ten:4}" and summary["seed"] == 40
        # The overrides as typed: nothing of raydra's (the cluster's address) among them.
        typed = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        assert not [o for o in typed if o.startswith("ray.")] and config["ray"]["address"] is None
        # Hydra's callbacks ran in the job, around it, and saw what Hydra's basic launcher gives.
        started = json.loads((job / "job_start.json").read_text())
        assert started == {
            "mode": "RunMode.MULTIRUN",
            "num": num,
            "id": str(num),
            # As the basic launcher gives it: the job's overrides as typed, sorted, less
            # paths.outputs (raydra's exclude_keys), the interpolations escaped as Hydra escapes them.
            "override_dirname": OVERRIDE_DIRNAME.replace("LR", ("0.001", "0.002")[num]),
        }, started
        ended = json.loads((job / "job_end.json").read_text())
        assert ended == {"status": "COMPLETED", "return_value": summary["metrics"]["best"]["val/acc"]}

    # The finished job runs again from its own record, the multirun's cluster long gone. (Its seed
    # came through the script's resolver, which raydra rerun does not register: given as a value.)
    rerun = subprocess.run(
        [sys.executable, "-m", "raydra", "rerun", str(jobs[0]), f"paths.outputs={outputs}", "seed=40"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=own_local_ray_env(),
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    (again,) = [p.parent for p in outputs.glob("runs/*/*/summary.json")]
    assert summary_of(again)["status"] == "completed" and summary_of(again)["reproduces"] == str(jobs[0])


@pytest.fixture(scope="module")
def ray_dashboard(ray_cluster):
    """The session cluster's dashboard: Ray's job server, the address `ray job submit` takes."""
    done = subprocess.run(
        [sys.executable, "-c", f"import ray; print(ray.init(address={ray_cluster!r}).dashboard_url)"],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return "http://" + done.stdout.strip().splitlines()[-1]


@pytest.mark.e2e
def test_a_run_submitted_as_a_ray_job_trains_on_the_cluster_and_leaves_its_record(ray_cluster, ray_dashboard, tmp_path):
    """Also ray.address=auto joining the cluster RAY_ADDRESS names (Ray's job hands it to its
    driver), and logger=none."""
    ray = str(Path(sys.executable).parent / "ray")
    for _ in range(3):
        done = subprocess.run(
            [
                ray,
                "job",
                "submit",
                "--address",
                ray_dashboard,
                "--working-dir",
                str(REPO),
                "--",
                sys.executable,
                "train.py",
                "ray.address=auto",
                *SMALL_JOB,
                "logger=none",
                f"paths.outputs={tmp_path}",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            env=base_env(),
            timeout=600,
        )
        # The job server answers this, before it takes the job, when its agent on the head node
        # does not answer within 10 s (seen on this 2-CPU machine under load); it asks to retry.
        if "No available agent to submit job" not in done.stdout + done.stderr:
            break
        time.sleep(5)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "succeeded" in done.stdout and "done in" in done.stdout
    (run_dir,) = run_dirs(tmp_path)
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["epochs_completed"] == 1
    assert "ray.address=auto" in summary["overrides"]
    # It joined the cluster it was submitted to, through the job's RAY_ADDRESS, and said so.
    assert f"joined the Ray cluster at {ray_cluster} " in (run_dir / "driver.log").read_text()
    assert f"joined the Ray cluster at {ray_cluster} " in done.stdout
    # logger=none: no logger's files.
    assert not (run_dir / "metrics.csv").exists() and not (run_dir / "wandb").exists()
