"""A disk that fills during a checkpoint loses nothing, for real: the run's outputs live on a small
tmpfs mounted in a mount namespace of their own (root and unshare, as conftest's private_disk_cluster),
a filler file takes the space left after the first checkpoint, and the next checkpoint meets a full
disk. The run must fail with one sentence naming the path and what was being written, leave the
previous checkpoint, metrics.csv and summary.json whole, register no partial checkpoint, and finish
with resume=latest once the filler is gone. Under Ray (a Ray started by the driver inside the
namespace, so its workers see the tmpfs) and in local mode."""

import contextlib
import csv
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import REPO, base_env, on_a_private_tmpfs

import raydra

EPOCHS = 4
RUN = (
    "experiment=vit_digits_smoke",
    f"trainer.max_epochs={EPOCHS}",
    "trainer.test=false",
    "checkpoint.num_to_keep=1",
    "failure.max_failures=0",
)
# Room for the run's record and two checkpoints of the digits ViT (about 2.5 MB each) beside the filler.
TMPFS_MB = 64
LEFT_FREE = 1_000_000  # less than a checkpoint, more than the logs and metrics.csv need meanwhile


@pytest.fixture
def private_tmpfs(tmp_path):
    """A tmpfs at `tmp_path/outputs` that only processes entered into its mount namespace see;
    yields (namespace holder pid, the directory). From outside, /proc/<pid>/root<dir> reaches it."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        pytest.skip("a private tmpfs needs Linux, root, unshare and nsenter (util-linux)")
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    holder = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mount -t tmpfs -o size={TMPFS_MB}m raydra-full-disk "$1" && echo mounted && exec sleep 3600',
            "sh",
            str(outputs),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = holder.stdout.readline()
    if "mounted" not in line:
        holder.kill()
        pytest.skip(f"unshare --mount with a tmpfs is refused here ({line.strip()})")
    try:
        yield holder.pid, outputs
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def _inside(pid: int, path) -> Path:
    """`path` as the namespace sees it, from outside."""
    return Path(f"/proc/{pid}/root{Path(path)}")


def _train(pid: int, outputs: Path, *overrides: str, ray_tmp: str) -> subprocess.Popen:
    """`python train.py` inside the namespace; without ray.address it starts its own Ray there."""
    args = ["nsenter", f"--target={pid}", "--mount", "--", sys.executable, str(REPO / "train.py"), f"paths.outputs={outputs}", *overrides]
    # Ray's sockets and session logs: short, and apart from every other Ray on this machine.
    env = {**base_env(), "RAY_TMPDIR": ray_tmp}
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["ray", "local"])
def test_a_disk_that_fills_during_a_checkpoint_fails_in_one_sentence_keeps_the_record_and_resume_finishes(private_tmpfs, mode):
    pid, outputs = private_tmpfs
    seen = _inside(pid, outputs)
    ray_tmp = tempfile.mkdtemp(prefix="rayfd-")
    run = (*RUN, "scale.num_workers=0") if mode == "local" else (*RUN, "ray.num_cpus=2")
    try:
        driver = _train(pid, outputs, *run, ray_tmp=ray_tmp)
        run_dir = _wait_for_first_checkpoint(seen, driver, local=mode == "local")
        # Take all the space but a little until the run ends: the next checkpoint (a few MB) cannot be written whole.
        with _disk_kept_full(seen, driver):
            out, _ = driver.communicate(timeout=300)
        assert driver.returncode == 1, out

        # One sentence, naming the path and what was being written, in summary.json and on the console.
        summary = json.loads((run_dir / "summary.json").read_text())
        error = summary["error"]
        assert summary["status"] == "failed"
        assert error.startswith(f"the disk holding {outputs}/") and "is full: writing checkpoint checkpoint_" in error, error
        assert error.endswith("continue the run with resume=latest.") and error.count(". ") == 0 and "\n" not in error
        assert error in out

        # The record stays whole: summary.json parsed above; metrics.csv parses, every row complete.
        text = (run_dir / "metrics.csv").read_text()
        rows = list(csv.reader(text.splitlines()))
        assert text.endswith("\n") and len(rows) > 1 and all(len(r) == len(rows[0]) for r in rows)
        # Only whole checkpoints are there, and the last one loads.
        checkpoints = _checkpoint_dirs(run_dir)
        assert len(checkpoints) == 1, checkpoints
        assert not list((run_dir / "checkpoints").rglob("*.partial")) and not list(run_dir.rglob("*.tmp*"))
        ckpt = checkpoints[0] / "checkpoint.ckpt"
        assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] > 0
        assert raydra.load(ckpt) is not None
        if mode == "ray":
            # Ray registered it, and nothing else.
            (snapshot,) = (run_dir / "checkpoints").glob("*/checkpoint_manager_snapshot.json")
            registered = json.loads(snapshot.read_text())["latest_checkpoint_result"]["checkpoint_dir_name"]
            assert registered == checkpoints[0].name

        # Space freed: resume=latest finishes the run in its own directory.
        (seen / "filler").unlink()
        resumed = _train(pid, outputs, *run, "resume=latest", ray_tmp=ray_tmp)
        out, _ = resumed.communicate(timeout=300)
        assert resumed.returncode == 0, out
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and len(summary["resumed"]) == 1
        assert summary["epochs_completed"] == EPOCHS and summary["global_step"] == EPOCHS * 40
        rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
        assert [int(r["epoch"]) for r in rows if r.get("val/acc")] == list(range(EPOCHS))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _wait_for_first_checkpoint(seen: Path, driver: subprocess.Popen, local: bool, timeout: float = 240) -> Path:
    """The run dir (seen from outside) once its first checkpoint is whole: registered by Ray, or in
    local mode renamed into place."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert driver.poll() is None, driver.communicate()[0]
        for summary in seen.glob("runs/*/*/summary.json"):
            run_dir = summary.parent
            if local and _checkpoint_dirs(run_dir):
                return run_dir
            for snapshot in run_dir.glob("checkpoints/*/checkpoint_manager_snapshot.json"):
                try:
                    if json.loads(snapshot.read_text())["checkpoint_results"]:
                        return run_dir
                except (ValueError, KeyError):
                    pass  # being written
        time.sleep(0.1)
    driver.kill()
    pytest.fail("the run wrote no checkpoint in time")


