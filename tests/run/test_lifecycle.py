"""raydra.run.lifecycle: the one lifecycle of a single run, a Tune sweep and a multirun's jobs. Seams, no
Ray: a stand-in connect that puts in a SIGTERM handler of its own as ray.init does, the stop signals
sent to this test's own process, a stand-in batch system's stop notice (as test_batch_system's).

Each of the three goes through its real code (the driver and the sweep through train.py's entry in
this process, the launcher through run_jobs) with only Ray's part stood in for: SIGTERM and Ctrl-C
settle its record `interrupted` with the command that continues it, an error settles it `failed`
with its one sentence, and the stop notice ends it interrupted with the notice's words."""

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import ray.tune
from helpers import STAND_IN_NOTICE, StandInBatchSystem, composed, run_dirs, summary_of
from omegaconf import OmegaConf

from hydra_plugins.raydra_launcher.raydra_launcher import RaydraLauncherConf
from raydra.cluster import batch_system, ray_cluster
from raydra.errors import RaydraError
from raydra.multirun import admission, launcher, outcome, scheduling
from raydra.multirun.job import Job
from raydra.records import jobs as jobs_record
from raydra.records import sweep, sync
from raydra.run import fit, lifecycle
from raydra.run.lifecycle import Ending, Lifecycle
from raydra.run.sequence import RunSequence
from raydra.sweep import tuner

SIGNALLED = "interrupted (Ctrl-C or SIGTERM); continue it with "
NOTICE_WORDS = STAND_IN_NOTICE


class NotHandled(Exception):
    """SIGTERM reached the handler that was there before the lifecycle: it took no stop signals."""


@pytest.fixture
def sigterm_unhandled_fails():
    """A SIGTERM the lifecycle does not take raises NotHandled instead of ending pytest."""

    def fallback(signum, frame):
        raise NotHandled("SIGTERM reached the test's own handler")

    before = signal.signal(signal.SIGTERM, fallback)
    yield fallback
    signal.signal(signal.SIGTERM, before)


@pytest.fixture
def stand_in_connect(monkeypatch):
    """cluster.connect's stand-in: records its call and, as ray.init does, installs a SIGTERM handler
    that exits at once, so stop signals taken before connecting are lost."""
    calls = []

    def connect(address, num_cpus, verbose, runtime_env=None, **settings):
        def rays(signum, frame):
            sys.exit(signum)

        calls.append({"address": address, "handler": rays, **settings})
        signal.signal(signal.SIGTERM, rays)

    monkeypatch.setattr(ray_cluster, "connect", connect)
    return calls


@pytest.fixture
def notice(monkeypatch):
    def watched(comes):
        stand_in = StandInBatchSystem(comes)
        monkeypatch.setitem(batch_system._watched, "system", stand_in)
        return stand_in

    return watched


def stop_with(signum):
    """The work's stand-in: the stop signal to this process, then work until it lands."""

    def work(*args, **kwargs):
        os.kill(os.getpid(), signum)
        deadline = time.time() + 10
        while time.time() < deadline:
            time.sleep(0.01)
        raise AssertionError(f"signal {signum} did not stop the work")

    return work


def fail_with(error):
    def work(*args, **kwargs):
        raise error

    return work


# ---------------------------------------------------------------------------------------------
# The lifecycle itself


def test_the_lifecycle_connects_then_takes_sigterm_and_puts_back_the_handler_it_found(stand_in_connect, sigterm_unhandled_fails, tmp_path):
    cfg = composed("ray.address=auto")
    endings = []
    with pytest.raises(KeyboardInterrupt):
        with Lifecycle(endings.append, continue_with=lambda: "resume=/r") as life:
            life.connect(cfg, tmp_path, dashboard=False)
            stop_with(signal.SIGTERM)()
    assert [c["address"] for c in stand_in_connect] == ["auto"] and stand_in_connect[0]["dashboard"] is False
    assert endings == [Ending("interrupted", SIGNALLED + "resume=/r")]
    # What was there once connected (Ray's handler) is put back as the block ends.
    assert signal.getsignal(signal.SIGTERM) is stand_in_connect[0]["handler"]


