"""Helpers that several test modules share: plain functions and constants, imported as
`from helpers import ...` from any folder under tests/ (conftest.py, which holds the fixtures and
hooks alone, puts tests/ on sys.path). A helper that one module alone uses stays in that module."""

import contextlib
import csv
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Tuple

import psutil
import pytest
import yaml
from hydra import compose, initialize_config_dir

from raydra.cli import main
from raydra.cluster import ray_node
from raydra.config.schema import register_schemas
from raydra.entry import CONF_DIR
from raydra.testing import free_port

register_schemas()


# ---------------------------------------------------------------------------------------------
# The environment a test's processes run in, and train.py run as a user runs it

REPO = Path(__file__).resolve().parents[1]
# The test cluster's token (Ray's token authentication): one per session, handed to the cluster and
# every client through the environment. `ray start` refuses to create one itself, and a token file
# in ~/.ray would exist only if some earlier local ray.init happened to write it.
RAY_AUTH_TOKEN = secrets.token_hex(32)


def base_env() -> dict:
    env = dict(os.environ)
    # RAY_AUTH_MODE=token: Ray sends its token to an explicitly named cluster address only when
    # told to, as a user joining a `ray start` cluster by address must also do.
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=RAY_AUTH_TOKEN,
    )
    env.pop("WANDB_API_KEY", None)
    env.pop("RAY_ADDRESS", None)
    # Storage credentials only where a test hands them over (S3_ENV): the session cluster has none,
    # as a cluster whose nodes were never given them.
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(key, None)
    return env


# The temp dirs own_local_ray_env made, removed as the session ends (their Rays ended with their tests).
_OWN_RAY_TMPDIRS: list = []


def own_local_ray_env() -> dict:
    """base_env for a process that starts a local Ray of its own (ray.address unset): no token or
    address of the session's cluster, nor its State API, and a short temp dir of its own (Ray's
    socket paths must stay short)."""
    env = {k: v for k, v in base_env().items() if not k.startswith("RAY_AUTH") and k != "RAY_API_SERVER_ADDRESS"}
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    _OWN_RAY_TMPDIRS.append(env["RAY_TMPDIR"])
    return env


def remove_own_ray_tmpdirs() -> None:
    """Remove the temp dirs own_local_ray_env made (conftest.py's pytest_sessionfinish, as the session ends)."""
    for path in _OWN_RAY_TMPDIRS:
        shutil.rmtree(path, ignore_errors=True)
    _OWN_RAY_TMPDIRS.clear()


def run_train(*overrides: str, outputs: Path, address: str = None, timeout: int = 600, env: dict = None):
    """Run `python train.py` as a user would; returns the CompletedProcess."""
    flags = [o for o in overrides if o.startswith("-")]
    rest = [o for o in overrides if not o.startswith("-")]
    args = [sys.executable, str(REPO / "train.py"), *flags, f"paths.outputs={outputs}", *rest]
    if address:
        args.append(f"ray.address={address}")
    return ran(args, timeout, cwd=REPO, env={**base_env(), **(env or {})})


