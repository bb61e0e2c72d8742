"""Runs on a cluster whose nodes share no disk, with paths.storage on a real S3 server (moto).

The cluster (conftest.private_disk_cluster) is a head node, where the driver runs, and a worker
node in its own mount namespace with a private tmpfs over the outputs directory: every training
worker and Tune trial runs there and cannot see the driver's run directory. Whatever reaches the
driver's disk went through storage or Ray. Bad storage input is refused before any worker starts.
"""

import csv
import json
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pyarrow.fs as pafs
import pytest
from helpers import EPOCHS as REFERENCE_EPOCHS
from helpers import (
    OWN_PROJECT,
    OWN_PROJECT_QUICK,
    REPO,
    S3_ENV,
    base_env,
    raydra_train,
    resumed_at,
    run_dirs,
    run_train,
    short_temp_dir,
    start_private_node,
    summary_of,
)

from raydra import storage
from raydra.errors import RaydraError
from raydra.records import summary as summary_record
from raydra.records import sweep as sweep_record
from raydra.records.sync import check_writable
from raydra.testing import stop_ray_node

# Epochs of about a second: six, so the run is still going when the test kills a worker and then
# the driver (with three it could end first, once Ray Train's poll stopped pacing epochs at 2 s).
EPOCHS = 6
RUN = (
    "experiment=vit_digits_smoke",
    f"trainer.max_epochs={EPOCHS}",
    "trainer.test=false",
    "scale.num_workers=2",
    "logger=[csv,wandb]",
    "checkpoint.num_to_keep=2",
)


def _storage(uri: str) -> str:
    # Quoted for Hydra's override grammar: the URI's query holds '=' and '&'.
    return f'paths.storage="{uri}"'


def _train_on(cluster, *overrides: str, env: dict = None, timeout: int = 600):
    """`python train.py` on the private-disk cluster, into an outputs directory of its own; returns
    (the finished process, that directory)."""
    outputs = cluster.outputs / uuid.uuid4().hex[:8]
    done = run_train(*overrides, outputs=outputs, address=cluster.address, env={**S3_ENV, **(env or {})}, timeout=timeout)
    return done, outputs


def _start(*overrides, outputs, address):
    args = [sys.executable, str(REPO / "train.py"), f"paths.outputs={outputs}", *overrides, f"ray.address={address}"]
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**base_env(), **S3_ENV})


def _registered_checkpoints(run_storage: str) -> int:
    """How many checkpoints Ray Train's controller has on record for the run, read from storage."""
    for name in storage.list_files(storage.join(run_storage, "checkpoints")):
        if name.endswith("checkpoint_manager_snapshot.json"):
            snapshot = storage.join(run_storage, "checkpoints", name)
            try:
                return len(json.loads(storage.read_text(snapshot))["checkpoint_results"])
            except (ValueError, KeyError, OSError):
                return 0  # being written
    return 0


