"""SLURM for real: Debian's slurm-wlm on this machine (slurmctld, two slurmd as nodes node1 and
node2 of 1 CPU each, a munged of its own, on free ports; raydra.testing.start_slurm), jobs sent with
sbatch, salloc and `raydra submit`, and SLURM's own time limit, requeue and scancel acting on them.
Both nodes are this host: they share its disk, as a SLURM cluster's nodes share theirs.

The allocation's Ray cluster is one Ray node per SLURM node, so a 2-worker run of 1 CPU each has a
worker on each node. What runs on the allocation is raydra's own code path, unchanged.
"""

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from helpers import REPO, base_env, ran_side_by_side, run_dirs, summary_of
from omegaconf import OmegaConf
from probe import seen_per_epoch

from raydra.records import layout
from raydra.testing import start_slurm, stop_slurm

# Epochs of ~1 s on the two 1-CPU nodes; the time-limit run needs epochs to spare after its notice.
RUN = ("experiment=vit_digits_smoke", "logger=csv", "trainer.test=false", "ray.working_dir=null")
NOTICE = re.compile(r"preemption notice \(SIGTERM\) after global step (\d+); saving a checkpoint at global step (\d+)")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a SLURM of the tests' own runs as root (SlurmUser=root)")
    root = Path(tmp_path_factory.mktemp("slurm", numbered=True))
    # munge's socket lives under the root: keep the path short.
    short = Path("/tmp") / f"slurm-{root.name}-{os.getpid()}"
    short.mkdir()
    try:
        cluster = start_slurm(short, nodes=2, cpus_per_node=1)
    except RuntimeError as error:
        if "is not installed" in str(error):
            pytest.skip(f"{error}")
        raise
    try:
        yield cluster
    finally:
        stop_slurm(cluster)
        # Its logs and state where pytest keeps a test's files; the short directory goes.
        shutil.copytree(short, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.sock", "*.socket"))
        shutil.rmtree(short, ignore_errors=True)


def _env(slurm) -> dict:
    return {**base_env(), **slurm.env}


def _sbatch(slurm, script: Path, env: dict = None) -> str:
    env = env or _env(slurm)
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _job(slurm, job: str) -> dict:
    """The job's state as scontrol says it ({} once SLURM has forgotten it)."""
    try:
        text = slurm.command("scontrol", "show", "job", job, "-o")
    except subprocess.CalledProcessError:
        return {}
    return dict(field.split("=", 1) for field in text.split() if "=" in field)


def _wait_job_gone(slurm, job: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = _job(slurm, job).get("JobState")
        if state in (None, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return
        time.sleep(1)
    pytest.fail(f"SLURM job {job} still {state} after {timeout} s")


def _batch_script(path: Path, output: Path, command: list, nodes: int = 2) -> Path:
    path.write_text(
        "\n".join(["#!/bin/bash", f"#SBATCH --nodes={nodes}", f"#SBATCH --output={output}", f"cd {REPO}", "exec " + " ".join(command), ""])
    )
    return path


def _left_running(record_dir: Path) -> list:
    """What is left on this machine of the Ray cluster a job started across its allocation: the
    processes and temp dirs of its nodes (each node's `ray start` output names its temp dir)."""
    temp_dirs = set()
    for log in record_dir.glob("logs/slurm-ray-*.log"):
        temp_dirs |= set(re.findall(r"(/\S+/ray-\d+-[^/\s]+)/session_", log.read_text(errors="replace")))
    assert temp_dirs, f"no node of the job's cluster said where its temp dir is: {list(record_dir.glob('logs/*'))}"
    left = [d for d in temp_dirs if Path(d).exists()]
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        left += [f"{proc.pid}: {line[:200]}" for d in temp_dirs if d in line]
    return left


def _wait_for(what, timeout: float, why):
    """`what()` once it is true, polled every second; else fail with `why` (a callable: said as
    things stand at the timeout)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = what()
        if found:
            return found
        time.sleep(1)
    pytest.fail(why() if callable(why) else why)


@pytest.mark.e2e
def test_a_run_larger_than_its_allocation_is_refused_naming_both_numbers(slurm, tmp_path):
    command = [
        sys.executable,
        "train.py",
        *RUN,
        f"paths.outputs={tmp_path}",
        "ray.address=slurm",
        "scale.num_workers=3",
        "data.batch_size=33",
    ]
    done = subprocess.run(["salloc", "--nodes=2", *command], capture_output=True, text=True, env=_env(slurm), cwd=REPO, timeout=300)
    assert done.returncode == 1
    said = done.stdout + done.stderr
    assert re.search(
        r"scale\.num_workers=3 workers of 1 CPU each do not fit SLURM job \d+ \(2 nodes x 1 CPUs\), which holds 2 such workers", said
    ), said
    assert "started Ray" not in said

    # raydra submit refuses it before sbatch, against the allocation slurm.* asks for.
    submit = _submit(slurm, tmp_path, "scale.num_workers=3", "data.batch_size=33", "slurm.nodes=2", "slurm.cpus_per_node=1")
    assert submit.returncode == 1
    assert "scale.num_workers=3 workers of 1 CPU each do not fit the allocation slurm.* asks for (2 nodes x 1 CPUs)" in submit.stderr
    assert not list(tmp_path.glob("runs/*/*/slurm.sh"))


def _submit(slurm, outputs: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).parent / "raydra"), "submit", *RUN, f"paths.outputs={outputs}", *overrides]
    return subprocess.run(command, capture_output=True, text=True, env=_env(slurm), cwd=REPO, timeout=300)


def _submitted(done: subprocess.CompletedProcess) -> tuple:
    assert done.returncode == 0, done.stdout + done.stderr
    job = re.search(r"submitted SLURM job (\d+)", done.stdout).group(1)
    run_dir = Path(re.search(r"\n  dir +(\S+)", done.stdout).group(1))
    return job, run_dir


def _registered_checkpoint(run_dir: Path) -> bool:
    """Whether Ray Train has registered a checkpoint of the run (its snapshot lists one)."""
    for snapshot in run_dir.glob("checkpoints/*/checkpoint_manager_snapshot.json"):
        try:
            if json.loads(snapshot.read_text())["checkpoint_results"]:
                return True
        except (ValueError, KeyError):
            pass  # being written
    return False


def _seconds(runtime: str) -> int:
    """SLURM's RunTime ("[D-]HH:MM:SS") in seconds."""
    days, _, clock = runtime.rpartition("-")
    hours, minutes, seconds = map(int, clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


@pytest.mark.e2e
def test_a_submitted_run_meets_its_time_limit_checkpoints_requeues_and_trains_every_sample_once(slurm, tmp_path):
    # Steps of at least 300 ms: the 11 epochs after the first train for longer than the up to ~110 s
    # the warning may take to come (below): ~125 s of pauses alone, so on a machine twice as fast
    # too. Few, long epochs: the requeued attempt trains the rest without the pauses (~3 s an
    # epoch), and each epoch fewer left to it is time saved.
    epochs = 12
    # Once requeued, the rest trains without the pauses (tests.probe.RecordingViT's pause_until).
    fast = tmp_path / "fast"
    # No periodic checkpoint: whatever the requeued job continues from, the notice saved.
    done = _submit(
        slurm, tmp_path, f"trainer.max_epochs={epochs}", "checkpoint.every_n_epochs=1000", "model._target_=tests.probe.RecordingViT", "+model.pause_s=0.3",
        f"+model.pause_until={fast}", "slurm.nodes=2", "slurm.time=10", "slurm.notice_before_s=60",
    )  # fmt: skip
    job, run_dir = _submitted(done)
    script = (run_dir / layout.SLURM_SCRIPT).read_text()
    assert "#SBATCH --signal=B:USR1@60" in script and "#SBATCH --requeue" in script and "#SBATCH --time=10" in script
    assert f"ray.address=slurm hydra.run.dir={run_dir}" in script
    output = run_dir / layout.SLURM_OUTPUT.replace("%j", job)
    assert str(output) in done.stdout

    # SLURM's own warning: once the run trains, the job's time limit (whole minutes) is cut to
    # 61-120 s from now, so that the warning, 60 s before it, is due 1-60 s from now; slurmctld
    # sends it at its next check of time limits (13 s and 47 s later, measured).
    _wait_for(lambda: output.is_file() and "epoch 1/" in output.read_text(), 240, "the run trained no epoch")
    limit = math.ceil((_seconds(_job(slurm, job)["RunTime"]) + 61) / 60)
    slurm.command("scontrol", "update", f"JobId={job}", f"TimeLimit={limit}")
    # The requeued job gets the time to finish.
    _wait_for(lambda: _job(slurm, job).get("Restarts") == "1", 240, lambda: f"not requeued: {output.read_text()}")
    fast.touch()
    slurm.command("scontrol", "update", f"JobId={job}", "TimeLimit=15")
    _wait_job_gone(slurm, job, 400)

    said = output.read_text()
    summary = summary_of(run_dir)
    assert summary["status"] == "completed", said
    assert summary["epochs_completed"] == epochs and summary["slurm"]["restarts"] == 1
    # Watched for hangs on SLURM too: the requeued job's deadlines are on record (tests/run/test_watchdog.py).
    assert summary["watchdog"]["deadlines_s"]["train"] >= 90.0 and not summary["hangs"]
    (attempt,) = summary["resumed"]
    assert attempt["from_status"] == "interrupted"
    assert "SLURM's time limit is near (SIGUSR1" in said and f"requeued SLURM job {job}" in said
    assert f"SLURM requeued job {job}: continuing its run {run_dir}" in said
    # The notice's checkpoint came at the step in flight (said by the rank that noticed it first),
    # and the requeued job went on from it.
    logs = " ".join(path.read_text() for path in sorted(run_dir.glob("logs/worker_*.log")))
    at_signal, saved = map(int, NOTICE.search(logs).groups())
    resumed = re.search(r"resumed from .* \(global step (\d+)\)", logs)
    assert resumed and int(resumed.group(1)) == saved and saved - at_signal <= 64
    # Every training sample once per epoch, over both attempts: the interrupted epoch holds what
    # every other holds, the whole training split, each sample once but for the one DistributedSampler
    # repeats (a different one each epoch) to give both workers as many: nothing trained twice, nothing skipped.
    seen = seen_per_epoch(run_dir)
    assert sorted(seen) == list(range(epochs))
    per_epoch = [sum(ranks.values(), []) for _, ranks in sorted(seen.items())]
    split = set(per_epoch[0])
    for samples in per_epoch:
        assert set(samples) == split and len(samples) == len(split) + 1
    assert not _left_running(run_dir)


@pytest.mark.e2e
def test_scancel_leaves_the_run_interrupted_and_resume_continues_it(slurm, ray_cluster, tmp_path):
    # Epochs of ~4 s (steps of at least 50 ms): time to cancel after the first checkpoint, little to resume.
    # The resume trains without the pauses (tests.probe.RecordingViT's pause_until).
    fast = tmp_path / "fast"
    slow = ("model._target_=tests.probe.RecordingViT", "+model.pause_s=0.05", f"+model.pause_until={fast}")
    job, run_dir = _submitted(_submit(slurm, tmp_path, "trainer.max_epochs=5", *slow, "slurm.nodes=2"))
    _wait_for(lambda: _registered_checkpoint(run_dir), 240, "the run registered no checkpoint")
    slurm.command("scancel", job)
    _wait_job_gone(slurm, job, 120)
    fast.touch()

    summary = summary_of(run_dir)
    assert summary["status"] == "interrupted"
    assert summary["error"].endswith(f"continue it with resume={run_dir}")
    assert summary["checkpoints"]["last"]
    # The head's keeper (python -m raydra.cluster.ray_node) stops the head and removes its temp dir itself.
    # Ray ends a driver whose raylet scancel stopped before the driver stops the head, and the job
    # leaves squeue with the driver: the keeper may still be at it then (seen in a CI-like run).
    _wait_for(lambda: not _left_running(run_dir), 30, lambda: f"the job's Ray outlived it by 30 s: {_left_running(run_dir)}")

    # By hand, elsewhere (here: the session's Ray cluster), with the command the run was started with.
    overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    overrides = [o for o in overrides if not o.startswith(("ray.address=", "paths.outputs="))]
    resumed = subprocess.run(
        [sys.executable, "train.py", *overrides, f"resume={run_dir}", f"paths.outputs={tmp_path}", f"ray.address={ray_cluster}"],
        capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert summary_of(run_dir)["status"] == "completed"


def _gcs_answers(address: str) -> str:
    """How a Ray GCS at `address` answers a client that sends no token: "answered", or the gRPC
    status it refuses with (UNAUTHENTICATED under token authentication). One call of the GCS's
    own, as a ray.init without the token makes first (which, refused, retries for ~20 s)."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId", request_serializer=bytes, response_deserializer=bytes)
        try:
            call(b"", timeout=10)
            return "answered"
        except grpc.RpcError as error:
            return error.code().name


@pytest.mark.e2e
def test_a_multirun_inside_one_allocation_runs_its_jobs_side_by_side_on_it(slurm, tmp_path):
    """A researcher's own batch script (not `raydra submit`'s), in an environment that says nothing
    of Ray's authentication: Ray across the allocation, a node on each SLURM node, with a token made
    for the job (a client without it is refused; every job joins with it), and nothing of it left
    once the job ends. The same holds for a single run in such a script (the same start and stop;
    test_scancel and the time-limit test check a single run's record and clean-up)."""
    out = tmp_path / "job.out"
    command = [
        sys.executable, "train.py", "-m", *RUN, "trainer.max_epochs=3", "scale.num_workers=1", "model.optimizer.lr=1e-3,3e-3",
        f"paths.outputs={tmp_path}", "ray.address=slurm",
    ]  # fmt: skip
    unauthenticated = {k: v for k, v in _env(slurm).items() if not k.startswith("RAY_AUTH")}
    job = _sbatch(slurm, _batch_script(tmp_path / "job.sh", out, command), env=unauthenticated)
    joined = re.compile(r"joined the Ray cluster at (\S+) with")
    found = _wait_for(lambda: out.is_file() and joined.search(out.read_text()), 240, lambda: f"Ray never started: {out.read_text()}")
    assert _gcs_answers(found.group(1)) == "UNAUTHENTICATED"
    _wait_job_gone(slurm, job, 400)

    jobs = run_dirs(tmp_path, "sweeps")
    first, second = (summary_of(d) for d in jobs)
    assert first["status"] == second["status"] == "completed", out.read_text()
    assert ran_side_by_side(first, second)
    assert first["slurm"] == second["slurm"] == {"job_id": job, "nodes": "node[1-2]", "restarts": 0}
    assert first["world_size"] == second["world_size"] == 1 and first["epochs_completed"] == 3
    # A Ray node on each SLURM node, the head where the batch script ran: 1 CPU each, a job on each.
    assert f"started Ray across SLURM job {job} (2 nodes x 1 CPUs): head on node1, nodes on node2" in out.read_text()
    # The multirun's launcher started Ray across the allocation; its nodes' logs are the sweep's.
    for node in ("node1", "node2"):
        assert "Ray runtime started" in (jobs[0].parent / layout.slurm_node_log(node)).read_text()
    assert not _left_running(jobs[0].parent)


# ---------------------------------------------------------------------------------------------
# What needs no SLURM daemon: reading an allocation, the batch script, finding a requeued job's run


def test_a_fit_that_ends_while_the_notice_waits_for_its_workers_leaves_ray_only_after_it(monkeypatch):
    # The notice's thread asks Ray until the SIGTERMed workers are gone; Ray Train may end the fit
    # first (their failure). A Ray call after the driver's ray.shutdown ends the process before the
    # requeue (CI): the fit's block is left only once the thread is done, and the job still counts
    # as one a requeue continues.
    from raydra.slurm import time_limit

    said = []
    monkeypatch.setattr(time_limit, "_state", {"watched": True, "at": None, "action": None, "thread": None, "continues": False})
    monkeypatch.setattr(time_limit, "signal_run_workers", lambda signum: ["worker-actor"])

    def wait_gone(actor_ids, timeout):
        time.sleep(1)
        said.append("the notice's thread is done with Ray")

    monkeypatch.setattr(time_limit, "_wait_gone", wait_gone)
    with pytest.raises(RuntimeError):
        with time_limit.run_stops_on_notice():
            time_limit._on_notice(time_limit.NOTICE, None)
            raise RuntimeError("Ray Train: the run's workers failed")
    said.append("the driver leaves Ray")
    assert said == ["the notice's thread is done with Ray", "the driver leaves Ray"]
    assert time_limit._state["continues"]


def test_an_allocation_is_read_from_slurms_variables(monkeypatch):
    from raydra.slurm import allocation

    monkeypatch.setattr(allocation, "hostnames", lambda nodelist: {"gpu[01-03]": ["gpu01", "gpu02", "gpu03"]}[nodelist])
    env = {
        "SLURM_JOB_ID": "48213", "SLURM_JOB_NODELIST": "gpu[01-03]", "SLURM_JOB_CPUS_PER_NODE": "64(x2),32",
        "SLURM_GPUS_PER_NODE": "a100:8", "SLURMD_NODENAME": "gpu01", "SLURM_RESTART_COUNT": "2",
    }  # fmt: skip
    found = allocation.current(env)
    assert found.nodes == ("gpu01", "gpu02", "gpu03") and found.cpus == (64, 64, 32)
    assert found.gpus_per_node == 8 and found.here == "gpu01" and found.others == ["gpu02", "gpu03"] and found.restarts == 2
    assert found.describe() == "SLURM job 48213 (3 nodes x 64/64/32 CPUs, 8 GPUs each)"
    # An salloc shell on a login node: the head holds nothing of the allocation, every node gets a Ray node.
    outside = allocation.current({**env, "SLURMD_NODENAME": ""})
    assert outside.here is None and outside.others == ["gpu01", "gpu02", "gpu03"]
    assert allocation.gpus_per_node({"SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_NODE": "8"}) == 4
    assert allocation.requeued(env) == "48213" and allocation.requeued({**env, "SLURM_RESTART_COUNT": "0"}) is None


@pytest.mark.parametrize(
    "env, said",
    [
        ({}, "ray.address=slurm starts Ray across a SLURM allocation, but this process runs outside one (no SLURM_JOB_ID)"),
        (
            {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4"},
            "this is one of 4 tasks of job step 7.0, each of which would start its own",
        ),
        (
            {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "eight"},
            "SLURM_JOB_CPUS_PER_NODE=eight is not in SLURM's form",
        ),
    ],
)
def test_what_is_not_an_allocation_raydra_can_use_is_said_in_one_sentence(monkeypatch, env, said):
    from raydra.errors import RaydraError
    from raydra.slurm import allocation

    monkeypatch.setattr(allocation, "hostnames", lambda nodelist: [nodelist])
    with pytest.raises(RaydraError, match=re.escape(said)):
        allocation.current(env)


def test_what_submit_asks_for_follows_the_workers_unless_slurm_says(tmp_path):
    from helpers import composed

    from raydra.slurm.allocation import asked_for

    cfg = composed("scale=gpu", "scale.num_workers=16", "scale.cpus_per_worker=4", "slurm.nodes=2")
    slurm, scale = (OmegaConf.to_object(cfg[key]) for key in ("slurm", "scale"))
    assert asked_for(slurm, scale) == (32, 8)
    cfg = composed("scale.num_workers=3", "scale.cpus_per_worker=2", "slurm.nodes=2", "slurm.gpus_per_node=1")
    assert asked_for(*(OmegaConf.to_object(cfg[key]) for key in ("slurm", "scale"))) == (4, 1)


def test_the_batch_script_holds_slurms_options_the_setup_and_the_run_as_the_batch_shell(tmp_path, monkeypatch):
    from raydra.slurm import submit

    monkeypatch.chdir(tmp_path)
    overrides = [
        f"paths.outputs={tmp_path}", "scale=gpu", "scale.num_workers=16", "scale.cpus_per_worker=4", "slurm.nodes=2", "slurm.time=04:00:00", "slurm.partition=gpu",
        "slurm.account=lab", 'slurm.sbatch=["--mem=0","--exclusive"]', "slurm.setup=[module load cuda/12.4]", "tags=[a b]",
    ]  # fmt: skip
    cfg = submit._compose(overrides, None, multirun=False)
    directory = Path(cfg.hydra.run.dir)
    script = submit.batch_script(
        cfg, *(OmegaConf.to_object(cfg[k]) for k in ("slurm", "scale")), overrides, None, False, directory, "raydra submit ..."
    )
    lines = script.splitlines()
    sbatch = [line.split(" ", 1)[1] for line in lines if line.startswith("#SBATCH")]
    assert sbatch == [
        "--job-name=vit_digits", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=32", "--gpus-per-node=8", "--time=04:00:00",
        "--partition=gpu", "--account=lab", "--signal=B:USR1@120", "--requeue", "--open-mode=append",
        f"--output={directory}/slurm-%j.out", "--mem=0", "--exclusive",
    ]  # fmt: skip
    assert "module load cuda/12.4" in lines
    # raydra is the batch shell (exec), which SLURM's B: signal reaches; an override with a space stays one word.
    assert lines[-1] == "exec " + " ".join(
        shlex.quote(part)
        for part in [sys.executable, "-m", "raydra", "train", *overrides, "ray.address=slurm", f"hydra.run.dir={directory}"]
    )
    assert "'tags=[a b]'" in lines[-1] and "'slurm.setup=[module load cuda/12.4]'" in lines[-1]
    # Without the warning, SLURM must not requeue a job that nothing checkpointed for.
    quiet = submit._compose([*overrides, "slurm.notice_before_s=null"], None, multirun=False)
    quiet_script = submit.batch_script(
        quiet, *(OmegaConf.to_object(quiet[k]) for k in ("slurm", "scale")), overrides, None, False, directory, ""
    )
    assert "--signal" not in quiet_script and "#SBATCH --no-requeue" in quiet_script


def test_submit_refuses_a_sweep_without_m_and_another_clusters_address(tmp_path, monkeypatch, capsys):
    from raydra.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch: nothing may reach it anyway
    for args, said in [
        (["model.optimizer.lr=1e-3,1e-2"], "model.optimizer.lr=1e-3,1e-2 sweeps over values; add -m to submit a multirun"),
        (["ray.address=auto"], "ray.address=auto: a submitted job runs on Ray across its own allocation (ray.address=slurm); drop it."),
        (["--cfg", "job"], "--cfg is not an option of raydra submit"),
    ]:
        assert main(["submit", f"paths.outputs={tmp_path}", *args]) == 1
        assert said in capsys.readouterr().err
    assert not list(tmp_path.glob("runs/*/*/slurm.sh"))


def test_a_requeued_job_finds_the_run_it_started_and_no_other(tmp_path):
    from helpers import composed

    from raydra.run import resume

    def recorded(name: str, job: str, started: str, hashed: bool = True) -> Path:
        run_dir = tmp_path / "runs" / "2026-11-26" / f"{started}_{name}"
        run_dir.mkdir(parents=True)
        record = {"name": name, "started_at": f"2026-11-26T{started}", "slurm": {"job_id": job}, **({"config_hash": "x"} if hashed else {})}
        (run_dir / "summary.json").write_text(json.dumps(record))
        return run_dir

    mine = recorded("vit_digits", "48213", "09-00-00")
    recorded("vit_digits", "48214", "09-05-00")  # another job's, newer
    recorded("other", "48213", "09-06-00")  # another run's name
    recorded("vit_digits", "48213", "09-07-00", hashed=False)  # refused before it started
    cfg = composed(f"paths.outputs={tmp_path}")
    assert resume.of_slurm_job(cfg, "48213") == mine
    assert resume.of_slurm_job(cfg, "1") is None


def test_a_mid_epoch_report_ranks_last_and_stays_a_number_through_json():
    from raydra.worker.checkpoint_report import UNVALIDATED

    for mode, better in (("max", 0.1), ("min", 9.0)):
        value = json.loads(json.dumps({"val": UNVALIDATED[mode]}, allow_nan=False))["val"]
        assert value == UNVALIDATED[mode]
        assert (better > value) if mode == "max" else (better < value)


@pytest.mark.e2e
def test_submitits_launcher_runs_each_job_as_a_slurm_job_of_its_own_with_ray_across_it(slurm, tmp_path):
    """One SLURM job per Hydra job (hydra-submitit-launcher, a dev dependency): each job's process
    is the one task of its own allocation, where ray.address=slurm starts and stops its cluster."""
    command = [
        sys.executable, "train.py", "-m", "hydra/launcher=submitit_slurm", "hydra.launcher.nodes=1", "hydra.launcher.tasks_per_node=1",
        "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10", "hydra.launcher.partition=debug", *RUN, "trainer.max_epochs=1",
        "scale.num_workers=1", "model.optimizer.lr=1e-3,3e-3", f"paths.outputs={tmp_path}", "ray.address=slurm",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=_env(slurm), cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    jobs = run_dirs(tmp_path, "sweeps")
    records = [summary_of(d) for d in jobs]
    assert [r["status"] for r in records] == ["completed", "completed"]
    # Two SLURM jobs, one node each, both at once on the two nodes.
    assert len({r["slurm"]["job_id"] for r in records}) == 2 and ran_side_by_side(*records)
    # submitit returns once the jobs' results are in; the jobs then stop their clusters and end.
    _wait_for(lambda: not slurm.command("squeue", "-h", "-o", "%i").split(), 120, "the jobs did not end")
    for job_dir in jobs:
        assert not _left_running(job_dir)