def ran(command: list, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """`command` run to its end, its output captured as text. One that runs past `timeout` fails
    the test with the end of what it printed: pytest abbreviates TimeoutExpired's captured output
    in the middle, and where a run stopped is what tells a hang apart from a slow run."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as expired:
        said = "\n".join(_text(part)[-6000:] for part in (expired.stdout, expired.stderr))
        pytest.fail(f"`{' '.join(map(str, command))}` ran past {timeout} s; the end of what it printed:\n{said}", pytrace=False)


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def run_dirs(outputs: Path, kind: str = "runs") -> list:
    return sorted(p.parent for p in Path(outputs, kind).glob("**/summary.json"))


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# A multirun job small enough to run two side by side on the 2-CPU session cluster.
SMALL_JOB = ("experiment=vit_digits_smoke", "trainer.max_epochs=1", "trainer.test=false", "scale.num_workers=1")


def ran_side_by_side(a: dict, b: dict) -> bool:
    """Whether two runs' summary.json spans (started_at to finished_at) overlap."""
    start_a, end_a = datetime.fromisoformat(a["started_at"]), datetime.fromisoformat(a["finished_at"])
    start_b, end_b = datetime.fromisoformat(b["started_at"]), datetime.fromisoformat(b["finished_at"])
    return start_a < end_b and start_b < end_a


# ---------------------------------------------------------------------------------------------
# raydra's own config, composed as the entry composes it


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


# ---------------------------------------------------------------------------------------------
# A researcher's own project: the README's example (test_own_project, and on the private-disk
# cluster in test_cluster_storage)

OWN_PROJECT = REPO / "examples" / "own_project"
# The README's command, with what keeps a test short.
OWN_PROJECT_QUICK = ("model=mlp", "data=blobs", "name=blobs_mlp", "trainer.max_epochs=3", "logger=csv")


# ---------------------------------------------------------------------------------------------
# A digits run to stop, kill and resume (test_reliability, test_preemption, test_multinode, test_elastic,
# test_strategies, test_cluster_storage)


# Epochs of about a second (since Ray Train's poll stopped pacing them at 2 s): eight, so a run is
# still going when a test kills its worker, its node or its driver after the first checkpoint.
EPOCHS = 8
RUN = ("experiment=vit_digits_smoke", f"trainer.max_epochs={EPOCHS}", "trainer.test=false", "checkpoint.num_to_keep=1")
# RUN with a metrics row for every step, for the runs compared row by row with the `reference`
# fixture's (tests/conftest.py): a restart that lost or repeated a step's row shows whatever step
# it lands on, not only on every 10th (Lightning logs a step's row once its callbacks' batch end,
# where a preemption notice's checkpoint is, has run).
EVERY_STEP = (*RUN, "trainer.log_every_n_steps=1")
WORKER_LINE = re.compile(r"\(RayTrainWorker pid=(\d+)\)")


# A run with these overrides writes down where each worker listens (tests.probe.Listening).
LISTENING = ("+callbacks.listening._target_=tests.probe.Listening",)


def store_address(run_dir: Path) -> str:
    """The one address the run's rendezvous store (rank 0's TCPStore, at MASTER_ADDR:MASTER_PORT)
    listens on, checked to be the address of rank 0's node that Ray named MASTER_ADDR: torch's own
    store listened on every interface (`::`)."""
    seen = json.loads((run_dir / "listening" / "rank0.json").read_text())
    address, port = seen["master"]
    assert address == seen["node"], seen
    assert [ip for ip, listened in seen["listening"] if listened == port] == [address], seen
    return address


def start_train(*overrides, outputs, address, env=None):
    args = [sys.executable, str(REPO / "train.py"), f"paths.outputs={outputs}", *overrides, f"ray.address={address}"]
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**base_env(), **(env or {})})


def held_at_last_epoch(release: Path) -> Tuple[str, str]:
    """Overrides that hold a run at the start of its last epoch until `release` exists
    (tests.probe.HoldLastEpoch): the test's events come while it trains, and it ends soon after."""
    return ("+callbacks.hold._target_=tests.probe.HoldLastEpoch", f"+callbacks.hold.release={release}")