def test_local_mode_connects_to_nothing_and_sigterms_at_once_record_comes_before_the_final_one(
    stand_in_connect, sigterm_unhandled_fails, tmp_path
):
    endings = []
    with pytest.raises(KeyboardInterrupt):
        with Lifecycle(endings.append, continue_with=lambda: "resume=/r", settle_at_once=True) as life:
            life.connect(None, tmp_path, local=True)
            stop_with(signal.SIGTERM)()
    assert stand_in_connect == []
    assert [(e.status, e.final) for e in endings] == [("interrupted", False), ("interrupted", True)]
    assert signal.getsignal(signal.SIGTERM) is sigterm_unhandled_fails


def test_an_error_settles_failed_with_its_one_sentence_and_a_return_completed(tmp_path):
    endings = []
    for error in (RaydraError("data.root=/x does not exist; point it at the data."), RuntimeError("it broke\nat line 3")):
        with pytest.raises(type(error)):
            with Lifecycle(endings.append, continue_with=lambda: "resume=/r"):
                raise error
    with Lifecycle(endings.append, continue_with=lambda: "resume=/r"):
        pass
    assert endings == [
        Ending("failed", "data.root=/x does not exist; point it at the data."),
        Ending("failed", "RuntimeError: it broke"),
        Ending("completed"),
    ]


def test_the_notice_ends_the_work_interrupted_with_its_words_before_connecting_or_while_it_runs(stand_in_connect, notice, tmp_path):
    endings = []
    notice("before")
    with pytest.raises(KeyboardInterrupt):
        with Lifecycle(endings.append, continue_with=lambda: "resume=/r") as life:
            life.connect(composed("ray.address=auto"), tmp_path)
    assert stand_in_connect == []  # nothing would run: Ray is not started for it
    # Work the notice stopped reports itself failed (Ray Train, of its SIGTERMed workers): interrupted.
    during = notice("during")
    with pytest.raises(KeyboardInterrupt):
        with Lifecycle(endings.append, continue_with=lambda: "resume=/r") as life:
            with life.stops_on_notice(lambda: True):
                raise RuntimeError("the workers failed")
    assert during.acted == [True]
    assert endings == [Ending("interrupted", f"{NOTICE_WORDS}; continue it with resume=/r")] * 2


# ---------------------------------------------------------------------------------------------
# A single run (the driver), in local mode and on a stand-in Ray


@pytest.mark.parametrize("mode", ["local", "ray"])
@pytest.mark.parametrize("stop", ["sigterm", "ctrl_c", "error"])
def test_a_run_settles_interrupted_with_its_resume_command_or_failed_with_its_sentence(
    train_here, stand_in_connect, sigterm_unhandled_fails, monkeypatch, tmp_path, mode, stop
):
    from raydra.run import driver

    work = {"sigterm": stop_with(signal.SIGTERM), "ctrl_c": stop_with(signal.SIGINT), "error": fail_with(RuntimeError("the fit broke"))}
    monkeypatch.setattr(fit, "fit_and_record", work[stop])
    if mode == "ray":
        # What asks the Ray the stand-in did not start.
        monkeypatch.setattr(driver, "_check_and_import_in_background", lambda cfg, target, **how: lambda: None)
        monkeypatch.setattr(driver, "check_fits", lambda scale: None)
        monkeypatch.setattr(sync, "check_shared", lambda run_dir: None)
    workers = "0" if mode == "local" else "1"
    done = train_here("experiment=vit_digits_smoke", "logger=csv", f"scale.num_workers={workers}", "ray.address=auto", outputs=tmp_path)
    (run_dir,) = run_dirs(tmp_path)
    summary = summary_of(run_dir)
    assert len(stand_in_connect) == (mode == "ray")
    if stop == "error":
        assert done.returncode == 1 and (summary["status"], summary["error"]) == ("failed", "RuntimeError: the fit broke")
        assert "error: RuntimeError: the fit broke" in done.stdout
    else:
        assert done.returncode == 130, done.stdout + done.stderr
        assert (summary["status"], summary["error"]) == ("interrupted", f"{SIGNALLED}resume={run_dir}")
        assert f"continue it with resume={run_dir}" in done.stdout


def test_a_ray_runs_driver_checks_the_target_arguments_and_a_launchers_job_leaves_it_to_the_launcher():
    """A Ray run's driver refuses a `_target_`'s bad argument as Ray starts (importing the optimizer's
    and scheduler's modules for it); a job of raydra's launcher, whose config the launcher checked
    before any job started, is not made to import them for the same check in every job."""
    from raydra.run import driver

    cfg = composed("experiment=vit_digits_smoke", "model.optimizer.lr=fast")
    with pytest.raises(RaydraError, match="model.optimizer.lr"):
        driver._check_and_import_in_background(cfg, None)()
    driver._check_and_import_in_background(cfg, None, check_arguments=False)()