def _wait(condition, driver, what: str, timeout: float = 300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert driver.poll() is None, driver.communicate()[0]
        found = condition()
        if found:
            return found
        time.sleep(0.5)
    driver.kill()
    pytest.fail(f"waited in vain for {what}")


def _train_workers() -> list:
    return [p for p in psutil.process_iter(["cmdline"]) if "RayTrainWorker" in " ".join(p.info["cmdline"] or [])]


# ---------------------------------------------------------------------------------------------
# The fixture does what it claims (first: every test below relies on it): the worker node of
# `private_disk_cluster` has its own outputs directory, and it reaches the `s3_server` as storage.

# Runs as a driver of its own (a subprocess, as train.py would be), so this pytest process never
# joins a Ray cluster. Plain pyarrow in the task: nothing from raydra needs to be importable there.
PROBE = r"""
import json, os, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

address, outputs, object_uri = sys.argv[1:4]
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
deadline = time.time() + 60
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.time() < deadline:
    time.sleep(0.5)
nodes = [n for n in ray.nodes() if n["Alive"]]
driver_node = ray.get_runtime_context().get_node_id()
worker_node = next(n["NodeID"] for n in nodes if n["NodeID"] != driver_node)


@ray.remote(num_cpus=1)
def on_worker_node(outputs, object_uri):
    import pyarrow.fs as pafs

    os.makedirs(outputs, exist_ok=True)  # the node's own (empty) disk below the tmpfs
    with open(os.path.join(outputs, "from_worker.txt"), "w") as f:
        f.write("written on the worker node")
    fs, path = pafs.FileSystem.from_uri(object_uri)
    with fs.open_input_stream(path) as stream:
        from_s3 = stream.read().decode()
    return {
        "node": ray.get_runtime_context().get_node_id(),
        "sees_marker": os.path.exists(os.path.join(outputs, "driver_marker.txt")),
        "listing": sorted(os.listdir(outputs)),
        "from_s3": from_s3,
    }


strategy = NodeAffinitySchedulingStrategy(worker_node, soft=False)
seen = ray.get(on_worker_node.options(scheduling_strategy=strategy).remote(outputs, object_uri), timeout=120)
print(json.dumps({
    "seen": seen, "driver_node": driver_node, "worker_node": worker_node,
    "cpus": {n["NodeID"]: n["Resources"].get("CPU", 0) for n in nodes},
    "head": [n["NodeID"] for n in nodes if "node:__internal_head__" in n["Resources"]],
}))
"""


@pytest.mark.e2e
def test_the_worker_node_has_its_own_outputs_dir_and_reaches_s3(private_disk_cluster, s3_bucket):
    # A directory of this test's own: the session's other tests write beside it.
    outputs = private_disk_cluster.outputs / f"probe-{uuid.uuid4().hex[:8]}"
    outputs.mkdir()
    (outputs / "driver_marker.txt").write_text("written by the driver")
    fs, prefix = pafs.FileSystem.from_uri(s3_bucket)
    with fs.open_output_stream(f"{prefix}/hello.txt") as stream:
        stream.write(b"hello from the driver")
    object_uri = s3_bucket.replace("/prefix?", "/prefix/hello.txt?")

    proc = subprocess.run(
        [sys.executable, "-c", PROBE, private_disk_cluster.address, str(outputs), object_uri],
        capture_output=True,
        text=True,
        timeout=180,
        env={**base_env(), **S3_ENV},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    seen = result["seen"]

    # The driver is on the head, which offers no CPU; the task ran on the other node.
    assert result["head"] == [result["driver_node"]]
    assert result["cpus"] == {result["driver_node"]: 0, result["worker_node"]: 2}
    assert seen["node"] == result["worker_node"]
    # Each side sees only its own file in "the same" directory.
    assert not seen["sees_marker"] and seen["listing"] == ["from_worker.txt"]
    assert sorted(p.name for p in outputs.iterdir()) == ["driver_marker.txt"]
    # Storage is what they share.
    assert seen["from_s3"] == "hello from the driver"


@pytest.mark.e2e
def test_a_run_without_storage_on_nodes_without_a_shared_disk_is_refused_before_any_worker_starts(private_disk_cluster):
    done, outputs = _train_on(private_disk_cluster, *RUN, timeout=120)
    assert done.returncode == 1
    assert "cannot see" in done.stdout and "set paths.storage" in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    (run_dir,) = run_dirs(outputs)
    assert summary_of(run_dir)["status"] == "failed" and not (run_dir / "checkpoints").exists()


@pytest.mark.e2e
def test_a_run_on_s3_survives_a_worker_and_a_driver_kill_and_ends_whole_on_the_drivers_disk(private_disk_cluster, s3_bucket, reference):
    """Point 2 of the issue, item by item, on a run that lost a worker after its first checkpoint
    (the group restarts from the checkpoint in storage) and then its driver (resume=latest from a
    new process continues from storage). Where a killed worker's group restarts on a shared disk,
    the same holds (test_reliability's mid-epoch kill, test_multinode's lost node): this is the
    harder case, so the epoch-end restart is checked here alone."""
    import raydra

    outputs = private_disk_cluster.outputs / uuid.uuid4().hex[:8]
    address = private_disk_cluster.address
    driver = _start(*RUN, _storage(s3_bucket), "failure.max_failures=1", outputs=outputs, address=address)
    run_dir = _wait(lambda: next(iter(run_dirs(outputs)), None), driver, "the run directory")
    run_storage = summary_of(run_dir)["storage"]
    assert run_storage.startswith("s3://") and "/runs/" in run_storage
    # The victim is taken in the same poll that saw the checkpoint: epochs last about a second, so
    # a later look could find the group between attempts or already done.
    workers = _wait(lambda: _registered_checkpoints(run_storage) >= 1 and _train_workers(), driver, "a checkpoint in storage")
    workers[0].kill()
    _wait(lambda: _registered_checkpoints(run_storage) >= 2, driver, "a checkpoint after the restart")
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert summary_of(run_dir)["status"] == "running"  # killed outright: nothing recorded the end
    # So the driver's metrics.csv can only have come while the run went on (the driver pulls what
    # the workers push at each report every few seconds; it never made its final pull).
    assert (run_dir / "metrics.csv").is_file()

    # Resumed without its storage, it would find no checkpoint and train from the start: refused.
    refused = run_train(*RUN, "resume=latest", outputs=outputs, address=address, env=S3_ENV, timeout=120)
    assert refused.returncode == 1 and "add paths.storage=" in refused.stdout, refused.stdout + refused.stderr
    done = run_train(*RUN, _storage(s3_bucket), "failure.max_failures=1", "resume=latest", outputs=outputs, address=address, env=S3_ENV)
    assert done.returncode == 0, done.stdout + done.stderr

    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["epochs_completed"] == EPOCHS and summary["resumed"]
    # No step lost or trained twice over both restarts: the uninterrupted reference run's steps per
    # epoch (the same data, batch and workers), EPOCHS times.
    per_epoch = reference["global_step"] // REFERENCE_EPOCHS
    assert summary["global_step"] == EPOCHS * per_epoch
    # The new worker group went on from an epoch's end (the checkpoint the kill came after).
    epoch, batch, _, step = resumed_at(run_dir)
    assert epoch >= 1 and batch == 0 and step == epoch * per_epoch
    checkpoints = summary["checkpoints"]
    # Named relative to the run's home, its storage location: where raydra.load and resume= find them.
    assert checkpoints["best"].startswith("checkpoints/") and checkpoints["last"].startswith("checkpoints/")
    assert summary_record.read(run_dir).checkpoint("best").startswith(run_storage.split("?")[0])
    assert checkpoints["upload"] == "background" and checkpoints["upload_s_mean"] is not None
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "driver.log").is_file()
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert sorted({int(r["epoch"]) for r in rows if r.get("val/acc")}) == list(range(EPOCHS))
    assert {"worker_0.log", "worker_1.log", "ray.log"} <= {p.name for p in (run_dir / "logs").iterdir()}
    assert "resumed from" in (run_dir / "logs" / "worker_0.log").read_text()
    # W&B's offline run, so `wandb sync` works from the driver; the checkpoints stay in storage.
    assert list(run_dir.glob("wandb/offline-run-*/*.wandb"))
    assert not (run_dir / "checkpoints").exists()
    # The storage copy is whole too, and it opens like a run directory.
    assert {"summary.json", "metrics.csv", ".hydra/config.yaml", "logs/worker_1.log"} <= set(storage.list_files(run_storage))
    # From the driver's run directory, whose record names its checkpoints relative to its storage.
    model = raydra.load(run_dir)
    assert sum(p.numel() for p in model.parameters()) > 0
    compared = subprocess.run(
        [str(Path(sys.executable).parent / "raydra"), "compare", s3_bucket],
        capture_output=True,
        text=True,
        env={**base_env(), **S3_ENV},
        timeout=120,
    )
    assert compared.returncode == 0 and run_dir.name in compared.stdout, compared.stdout + compared.stderr


@pytest.mark.e2e
def test_an_asha_sweep_on_s3_records_every_trial_on_the_drivers_disk(private_disk_cluster, s3_bucket):
    space = "tune.space={model.optimizer.lr: {choice: [1e-5, 3e-3]}, data.batch_size: null}"
    sweep = ("tune=asha", "tune.num_samples=2", space, "trainer.max_epochs=2", "scale.num_workers=1", "logger=csv", "trainer.test=false")
    done, outputs = _train_on(private_disk_cluster, *sweep, _storage(s3_bucket))
    assert done.returncode == 0, done.stdout + done.stderr
    (sweep_dir,) = [p.parent for p in outputs.glob("sweeps/*/*/sweep.json")]
    record = sweep_record.read(sweep_dir)
    assert record.status == "completed" and record.storage.startswith("s3://")
    trials = sorted(sweep_dir.glob("trials/*/summary.json"))
    assert len(trials) == 2
    for path in trials:
        trial = json.loads(path.read_text())
        assert trial["status"] in ("completed", "stopped") and (path.parent / "metrics.csv").is_file()
        assert (path.parent / ".hydra" / "config.yaml").is_file()
    assert record.best.checkpoint.startswith("s3://")
    rows = list(csv.DictReader((sweep_dir / "trials.csv").open()))
    assert len(rows) == 2


@pytest.mark.e2e
def test_a_cluster_whose_nodes_lack_the_storage_credentials_is_named_in_one_sentence(ray_cluster, s3_bucket, tmp_path):
    """The driver can write (its own check passes) but Ray Train's controller, on a node without
    the credentials, cannot: the run says so instead of Ray's actor traceback."""
    done = run_train("experiment=vit_digits_smoke", _storage(s3_bucket), outputs=tmp_path, address=ray_cluster, env=S3_ENV, timeout=180)
    assert done.returncode == 1
    assert "on a Ray node: give every node the credentials in its own environment" in done.stdout, done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path)
    assert "give every node the credentials" in summary_of(run_dir)["error"]