def wait_for_checkpoint(outputs: Path, driver: subprocess.Popen, timeout: float = 240) -> Path:
    """The run dir once Ray has registered its first checkpoint and a worker pid is in its logs.
    A checkpoint directory on disk is not enough: until the controller has recorded the report, a
    restarted worker group would start from scratch (and still end with the right step count)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert driver.poll() is None, driver.communicate()[0]
        for snapshot in outputs.glob("runs/*/*/checkpoints/*/checkpoint_manager_snapshot.json"):
            run_dir = snapshot.parents[2]
            try:
                registered = json.loads(snapshot.read_text())["checkpoint_results"]
            except (ValueError, KeyError):
                continue  # being written
            if registered and worker_pids(run_dir):
                return run_dir
        time.sleep(0.2)
    driver.kill()
    pytest.fail("the run reported no checkpoint in time")


def resumed_at(run_dir: Path) -> tuple:
    """(epoch, batch, batches per epoch, global step) where the restarted rank 0 picked up."""
    found = re.search(
        r"resumed from .* at epoch (\d+), batch (\d+) of (\d+) \(global step (\d+)\)", (run_dir / "logs" / "worker_0.log").read_text()
    )
    assert found, "the restarted worker group did not resume from a checkpoint"
    return tuple(map(int, found.groups()))


def worker_pids(run_dir: Path) -> list:
    log = run_dir / "logs" / "ray.log"
    text = log.read_text() if log.exists() else ""
    return list(dict.fromkeys(int(pid) for pid in WORKER_LINE.findall(text)))


def logged_steps(run_dir: Path) -> list:
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    return [int(r["step"]) for r in rows if r.get("train/loss_step")]


def epochs_with_val(run_dir: Path) -> list:
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    return [int(r["epoch"]) for r in rows if r.get("val/acc")]


def tensorboard_of(run_dir: Path) -> Tuple[dict, dict]:
    """The run's TensorBoard record as TensorBoard's own reader (EventAccumulator) sees it, from the
    one directory under tensorboard/, named after the run id: every scalar tag's [(step, value)],
    and the hyperparameters of its HPARAMS entry ({} without one)."""
    from google.protobuf.json_format import MessageToDict
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    directories = list((run_dir / "tensorboard").iterdir())
    assert [d.name for d in directories] == [json.loads((run_dir / "summary.json").read_text())["run_id"]], directories
    accumulator = EventAccumulator(str(directories[0]))
    accumulator.Reload()
    scalars = {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}
    try:
        content = accumulator.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content
    except KeyError:
        return scalars, {}
    return scalars, MessageToDict(plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info)["hparams"]


def running_best(values: list, mode: str) -> list:
    best = max if mode == "max" else min
    return [best(values[: i + 1]) for i in range(len(values))]


# ---------------------------------------------------------------------------------------------
# W&B's files, read with W&B's own reader

# wandb 0.29.0, which `make install` puts beside the venv (the Makefile says why).
WANDB_READER = Path(sys.executable).parent.parent / "wandb-0.29-reader"
# The exit code W&B is told for each way a run ends (0 shows as finished, any other as failed).
WANDB_EXIT = {"completed": 0, "stopped": 0, "failed": 1, "interrupted": 130}


def wandb_segments(run_dir: Path) -> list:
    """Every W&B segment of the run (one `.wandb` file per process that logged to it), in order of
    their start, read with wandb 0.29.0's DataStore in a process of its own (tests/wandb_reader.py)."""
    files = sorted({p.resolve() for p in Path(run_dir, "wandb").glob("*run-*/run-*.wandb")})
    assert files, f"no W&B file in {run_dir}/wandb"
    env = {**os.environ, "PYTHONPATH": str(WANDB_READER)}
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "wandb_reader.py"), *map(str, files)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return sorted(json.loads(done.stdout), key=lambda segment: segment["start"] or 0.0)


def assert_wandb_holds_the_run(run_dir: Path, status: str, retrained_from: int = None) -> list:
    """The run's W&B history, across its segments, holds every (step, metric) of metrics.csv once,
    with its value, and nothing twice; W&B's `_step` only goes up; the last segment ends with the
    exit code of `status` and says it (raydra/status). Returns the segments.

    `retrained_from`: the global step a restarted or resumed run went on from. A step past it that an
    earlier segment holds keeps that attempt's value in W&B (W&B cannot take a logged step back),
    where metrics.csv holds the value trained again."""
    segments = wandb_segments(run_dir)
    logged, earlier = {}, set()
    last_step = -1
    for number, segment in enumerate(segments):
        for row in segment["history"]:
            assert row["_step"] > last_step, f"W&B's _step went back to {row['_step']} in {segment['file']}"
            last_step = row["_step"]
            if "trainer/global_step" not in row:
                continue
            for key, value in row.items():
                if not key.startswith("_") and key not in ("trainer/global_step", "epoch"):
                    pair = (int(row["trainer/global_step"]), key)
                    assert pair not in logged, f"W&B holds step {pair[0]}'s {key} twice"
                    logged[pair] = value
                    if number < len(segments) - 1:
                        earlier.add(pair)
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    in_csv = {(int(r["step"]), k): float(v) for r in rows for k, v in r.items() if v not in ("", None) and k not in ("step", "epoch")}
    absent = sorted(set(in_csv) - set(logged))
    assert not absent, f"{len(absent)} (step, metric) of metrics.csv are in no W&B file, the first {absent[:5]}"
    for pair, value in in_csv.items():
        if retrained_from is not None and pair[0] >= retrained_from and pair in earlier:
            continue
        assert logged[pair] == pytest.approx(value, rel=1e-4, abs=1e-6), pair
    assert segments[-1]["exit_code"] == WANDB_EXIT[status], [s["exit_code"] for s in segments]
    summary = {}
    for segment in segments:
        summary.update(segment["summary"])
    assert summary.get("raydra/status") == status, summary.get("raydra/status")
    # Beside W&B's last value of the monitored metric, its best (the run's best checkpoint's).
    record = json.loads((run_dir / "summary.json").read_text())
    monitor, mode = record["monitor"]["metric"], record["monitor"]["mode"]
    values = [v for (_, key), v in in_csv.items() if key == monitor]
    if values:
        assert summary[f"best/{monitor}"] == pytest.approx(max(values) if mode == "max" else min(values), rel=1e-4)
    return segments