# ---------------------------------------------------------------------------------------------
# The run sequence (raydra.run.sequence): a run and a Tune trial walk the one


def _trial_here(monkeypatch, tmp_path, sampled, *overrides):
    """A sweep's trial as Tune runs it, in this process: Tune's trial context and stop probe stood in."""
    from raydra.sweep import trial

    monkeypatch.setattr(trial, "tune_stop_probe", lambda: lambda: False)
    monkeypatch.setattr(ray.tune, "get_context", lambda: SimpleNamespace(get_trial_id=lambda: "ab12c_00000"))
    sweep = {"dir": str(tmp_path / "sweep"), "storage": None, "id": "the_sweep", "overrides": list(overrides)}
    trial.run_trial(sampled, tuner._trial_base(composed(*overrides, f"paths.outputs={tmp_path}"), sweep["id"]), sweep)


@pytest.mark.parametrize("kind", ["run", "trial"])
def test_a_check_added_to_the_run_sequence_refuses_a_run_and_a_trial_alike(train_here, monkeypatch, tmp_path, kind):
    # A trial once walked a copy of the driver's stages: a check added to one was missed by the other.
    refusal = "a check of the run sequence refused this run."
    walked = []
    prepare = RunSequence.prepare

    def refusing_start(self, prepared, **how):
        walked.append(("start", how["kind"], Path(self.record.run_dir)))
        raise RaydraError(refusal)

    monkeypatch.setattr(RunSequence, "prepare", lambda self, invocation: walked.append("prepare") or prepare(self, invocation))
    monkeypatch.setattr(RunSequence, "start", refusing_start)
    monkeypatch.setattr(fit, "fit_and_record", lambda *args, **kwargs: pytest.fail("a refused run reached the fit"))
    if kind == "run":
        done = train_here("experiment=vit_digits_smoke", "logger=csv", "scale.num_workers=0", outputs=tmp_path)
        assert done.returncode == 1 and f"error: {refusal}" in done.stdout, done.stdout + done.stderr
        (run_dir,) = run_dirs(tmp_path)
    else:
        with pytest.raises(RaydraError, match=refusal):
            _trial_here(monkeypatch, tmp_path, {"seed": 7}, "experiment=vit_digits_smoke", "logger=csv", "scale.num_workers=1")
        run_dir = tmp_path / "sweep" / "trials" / "ab12c_00000"
    # The same stages, to the check; the refusal recorded failed by the sequence, where the run is.
    assert walked == ["prepare", ("start", kind, run_dir)]
    assert (summary_of(run_dir)["status"], summary_of(run_dir)["error"]) == ("failed", refusal)


# ---------------------------------------------------------------------------------------------
# A Tune sweep


def _sweep_on_stand_ins(monkeypatch, work):
    monkeypatch.setattr(tuner, "check_fits", lambda scale: None)
    monkeypatch.setattr(tuner, "_concurrency", lambda cfg: 1)
    monkeypatch.setattr(sync, "check_shared", lambda sweep_dir: None)

    class Tuner:
        fit = staticmethod(work)

    monkeypatch.setattr(tuner, "_tuner", lambda *args: Tuner())


SWEEP = ("tune=asha", "tune.num_samples=2", "scale.num_workers=1", "logger=csv", "ray.address=auto")


@pytest.mark.parametrize("stop", ["sigterm", "ctrl_c", "error", "notice"])
def test_a_sweep_settles_interrupted_with_its_tune_resume_command_or_failed_with_its_sentence(
    train_here, stand_in_connect, sigterm_unhandled_fails, notice, monkeypatch, tmp_path, stop
):
    work = {"sigterm": stop_with(signal.SIGTERM), "ctrl_c": stop_with(signal.SIGINT), "error": fail_with(RuntimeError("Tune broke"))}
    _sweep_on_stand_ins(monkeypatch, work.get(stop, stop_with(signal.SIGTERM)))
    if stop == "notice":
        notice("before")
    done = train_here(*SWEEP, outputs=tmp_path)
    (sweep_dir,) = [p.parent for p in tmp_path.glob("sweeps/*/*/sweep.json")]
    record = sweep.read(sweep_dir)
    # Connected before the search; not at all when the notice had come.
    assert len(stand_in_connect) == (stop != "notice")
    if stop == "error":
        assert done.returncode == 1 and (record.status, record.error) == ("failed", "RuntimeError: Tune broke")
    else:
        words = NOTICE_WORDS + "; continue it with " if stop == "notice" else SIGNALLED
        assert done.returncode == 130, done.stdout + done.stderr
        assert (record.status, record.error) == ("interrupted", f"{words}tune.resume={sweep_dir}")
        assert f"continue it with tune.resume={sweep_dir}" in done.stdout
    assert record.finished_at and record.wall_time_s is not None