def test_storage_that_cannot_be_written_is_named_in_one_sentence(s3_server, s3_bucket, monkeypatch):
    """Before any worker starts: a bucket that does not exist, an endpoint nobody answers, a
    scheme no filesystem serves."""
    missing = s3_bucket.replace("s3://raydra-", "s3://absent-")
    with pytest.raises(RaydraError, match=r"paths.storage=s3://absent-.*the bucket does not exist"):
        check_writable(missing)
    with socket_closed() as port:
        unreachable = s3_bucket.split("?")[0] + f"?endpoint_override=127.0.0.1:{port}&scheme=http"
        with pytest.raises(RaydraError, match=r"cannot be reached.*endpoint_override"):
            check_writable(unreachable)
    with pytest.raises(RaydraError, match=r"no installed filesystem serves this URI scheme"):
        check_writable("nosuchfs://bucket/prefix")
    check_writable(s3_bucket)  # and the good one passes, leaving nothing behind
    assert storage.list_files(s3_bucket) == []


class socket_closed:
    """A loopback port with nothing listening on it."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def __exit__(self, *exc) -> None:
        pass


def test_a_bad_storage_uri_fails_the_run_before_ray_starts(s3_server, tmp_path):
    done = run_train("experiment=vit_digits_smoke", 'paths.storage="nosuchfs://bucket/prefix"', outputs=tmp_path, timeout=120)
    assert done.returncode == 1
    assert "paths.storage=nosuchfs://bucket/prefix: no installed filesystem serves this URI scheme" in done.stdout
    assert "started a local Ray" not in done.stdout
    (run_dir,) = run_dirs(tmp_path)
    assert summary_of(run_dir)["status"] == "failed"


def test_the_storage_location_mirrors_the_run_directory_under_outputs(tmp_path):
    from raydra.records.layout import location

    run_dir = tmp_path / "out" / "runs" / "2026-11-23" / "20-41-00_vit"
    assert location("s3://b/p?scheme=http", str(tmp_path / "out"), run_dir) == "s3://b/p/runs/2026-11-23/20-41-00_vit?scheme=http"
    assert location(None, str(tmp_path / "out"), run_dir) is None
    assert location("/nfs/raydra", str(tmp_path / "elsewhere"), run_dir) == str(Path("/nfs/raydra/runs/20-41-00_vit"))


@pytest.mark.e2e
def test_an_elastic_run_on_s3_shrinks_when_a_private_disk_node_is_lost_and_grows_back(private_disk_cluster, s3_bucket, tmp_path):
    """Issue 19's elastic run on nodes that share no disk: the fixture's node (2 CPUs) and one more
    started here (1 CPU), each with a private tmpfs over the outputs. `scale.num_workers=[2,3]`
    needs the extra node for its third worker; it is stopped after the first checkpoint in storage
    (the run goes on with 2 workers, from that checkpoint), started again (back to 3), and the run
    ends whole on the driver's disk with both resizes recorded.

    The one elastic shrink-and-grow of the suite: on a shared disk the same resizes go the same way
    (test_elastic checks a resize inside an epoch there), and this one also asks that the record
    reach the driver through storage."""
    from helpers import epochs_with_val, held_at_last_epoch, wait_for_an_epoch_on, wait_for_line

    # Held at its last epoch until it has grown back (helpers.held_at_last_epoch).
    epochs = 10
    release = tmp_path / "release"
    run = (
        "experiment=vit_digits_smoke", f"trainer.max_epochs={epochs}", "trainer.test=false", "checkpoint.num_to_keep=1",
        "scale.num_workers=[2,3]", "data.batch_size=48", "failure.max_failures=3", "scale.resize_check_s=5",
    )  # fmt: skip
    outputs = private_disk_cluster.outputs / uuid.uuid4().hex[:8]
    # The resource check counts min: [3,4] asks for at least 3 workers, which the 2 CPUs of the
    # fixture's node cannot hold, whatever may join later.
    larger = [o for o in run if not o.startswith("scale.num_workers=")] + ["scale.num_workers=[3,4]"]
    refused = run_train(
        *larger, _storage(s3_bucket), outputs=outputs.with_name(outputs.name + "-refused"), address=private_disk_cluster.address, env=S3_ENV, timeout=120
    )  # fmt: skip
    assert refused.returncode == 1 and "asks for at least 3 workers" in refused.stdout + refused.stderr
    temps = [short_temp_dir("rayx-"), short_temp_dir("rayy-")]
    extra = start_private_node(private_disk_cluster, num_cpus=1, temp_dir=temps[0], log_path=tmp_path / "extra.log")
    again = driver = None
    try:
        driver = _start(*run, *held_at_last_epoch(release), _storage(s3_bucket), outputs=outputs, address=private_disk_cluster.address)
        run_dir = _wait(lambda: next(iter(run_dirs(outputs)), None), driver, "the run directory")
        run_storage = summary_of(run_dir)["storage"]
        _wait(lambda: _registered_checkpoints(run_storage) >= 1, driver, "a checkpoint in storage")
        stop_ray_node(extra)
        wait_for_line(run_dir, driver, "resized from 3 to 2 workers", timeout=240)
        wait_for_an_epoch_on(run_dir, driver, workers=2)
        again = start_private_node(private_disk_cluster, num_cpus=1, temp_dir=temps[1], log_path=tmp_path / "again.log")
        wait_for_line(run_dir, driver, "resized from 2 to 3 workers", timeout=240)
        release.touch()
        out, _ = driver.communicate(timeout=600)
    finally:
        release.touch()
        if driver is not None and driver.poll() is None:
            driver.kill()
        for node in (extra, again):
            if node is not None:
                stop_ray_node(node)
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)
    assert driver.returncode == 0, out

    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["epochs_completed"] == epochs and summary["world_size"] == 3
    assert summary["num_workers"] == {"min": 2, "max": 3}
    assert [(r["from"], r["to"]) for r in summary["resizes"]] == [(3, 2), (2, 3)]
    first, second = summary["resizes"]
    assert 0 < first["step"] < second["step"] and first["restarted_epoch"] is None and second["restarted_epoch"] is None
    # Each epoch validated once: none lost, none repeated, across both resizes.
    assert epochs_with_val(run_dir) == list(range(epochs))
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    resized = [
        (int(float(r["resize/from_workers"])), int(float(r["resize/to_workers"])), int(r["step"]))
        for r in rows
        if r.get("resize/from_workers")
    ]
    assert resized == [(3, 2, first["step"]), (2, 3, second["step"])]
    # Each epoch's world size is its group's. (Not every epoch has one: an epoch's training row comes
    # after its checkpoint's report, and a group stopped after that report never pushes it to storage.)
    sizes = [(int(r["step"]), int(float(r["train/world_size"]))) for r in rows if r.get("train/world_size")]
    assert all(size == (2 if first["step"] <= step < second["step"] else 3) for step, size in sizes), sizes
    assert {size for _, size in sizes} == {2, 3}
    # The console said each resize in one line.
    assert "resized from 3 to 2 workers" in out and "resized from 2 to 3 workers" in out
    # The record came through storage: the workers could not see this directory.
    assert summary["storage"].startswith("s3://") and summary_record.read(run_dir).checkpoint("last").startswith(
        summary["storage"].split("?")[0]
    )


@pytest.mark.e2e
def test_the_project_reaches_workers_on_a_node_that_cannot_see_it(private_disk_cluster, s3_bucket, tmp_path):
    """A researcher's own project (test_own_project's, the README's example) on the remote-cluster
    case itself: the project lies where the worker node has only an empty disk of its own, so its
    workers can import my_project only from what Ray shipped."""
    project = private_disk_cluster.outputs / f"project-{tmp_path.name}"
    shutil.copytree(OWN_PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", "outputs"))
    outputs = project / "outputs"
    args = ("--config-dir", "conf", *OWN_PROJECT_QUICK, "trainer.max_epochs=2", f'paths.storage="{s3_bucket}"')
    cluster = dict(cwd=project, address=private_disk_cluster.address, env=S3_ENV)
    # The control: shipped nothing, the worker node cannot import the project.
    done = raydra_train(*args, "ray.working_dir=null", outputs=project / "control", **cluster)
    assert done.returncode == 1
    assert "data._target_=my_project.data.BlobsDataModule: the worker on " in done.stdout, done.stdout
    assert "cannot import my_project, so your project did not reach it" in done.stdout
    done = raydra_train(*args, outputs=outputs, **cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"shipped {project.resolve()} to the workers" in done.stdout
    (run_dir,) = run_dirs(outputs)
    assert summary_of(run_dir)["status"] == "completed"
    assert (run_dir / "logs" / "worker_1.log").is_file()