# ---------------------------------------------------------------------------------------------
# The nodes of a ray.cluster_utils.Cluster (helpers.cluster_of_nodes)


def victim_node(cluster, run_dir, nodes: set):
    """One of `nodes` (those holding the run's workers) that does not hold Ray Train's controller:
    losing the controller's node ends the run whatever failure.max_failures says (Ray restarts
    workers, never its controller)."""
    controller = re.search(r"\(TrainController pid=(\d+)", (run_dir / "logs" / "ray.log").read_text())
    spared = node_of(cluster, int(controller.group(1))) if controller else None
    return next(node for node in nodes if node is not spared)


def node_of(cluster, pid: int):
    """The cluster node whose raylet started process `pid` (Ray workers are its children)."""
    parents = {p.pid for p in psutil.Process(pid).parents()}
    for node in [cluster.head_node, *cluster.worker_nodes]:
        if node.all_processes["raylet"][0].process.pid in parents:
            return node
    raise AssertionError(f"process {pid} belongs to no node of the test cluster")


def lose_a_worker_node(cluster, driver: subprocess.Popen, outputs: Path, while_it_trains=None) -> Tuple[Path, list, set]:
    """Once the run `driver` started under `outputs` has registered a checkpoint, remove a node that
    holds one of its workers but not Ray Train's controller (victim_node), without grace, and wait
    for the driver, which must end with 0. `while_it_trains(workers, nodes)` checks the run before
    the loss. Returns (the run dir, the first workers' pids, the nodes they ran on)."""
    try:
        run_dir = wait_for_checkpoint(outputs, driver)
        first_workers = worker_pids(run_dir)
        nodes = {node_of(cluster, pid) for pid in first_workers}
        if while_it_trains is not None:
            while_it_trains(first_workers, nodes)
        cluster.remove_node(victim_node(cluster, run_dir, nodes), allow_graceful=False)
        out, _ = driver.communicate(timeout=400)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, out
    return run_dir, first_workers, nodes