# ---------------------------------------------------------------------------------------------
# A multirun's launcher (another app's jobs: Ray tasks, stood in for)


def _multirun(tmp_path, monkeypatch, work=None):
    monkeypatch.setattr(admission, "_prepare_app_jobs", lambda multirun, jobs: [setattr(job, "share", 1.0) for job in jobs])
    monkeypatch.setattr(admission, "leave_joined_cluster", lambda: None)
    if work is not None:
        monkeypatch.setattr(scheduling, "_start", work)
    monkeypatch.setattr(sys, "argv", ["app.py"])
    multirun = launcher.Multirun(sweep_dir=tmp_path / "m", settings=RaydraLauncherConf(), raydra_runs=False, typed=["x=1,2"])
    jobs = [Job(num=n, overrides=[f"x={n + 1}"], cfg=OmegaConf.create({}), dir=tmp_path / "m" / str(n)) for n in range(2)]
    return multirun, jobs


@pytest.mark.parametrize("stop", ["sigterm", "ctrl_c", "error"])
def test_a_multirun_settles_interrupted_with_its_continue_command_or_failed_with_its_sentence(
    sigterm_unhandled_fails, monkeypatch, tmp_path, stop
):
    work = {"sigterm": stop_with(signal.SIGTERM), "ctrl_c": stop_with(signal.SIGINT), "error": fail_with(RuntimeError("a job broke"))}
    multirun, jobs = _multirun(tmp_path, monkeypatch, work[stop])
    with pytest.raises(RuntimeError if stop == "error" else KeyboardInterrupt):
        launcher.run_jobs(multirun, jobs)
    record = jobs_record.read(multirun.sweep_dir)
    assert [record.job(n).status for n in (0, 1)] == ["not started", "not started"]
    if stop == "error":
        assert (record.status, record.error) == ("failed", "RuntimeError: a job broke")
    else:
        assert (record.status, record.error) == ("interrupted", SIGNALLED + outcome.continue_command(multirun))
        assert record.error.endswith(f"hydra.sweep.dir={multirun.sweep_dir} hydra.launcher.resume=true")
    assert signal.getsignal(signal.SIGTERM) is sigterm_unhandled_fails


def test_the_notice_passes_to_a_multiruns_jobs_and_ends_it_interrupted_with_no_job_started(notice, monkeypatch, tmp_path):
    stand_in = notice("during")
    multirun, jobs = _multirun(tmp_path, monkeypatch, work=fail_with(AssertionError("a job started after the notice")))
    launcher.run_jobs(multirun, jobs)
    record = jobs_record.read(multirun.sweep_dir)
    assert stand_in.acted == [False]  # no job was running: nothing for a requeue to continue
    assert [record.job(n).status for n in (0, 1)] == ["not started", "not started"]
    assert (record.status, record.error) == ("interrupted", f"{NOTICE_WORDS}; continue it with {outcome.continue_command(multirun)}")


def test_the_lifecycle_module_is_the_one_that_connects_and_takes_the_stop_signals_and_notice():
    # A new stop signal or notice is added in one place: the three callers (the launcher's modules
    # each) reach none of them directly.
    src = Path(lifecycle.__file__).parents[1]
    launcher_parts = [f"multirun/{name}.py" for name in ("launcher", "admission", "scheduling", "outcome")]
    for caller in ("run/driver.py", *launcher_parts, "sweep/tuner.py"):
        text = (src / caller).read_text()
        assert "sigterm_interrupts" not in text and "batch_system.notice()" not in text, caller
        assert "connect(\n" not in text.replace("life.connect(", ""), caller


