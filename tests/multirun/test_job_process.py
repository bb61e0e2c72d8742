"""raydra.multirun.job_process: a multirun job's process, forked from a server that has imported what a
job imports, runs the job through Hydra's run_job as a process of its own and sends back its
JobReturn; what the launcher relies on, checked without Ray."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
from hydra import initialize_config_dir
from hydra._internal.callbacks import Callbacks  # what Hydra hands a launcher in its HydraContext
from hydra.core.global_hydra import GlobalHydra
from hydra.core.singleton import Singleton
from hydra.core.utils import JobStatus, setup_globals
from hydra.types import HydraContext, RunMode
from omegaconf import open_dict

from raydra.multirun import job_process
from raydra.multirun.job import JobPayload


def report(cfg):
    """A task function: what a job sees of its process and of Hydra."""
    import atexit

    from hydra.core.hydra_config import HydraConfig

    atexit.register(lambda: Path(os.environ["EXITED_FILE"]).write_text("ran"))
    hydra = HydraConfig.get()
    print(
        json.dumps(
            {"own_session": os.getsid(0) == os.getpid(), "env": os.environ.get("JOB_VALUE"), "preloaded": "ray.train.torch" in sys.modules}
        )
    )
    print("to stderr", file=sys.stderr)
    return {"mode": hydra.mode.name, "num": hydra.job.num, "x": cfg.x, "dir": hydra.runtime.output_dir}


def fail(cfg):
    raise ValueError(f"x={cfg.x} is not allowed")


def wait_for_sigterm(cfg):
    """As a raydra run does: SIGTERM becomes a KeyboardInterrupt that ends the job."""

    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    print("waiting", flush=True)
    time.sleep(120)


@pytest.fixture
def payload_of(tmp_path):
    """A job's payload as raydra's launcher builds it: the app's config composed for a multirun, the
    job's overrides, number and directory."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "app.yaml").write_text("x: 1\n")

    def build(task, job_overrides, num=0):
        with initialize_config_dir(config_dir=str(tmp_path / "conf"), version_base="1.3", job_name="app"):
            loader = GlobalHydra.instance().config_loader()
            # hydra.mode=MULTIRUN among the multirun's overrides, as Hydra's own `-m` puts it there.
            overrides = [f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.mode=MULTIRUN"]
            config = loader.load_configuration("app", overrides, run_mode=RunMode.MULTIRUN)
            cfg = loader.load_sweep_config(config, job_overrides)
            with open_dict(cfg):
                cfg.hydra.job.id = cfg.hydra.job.num = num
            setup_globals()
            context = HydraContext(config_loader=loader, callbacks=Callbacks(cfg))
            return JobPayload(context, cfg, task, Singleton.get_state(), str(tmp_path)).dumps()

    return build


def _result(process, result, timeout: float = 120):
    try:
        returned = cloudpickle.loads(result.recv_bytes()) if result.poll(timeout) else None
    except EOFError:  # it ended without sending one
        returned = None
    process.join(timeout)
    assert process.exitcode is not None, "the job process did not end"
    return process.exitcode, returned


def test_a_job_runs_as_hydras_job_in_a_process_of_its_own_and_sends_its_job_return_back(payload_of, tmp_path):
    console, exited = tmp_path / "console.log", tmp_path / "exited"
    env = {**os.environ, "JOB_VALUE": "set for this job", "EXITED_FILE": str(exited)}
    process, result = job_process.start(payload_of(report, ["x=5"], num=3), str(console), env)
    code, returned = _result(process, result)

    assert code == 0
    assert returned.status == JobStatus.COMPLETED and returned.overrides == ["x=5"]
    job_dir = tmp_path / "sweep" / "3"
    assert returned.return_value == {"mode": "MULTIRUN", "num": 3, "x": 5, "dir": str(job_dir)}
    # Hydra's record of the job, written in the job.
    assert (job_dir / ".hydra" / "overrides.yaml").read_text().strip() == "- x=5"
    out = console.read_text()
    assert json.loads(out.splitlines()[0]) == {"own_session": True, "env": "set for this job", "preloaded": True}
    assert "to stderr" in out
    # A process that ends through multiprocessing skips atexit: Ray's disconnect and W&B's flush live there.
    assert exited.read_text() == "ran"


def test_a_failing_job_returns_its_exception_with_its_traceback(payload_of, tmp_path):
    process, result = job_process.start(payload_of(fail, ["x=7"]), str(tmp_path / "console.log"), dict(os.environ))
    code, returned = _result(process, result)
    assert code == 0  # the job ran; its task failed, as Hydra records it
    assert returned.status == JobStatus.FAILED
    with pytest.raises(ValueError, match="x=7 is not allowed") as raised:
        _ = returned.return_value
    assert "in fail" in "".join(getattr(raised.value, "__notes__", []))


def test_a_stopped_job_ends_quietly_with_the_shells_code_and_its_console_appended_to(payload_of, tmp_path):
    console = tmp_path / "console.log"
    console.write_text("an earlier attempt\n")
    process, result = job_process.start(payload_of(wait_for_sigterm, []), str(console), dict(os.environ))
    deadline = time.time() + 120
    while "waiting" not in console.read_text():
        assert process.exitcode is None and time.time() < deadline, console.read_text()
        time.sleep(0.1)
    os.kill(process.pid, signal.SIGTERM)
    code, returned = _result(process, result)
    assert code == 130 and returned is None
    assert console.read_text().startswith("an earlier attempt\n") and "Traceback" not in console.read_text()