def steps_per_epoch(world_size: int) -> int:
    """Optimizer steps an epoch of RUN's digits on `world_size` workers (DistributedSampler pads the shards)."""
    import math

    from raydra.data.digits import DigitsDataModule

    data = DigitsDataModule()
    data.setup()
    per_worker = math.ceil(len(data.splits["train"]) / world_size)
    return math.ceil(per_worker / (data.hparams.batch_size // world_size))


# ---------------------------------------------------------------------------------------------
# Waiting on a run as it trains


def wait_for_an_epoch_on(run_dir: Path, driver, workers: int, timeout: float = 240) -> None:
    """Until metrics.csv (flushed at each checkpoint) holds an epoch trained on `workers` workers."""
    deadline = time.time() + timeout
    metrics = run_dir / "metrics.csv"
    while time.time() < deadline:
        assert driver.poll() is None, driver.communicate()[0]
        rows = list(csv.DictReader(metrics.open())) if metrics.exists() else []
        if any(r.get("train/world_size") and int(float(r["train/world_size"])) == workers for r in rows):
            return
        time.sleep(0.5)
    raise AssertionError(f"no epoch on {workers} worker(s) in {metrics} within {timeout} s")


def wait_for_line(run_dir: Path, driver, text: str, timeout: float) -> None:
    """Until rank 0 has said `text` on the driver's console (its driver.log). Not worker_0.log: on a
    disk the workers cannot see it arrives only with rank 0's next report, and a run held at its
    last epoch reports nothing more."""
    deadline = time.time() + timeout
    log = run_dir / "driver.log"
    while time.time() < deadline:
        assert driver.poll() is None, driver.communicate()[0]
        if log.exists() and text in log.read_text():
            return
        time.sleep(0.5)
    raise AssertionError(f"no '{text}' in {log} within {timeout} s")


# ---------------------------------------------------------------------------------------------
# `raydra train` as a researcher types it


def raydra_train(*args: str, cwd: Path, outputs: Path, address: str = None, env: dict = None, timeout: int = 600):
    """`raydra train ...` as a researcher types it: the console script of the environment running
    the tests, from `cwd`, with nothing of the project on PYTHONPATH."""
    command = shutil.which("raydra", path=str(Path(sys.executable).parent))
    assert command, f"no raydra command beside {sys.executable}: install raydra into this environment (pip install -e .)"
    environment = {**base_env(), **(env or {})}
    assert str(cwd) not in environment.get("PYTHONPATH", "")
    command_line = [command, "train", *args, f"paths.outputs={outputs}"] + ([f"ray.address={address}"] if address else [])
    return ran(command_line, timeout, cwd=cwd, env=environment)


# ---------------------------------------------------------------------------------------------
# Run directories written to the run-dir contract, and `raydra compare` on them


def make_run(
    root: Path,
    job: str,
    lr: float = 0.01,
    model: str = "vit",
    epochs: int = 3,
    accs=(0.5, 0.7, 0.9),
    status: str = "completed",
    error: str = None,
    monitor=("val/acc", "max"),
    summary: bool = True,
    metrics_csv: bool = True,
    seed: int = 42,
    choices: dict = None,
    config_extra: dict = None,
    tags=(),
    tags_in_summary: bool = True,
) -> Path:
    """One run dir as the training core writes it; val/acc per epoch is `accs`. `choices`: the
    config group choices Hydra records in .hydra/hydra.yaml (none written without them). `tags`:
    the root config's tags, recorded in summary.json too unless `tags_in_summary` is false (a run
    from before summary.json had them)."""
    run = root / job
    (run / ".hydra").mkdir(parents=True)
    config = {
        "name": "vit_digits",
        "seed": seed,
        "tags": list(tags),
        "model": {
            "_target_": f"raydra.models.{model}.Classifier",
            "name": model,
            "hidden_size": 64,
            "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": lr, "weight_decay": 0.05},
        },
        "data": {"batch_size": 32, "image_size": 8},
        "strategy": {"name": "ddp", "backend": None},
        "scale": {"num_workers": 2, "use_gpu": False, "resources_per_worker": {}},
        "trainer": {"max_epochs": epochs, "precision": "32-true"},
        "logger": {"csv": {"flush_logs_every_n_steps": 50}},
    }
    config.update(config_extra or {})
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    if choices is not None:
        # Hydra's layout: hydra.runtime.choices, its own groups (hydra/...) after the task's.
        hydra = {
            "hydra": {"run": {"dir": str(run)}, "runtime": {"output_dir": str(run), "choices": {**choices, "hydra/launcher": "basic"}}}
        }
        (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra, sort_keys=False))
    overrides = [f"model.optimizer.lr={lr}", f"trainer.max_epochs={epochs}"]
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run / "samples").mkdir()
    ckpt = run / "checkpoints" / f"{job}_ab12cd" / "checkpoint_000002" / "checkpoint.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"ckpt")

    rows, step = [], 0
    for epoch, acc in enumerate(accs):
        for _ in range(2):
            step += 10
            rows.append({"epoch": epoch, "step": step, "train/loss": round(2.0 / step, 4)})
        rows.append({"epoch": epoch, "step": step, "val/acc": acc, "val/loss": round(1 - acc, 4)})
        # raydra's own throughput diagnostics, logged at each epoch's end.
        rows.append({"epoch": epoch, "step": step, "train/samples_per_s": 800.0 + epoch, "train/data_wait_s": 0.002})
    if status == "completed":
        rows.append({"epoch": len(accs), "step": step, "test/acc": accs[-1] + 0.005})
    if metrics_csv:
        with open(run / "metrics.csv", "w", newline="") as f:
            columns = ["epoch", "step", "test/acc", "train/data_wait_s", "train/loss", "train/samples_per_s", "val/acc", "val/loss"]
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            writer.writerows(rows)

    if summary:
        best_epoch = max(range(len(accs)), key=lambda i: accs[i])
        done = status == "completed"
        data = {
            "name": "vit_digits",
            "run_id": f"2026-11-22_15-20-01_vit_digits_{job}",
            "run_dir": str(run),
            "status": status,
            "error": error,
            "started_at": "2026-11-22T15:20:01",
            "monitor": {"metric": monitor[0], "mode": monitor[1]},
            **({"tags": list(tags)} if tags_in_summary else {}),
            "world_size": 2,
            "strategy": "ddp",
            "config_hash": "sha256:00",
            "git_commit": "abc123",
            "versions": {"torch": "2.13.0"},
        }
        if done:
            data.update(
                finished_at="2026-11-22T15:21:12",
                wall_time_s=71.3,
                metrics={
                    "final": {
                        "val/acc": accs[-1],
                        "val/loss": round(1 - accs[-1], 4),
                        "test/acc": accs[-1] + 0.005,
                        "epoch": len(accs) - 1,
                        "step": step,
                    },
                    "best": {"val/acc": accs[best_epoch], "val/loss": round(1 - accs[best_epoch], 4)},
                },
                throughput={"samples_per_s": 812.4},
                checkpoints={"best": str(ckpt), "last": str(ckpt)},
            )
        (run / "summary.json").write_text(json.dumps(data, indent=2))
    return run