# A driver whose final record is slow to come (leaving a Ray whose head went with the job): it
# writes each ending to a file, and the final one takes a minute.
SLOW_TO_LEAVE = """
import sys, time
from pathlib import Path
from raydra.run.lifecycle import Lifecycle
endings = Path(sys.argv[1])
def settle(ending):
    if ending.final:
        time.sleep(60)  # the driver leaves Ray first, then writes its final record
    with endings.open("a") as file:
        file.write(f"{ending.status} final={ending.final}\\n")
with Lifecycle(settle, continue_with=lambda: "resume=/r", settle_at_once=True) as life:
    life.take_stop_signals()
    Path(sys.argv[2]).write_text("ready")
    time.sleep(60)
"""


def test_a_driver_stopped_with_the_shell_that_started_it_ends_at_once_after_its_interrupted_record(tmp_path):
    # As scancel ends a batch script that runs `python train.py` without exec, on SLURM without
    # cgroups: SIGTERM to the shell and to the driver; the shell dies at once, and SLURM stops
    # tracking the driver. The driver must not go on after its job.
    endings, ready = tmp_path / "endings", tmp_path / "ready"
    script = f"{sys.executable} -c {shlex.quote(SLOW_TO_LEAVE)} {endings} {ready}"
    shell = subprocess.Popen(
        ["bash", "-c", f"{script}; echo the shell went on"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    deadline = time.time() + 60
    while not ready.exists():
        assert time.time() < deadline and shell.poll() is None, "the driver did not start"
        time.sleep(0.05)
    (driver,) = psutil.Process(shell.pid).children()
    driver.send_signal(signal.SIGTERM)
    shell.send_signal(signal.SIGTERM)
    shell.wait(timeout=10)
    gone = time.time()
    while driver.is_running() and driver.status() != psutil.STATUS_ZOMBIE:
        assert time.time() - gone < 5, "the driver outlived the shell that started it by 5 s"
        time.sleep(0.05)
    # Its record says interrupted (the at-once one); the final one, a minute away, was not waited for.
    assert endings.read_text() == "interrupted final=False\n"


# A driver's interrupted run settling as the driver's does: it waits for a checkpoint in flight, then
# writes its final record and says how to continue; its process ends with the run, exit code 130 as
# the entry's. (That Ray's shutdown, the driver's first step, leaves raydra's SIGTERM handler in
# place is test_private_apis.py's lean local Ray probe.)
STOPPED_TWICE = """
import logging, sys, time
from pathlib import Path
from raydra.run.lifecycle import Lifecycle
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
endings = Path(sys.argv[1])
def settle(ending):
    if ending.final:
        ending.hurried.wait(30)  # the wait for a checkpoint in flight, which a second signal ends
        logging.getLogger("raydra").error(f"error: {ending.reason}")
    with endings.open("a") as file:
        file.write(f"{ending.status} final={ending.final}\\n")
try:
    with Lifecycle(settle, continue_with=lambda: "resume=/r", settle_at_once=True, process_ends_with_it=True) as life:
        life.take_stop_signals()
        Path(sys.argv[2]).write_text("ready")
        time.sleep(60)
except KeyboardInterrupt:
    raise SystemExit(130)
"""


def test_sigterms_while_the_run_stops_hurry_it_to_its_record_its_continue_command_and_exit_code_130(tmp_path):
    # Two SIGTERMs 0.3 s apart ended the driver with no final record and no line saying how to
    # continue (the second raised KeyboardInterrupt into the code writing them), or as killed, exit
    # code 143 (the handler put back on its way out). Here a SIGTERM every 0.1 s until the process
    # ends reaches every stage of its stop: the stop itself, the wait for a checkpoint, the record,
    # and the way out.
    endings, ready = tmp_path / "endings", tmp_path / "ready"
    driver = subprocess.Popen(
        [sys.executable, "-c", STOPPED_TWICE, str(endings), str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    deadline = time.time() + 60
    while not ready.exists():
        assert time.time() < deadline and driver.poll() is None, "the driver did not start"
        time.sleep(0.05)
    began = time.time()
    while driver.poll() is None and time.time() - began < 20:
        driver.send_signal(signal.SIGTERM)
        time.sleep(0.1)
    out, _ = driver.communicate(timeout=10)
    assert driver.returncode == 130, out
    assert "error: interrupted (Ctrl-C or SIGTERM); continue it with resume=/r" in out and "already stopping" in out, out
    # Hurried: the wait for a checkpoint in flight ended with the second signal, not after its 30 s.
    assert time.time() - began < 10
    assert endings.read_text() == "interrupted final=False\ninterrupted final=True\n"