@contextlib.contextmanager
def _disk_kept_full(seen: Path, driver: subprocess.Popen):
    """A filler that keeps all but LEFT_FREE of the disk taken while the run goes on. One write
    after one look at the free space raced the run (CI: its next checkpoint took the space between
    the look and the write, the filler met ENOSPC, and with num_to_keep=1 the deleted checkpoint
    gave the space back); topping up holds the disk full through whatever the run writes or frees."""
    stop = threading.Event()
    failed: list = []

    def top_up() -> None:
        fd = os.open(seen / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while not stop.is_set() and driver.poll() is None:
                gap = shutil.disk_usage(seen).free - LEFT_FREE
                while gap > 0:
                    try:
                        gap -= os.write(fd, b"\0" * min(gap, 1 << 20))
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        # The run wrote meanwhile: hand back the little the filler must leave.
                        os.ftruncate(fd, max(0, os.fstat(fd).st_size - LEFT_FREE))
                        break
                stop.wait(0.01)
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            failed.append(e)
        finally:
            os.close(fd)

    filler = threading.Thread(target=top_up, daemon=True)
    filler.start()
    try:
        yield
    finally:
        stop.set()
        filler.join()
    if failed:
        raise failed[0]


def _checkpoint_dirs(run_dir: Path) -> list:
    return sorted(p for p in (run_dir / "checkpoints").glob("*/*") if p.is_dir())


@pytest.mark.parametrize("disk", ["full", "read-only"])
def test_outputs_on_a_disk_that_takes_no_write_are_refused_naming_the_directory_before_anything_is_written(disk, tmp_path):
    """A tiny full tmpfs (OSError: No space left, no path, in Hydra's record) or a read-only one
    (105 lines of traceback), mounted in a namespace of its own: one sentence naming the run's
    directory and what to do, and nothing left there."""
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    # The filler takes what the 64 KiB leave after the directories; a read-only one is remounted so.
    prepare = 'dd if=/dev/zero of="$1/filler" bs=1k count=128 2>/dev/null; true' if disk == "full" else 'mount -o remount,ro "$1"'
    train = [sys.executable, str(REPO / "train.py"), f"paths.outputs={outputs}", "scale.num_workers=0", "logger=csv"]
    done = on_a_private_tmpfs(outputs, train, "size=64k", then=prepare, cwd=REPO)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in said and len(said.strip().splitlines()) == 1, said
    run_dir = f"{outputs}/runs/"
    if disk == "full":
        assert said.startswith(f"error: the disk holding {run_dir}") and " is full: the run's directory cannot be written there; " in said
        assert said.strip().endswith("free space there, or point paths.outputs at another disk (or the run at one with hydra.run.dir=).")
    else:
        assert (
            said.startswith(f"error: {run_dir}") and " is on a read-only filesystem: the run's directory cannot be written there; " in said
        )
        assert said.strip().endswith("point paths.outputs at a directory you can write (or the run at one with hydra.run.dir=).")