def compare(capsys, *args):
    code = main(["compare", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------
# A trained module scored on the digits' test split


def digits_test_images():
    """The digits data module's test split as a model sees it (normalised), and the same images as
    scikit-learn holds them (n x 8 x 8, values 0..16): what a Hugging Face export's processor is given."""
    import torch
    from sklearn.datasets import load_digits

    from raydra.data.digits import DigitsDataModule
    from raydra.data.splits import stratified_split

    data = DigitsDataModule(batch_size=64, val_fraction=0.15, test_fraction=0.15, split_seed=0, num_workers=0)
    data.setup("test")
    digits = load_digits()
    test = stratified_split(digits.target, {"val": 0.15, "test": 0.15}, 0, "data=digits")["test"]
    assert torch.equal(data.splits["test"].tensors[1], torch.from_numpy(digits.target[test]).long())
    return data.splits["test"].tensors[0], digits.images[test]


def hf_loaded(folder, trust_remote_code=False):
    """A Hugging Face export loaded as a user loads it: the model (eval mode) and its image processor
    (PIL's resize, as raydra's data modules resize)."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=trust_remote_code)
    return model.eval(), AutoImageProcessor.from_pretrained(folder, backend="pil")


def hf_processed(inputs, images, folder: Path):
    """`images` through the Hugging Face image processor an export writes for a data module whose
    image_inputs are `inputs` (its preprocessor_config.json, loaded by AutoImageProcessor with PIL's resize)."""
    from transformers import AutoImageProcessor

    folder.mkdir(parents=True)
    (folder / "preprocessor_config.json").write_text(json.dumps(inputs.processor))
    return AutoImageProcessor.from_pretrained(folder, backend="pil")(images=images, return_tensors="pt")["pixel_values"]


def digits_test_accuracy(module) -> float:
    import torch

    from raydra.data.digits import DigitsDataModule

    data = DigitsDataModule(batch_size=64, val_fraction=0.15, test_fraction=0.15, split_seed=0, num_workers=0)
    data.setup("test")
    correct = total = 0
    with torch.no_grad():
        for images, labels in data.test_dataloader():
            correct += int((module(images).argmax(-1) == labels).sum())
            total += len(labels)
    return correct / total


# ---------------------------------------------------------------------------------------------
# A small or read-only disk, for one command (test_full_disk, test_refusals)


def on_a_private_tmpfs(directory: Path, command: list, mount_options: str, then: str = "", timeout: float = 120, cwd=None):
    """Run `command` in a mount namespace of its own in which `directory` is a fresh tmpfs mounted
    with `mount_options` (then `then`, a shell line on "$1", the directory): a full or read-only disk
    for that command alone, which root's file modes would not give. Skips where mounting is refused."""
    import os

    if not sys.platform.startswith("linux") or os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a private tmpfs needs Linux, root and unshare (util-linux)")
    script = f'mount -t tmpfs -o {mount_options} raydra-tmpfs "$1" && {then or "true"} && shift && exec "$@"'
    done = ran(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(directory), *command],
        timeout,
        cwd=cwd,
        env=base_env(),
    )
    if "mount:" in done.stderr:
        pytest.skip(f"mounting a tmpfs is refused here ({done.stderr.strip()})")
    return done


# ---------------------------------------------------------------------------------------------
# A batch system's stand-in (raydra.cluster.batch_system's interface; test_batch_system, test_lifecycle)

STAND_IN_NOTICE = "interrupted: the stand-in batch system's job is ending"


class StandInBatchSystem:
    """A batch system whose stop notice comes at `comes` ("before": before the work; "during": as
    the work starts, running the action the work gave, as SLURM's does)."""

    name = "standin"
    signal = signal.SIGUSR2

    def __init__(self, comes: str = "before"):
        self.comes, self.came, self.acted, self.watching = comes, comes == "before", [], False

    def inside(self, env):
        return False

    def job_record(self, env):
        return None

    def requeued(self, env):
        return None

    def too_small(self, scale):
        return []

    def watch(self):
        self.watching = True

    def watched(self):
        return self.watching

    def noticed(self):
        return self.came

    def reason(self):
        return STAND_IN_NOTICE

    @contextlib.contextmanager
    def on_notice(self, action):
        if self.comes == "during":
            self.came = True
            self.acted.append(action())
        yield

    @contextlib.contextmanager
    def run_stops_on_notice(self):
        # A run's: its workers stop, then this process gets SIGTERM.
        def stop():
            os.kill(os.getpid(), signal.SIGTERM)
            return True

        with self.on_notice(stop):
            yield


# ---------------------------------------------------------------------------------------------
# Clusters of several Ray nodes on this machine (conftest.py's private_disk_cluster, cluster_of_nodes)

# Dummy credentials for the test S3 server (moto accepts any). A process that reaches it needs
# them in its environment, or pyarrow falls back to AWS's credential chain (instance metadata),
# which waits on network timeouts here. Hand them to subprocesses: run_train(..., env=S3_ENV).
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def short_temp_dir(prefix: str) -> Path:
    """A Ray --temp-dir: short, as Ray's unix sockets live below it and a socket path may not exceed 107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix))


@contextlib.contextmanager
def cluster_of_nodes(monkeypatch, nodes: int, temp_prefix: str):
    """A ray.cluster_utils.Cluster: a head with no CPU (nothing of a run lands there but the driver)
    and `nodes` 1-CPU nodes, separate raylets that Ray schedules and fails like separate hosts. Its
    own temp dir (the nodes take the head's), ports and processes: the session's `ray start` cluster
    is untouched, and shutdown stops only what this cluster started. Its processes, started from
    this one, find its State API through RAY_API_SERVER_ADDRESS (see raydra.testing.start_ray_head)."""
    from ray.cluster_utils import Cluster

    dashboard_port = free_port()
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", f"http://127.0.0.1:{dashboard_port}")
    temp_dir = short_temp_dir(temp_prefix)
    # The head writes its address to $RAY_TMPDIR/ray/ray_current_cluster, a dir it never makes: point
    # it here, or it fails where /tmp/ray is absent (a fresh machine) and overwrites it where not.
    monkeypatch.setenv("RAY_TMPDIR", str(temp_dir))
    (temp_dir / "ray").mkdir()
    cluster = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "gcs_server_port": free_port(),
                "dashboard_port": dashboard_port,
                "temp_dir": str(temp_dir / "ray"),
            },
        )
        for _ in range(nodes):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@dataclass
class PrivateDiskCluster:
    address: str  # the head's GCS address, for ray.address= / ray.init(address=...)
    outputs: Path  # a directory only the driver's side sees: the worker node has an empty tmpfs there
    worker_temp_dir: Path  # the worker node's own Ray temp dir (its session logs)
    env: dict  # what its nodes were started with (S3_ENV, the auth token, its State API address)


def start_private_node(cluster: "PrivateDiskCluster", num_cpus: int, temp_dir: Path, log_path: Path) -> subprocess.Popen:
    """One more node of the private-disk cluster, started and joined: `unshare --mount --propagation
    private` (its own mount namespace, whose mounts do not propagate back), a private tmpfs mounted
    over the cluster's outputs, then `ray start --address=<head> --block` with its own --temp-dir (so
    its log monitor reads only its own workers' logs: two monitors on one session dir publish every
    line twice) and free ports. unshare execs sh, which execs the node's keeper (raydra.cluster.ray_node),
    the parent of `ray start`: the pid Popen holds is the one stop_ray_node signals, and the keeper
    passes the signal on; the tmpfs lives as long as the namespace's processes."""
    node = start_node(
        [f"--address={cluster.address}", f"--num-cpus={num_cpus}", f"--temp-dir={temp_dir}"],
        log_path,
        cluster.env,
        private_dir=cluster.outputs,
    )
    wait_node_started(node, log_path, f"node in {temp_dir}")
    return node


def start_node(args: list, log_path: Path, env: dict, private_dir: Path = None) -> subprocess.Popen:
    flags = [*args, *ray_node.port_flags(), "--object-store-memory=300000000", "--num-gpus=0"]
    prefix = []
    if private_dir is not None:
        mount = 'mount -t tmpfs -o size=256m raydra-private-outputs "$1" && shift && exec "$@"'
        prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", str(private_dir)]
    return ray_node.start(flags, log_path, env, prefix=prefix)


def wait_node_started(proc: subprocess.Popen, log_path: Path, what: str, wait=ray_node.wait_started) -> str:
    try:
        return wait(proc, log_path, timeout=120)
    except RuntimeError as error:
        pytest.fail(f"the private-disk cluster's {what} did not start: {error}")


# ---------------------------------------------------------------------------------------------
# Lightning pieces for tests of one part (a callback, a data module, a checkpoint) without a run


def bare_trainer(**settings):
    """A plain Lightning Trainer on the CPU that writes and prints nothing; `settings` add to it."""
    from raydra.lightning import pl

    quiet = dict(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    return pl.Trainer(**{**quiet, **settings})


def tiny_vit(**settings):
    """raydra's ViT at a size that trains on digits-sized (8x8, 1 channel) images in seconds."""
    from raydra.models.vit import ViTClassifier

    tiny = dict(image_size=8, num_channels=1, num_classes=10, patch_size=2, hidden_size=64, num_layers=4, num_heads=4, mlp_size=128)
    tiny["optimizer"] = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3}
    return ViTClassifier(**{**tiny, **settings})


def ledger_of(summary: dict, other_at_most: float = 0.15) -> dict:
    """The run's compute ledger, checked as every run's must hold: every bucket there, none
    negative, what was measured adds up to the allocated worker-seconds (workers x wall) within 2%,
    and what nothing measured ("other") is a small share of it."""
    from raydra.records.ledger import BUCKETS

    ledger = summary["ledger"]
    buckets, allocated = ledger["buckets"], ledger["allocated_s"]
    assert list(buckets) == list(BUCKETS) and min(buckets.values()) >= 0, buckets
    assert allocated == pytest.approx(ledger["workers"] * ledger["wall_s"], rel=1e-3)
    assert sum(buckets.values()) == pytest.approx(allocated, rel=0.02), buckets
    assert buckets["other"] <= other_at_most * allocated, buckets
    return ledger
