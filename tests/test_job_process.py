"""raydra.job_process: a multirun job's process, forked from a server that has imported what a
job's driver imports, behaves as `python <command>` would for what the launcher relies on."""

import json
import os
import signal
import sys
import time

from raydra import job_process

SCRIPT = """
import atexit, json, os, sys
atexit.register(lambda: open(os.environ["EXITED_FILE"], "w").write("ran"))
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "own_session": os.getsid(0) == os.getpid(),
                  "env": os.environ.get("JOB_VALUE"), "preloaded": "ray.train.torch" in sys.modules}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def _wait(process, timeout: float = 120) -> int:
    process.join(timeout)
    assert process.exitcode is not None, "the job process did not end"
    return process.exitcode


def test_a_job_runs_its_script_as_python_would_with_its_console_and_exit_handlers(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    console, exited = tmp_path / "console.log", tmp_path / "exited"
    env = {**os.environ, "JOB_VALUE": "set for this job", "EXITED_FILE": str(exited)}
    process = job_process.start([sys.executable, str(script), "3"], str(console), env)

    assert _wait(process) == 3
    out = console.read_text()
    seen = json.loads(out.splitlines()[0])
    assert seen == {"argv": [str(script), "3"], "path0": str(tmp_path), "own_session": True, "env": "set for this job", "preloaded": True}
    assert "to stderr" in out
    # A process that ends through multiprocessing skips atexit: Ray's disconnect and W&B's flush live there.
    assert exited.read_text() == "ran"


def test_a_module_job_runs_as_python_dash_m_would_and_sigterm_reaches_it(tmp_path, monkeypatch):
    package = tmp_path / "jobpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "slow.py").write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
        "print('argv', sys.argv[1:], flush=True)\n"
        "time.sleep(120)\n"
    )
    console = tmp_path / "console.log"
    # `python -m` finds the module from the current directory, which the server had when it started.
    monkeypatch.chdir(tmp_path)
    process = job_process.start([sys.executable, "-m", "jobpkg.slow", "a=1"], str(console), dict(os.environ))
    deadline = time.time() + 120
    while "argv" not in (console.read_text() if console.exists() else ""):
        assert process.exitcode is None and time.time() < deadline, console.read_text() if console.exists() else ""
        time.sleep(0.1)
    assert "argv ['a=1']" in console.read_text()
    os.kill(process.pid, signal.SIGTERM)
    assert _wait(process) == 143
