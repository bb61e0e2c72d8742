"""Elastic worker groups (scale.num_workers=[min, max]): the refusals before Ray starts, and a real
run that loses a node, continues on fewer workers, and grows back when a node joins.

The cluster is ray.cluster_utils.Cluster's: separate raylets on this machine, which Ray schedules
and fails like separate hosts (see test_multinode.py)."""

import csv
import re
import time
from collections import Counter

import pytest
from conftest import cluster_of_nodes, run_train, summary_of
from helpers import (
    composed,
    epochs_with_val,
    held_at_last_epoch,
    logged_steps,
    node_of,
    start_train,
    victim_node,
    wait_for_an_epoch_on,
    wait_for_checkpoint,
    wait_for_line,
    worker_pids,
)
from omegaconf import OmegaConf
from probe import seen_per_epoch

from raydra.errors import RaydraError
from raydra.schema import validate
from raydra.testing import free_port

# The shrink/grow run is held at its last epoch until the test has seen it grow back
# (helpers.held_at_last_epoch): 10 leaves the 1-worker group epochs to train before the hold.
EPOCHS = 10
RUN = ("experiment=vit_digits_smoke", f"trainer.max_epochs={EPOCHS}", "trainer.test=false", "checkpoint.num_to_keep=1")
ELASTIC = ("scale.num_workers=[1,2]", "failure.max_failures=3", "scale.resize_check_s=5")


@pytest.mark.parametrize(
    "override, message",
    [
        ("scale.num_workers=[3,1]", r"scale.num_workers=\[3,1\] has min 3 above max 1; write it as \[min, max\], e.g. \[1,3\]\."),
        ("scale.num_workers=[0,2]", r"scale.num_workers=\[0,2\] must start at 1 or more workers"),
        ("scale.num_workers=[1,2,3]", r"scale.num_workers=\[1,2,3\] is neither a count of workers nor \[min, max\]"),
        ("scale.num_workers=[1]", r"is neither a count of workers nor \[min, max\]"),
        ("scale.num_workers=abc", r"scale.num_workers=abc is neither a count"),
        ("scale.num_workers=[1.5,2]", r"is neither a count of workers nor \[min, max\]"),
        # 32 splits over 1, 2 and 4 workers, not over 3.
        ("scale.num_workers=[2,4]", r"data.batch_size=32 \(the global batch\) does not split evenly over 3 worker\(s\), .* multiple of 12"),
    ],
)
def test_a_bad_elastic_form_is_refused_in_one_sentence(override, message):
    with pytest.raises(RaydraError, match=message) as error:
        validate(composed(override, "failure.max_failures=1"))
    # One sentence: no line break, and no full stop before a new one starts.
    text = str(error.value)
    assert text.endswith(".") and "\n" not in text and not re.search(r"\.\s+[A-Z]", text)


def test_elastic_needs_restarts_and_no_tune():
    with pytest.raises(RaydraError, match=r"failure.max_failures=0 forbids; set failure.max_failures"):
        validate(composed("scale.num_workers=[1,2]"))
    with pytest.raises(RaydraError, match=r"\(elastic\) cannot run inside a Tune sweep"):
        validate(composed("scale.num_workers=[1,2]", "failure.max_failures=1", "tune=asha"))


def test_the_plain_count_and_a_good_range_pass():
    validate(composed("scale.num_workers=2"))
    validate(composed("scale.num_workers=[1,2]", "failure.max_failures=-1"))
    elastic, fixed = (OmegaConf.to_object(composed(f"scale.num_workers={n}").scale) for n in ("[1,2]", "3"))
    assert (elastic.min_workers, elastic.max_workers) == (1, 2)
    assert (fixed.min_workers, fixed.max_workers) == (3, 3)


def test_an_unsplittable_batch_is_refused_before_ray_starts(tmp_path):
    # An address nothing answers at: a check made after connecting would fail on it instead.
    done = run_train(*RUN, *ELASTIC, "scale.num_workers=[1,3]", outputs=tmp_path, address=f"127.0.0.1:{free_port()}", timeout=120)
    assert done.returncode == 1
    assert "does not split evenly over 3 worker(s)" in done.stdout + done.stderr
    assert "could not reach the Ray cluster" not in done.stdout + done.stderr


def test_the_skip_of_a_mid_epoch_resume_is_exact_across_world_sizes():
    """What Resumable relies on when a resize lands inside an epoch: with a fixed global batch, N
    batches on W workers (DistributedSampler, as Lightning injects it) are the same samples for any
    W, so the rest of the epoch on another size trains each remaining sample once."""
    from torch.utils.data import DistributedSampler

    samples, batch, trained_batches = 1257, 32, 17

    def shards(world_size):
        for rank in range(world_size):
            sampler = DistributedSampler(range(samples), num_replicas=world_size, rank=rank, shuffle=True, seed=0)
            sampler.set_epoch(3)
            yield list(sampler), trained_batches * batch // world_size

    trained = {ws: {i for order, n in shards(ws) for i in order[:n]} for ws in (1, 2, 4)}
    assert trained[1] == trained[2] == trained[4] and len(trained[2]) == trained_batches * batch
    rest = [i for order, n in shards(1) for i in order[n:]]
    assert not trained[2] & set(rest) and trained[2] | set(rest) == set(range(samples))


@pytest.fixture
def cluster(monkeypatch):
    """A head with no CPU and two 1-CPU nodes: room for [1,2]'s max, and for 1 worker after a loss."""
    with cluster_of_nodes(monkeypatch, nodes=2, temp_prefix="raye-") as cluster:
        yield cluster


NO_AUTH = {"RAY_AUTH_MODE": "disabled"}


@pytest.mark.e2e
def test_an_elastic_run_shrinks_on_a_lost_node_and_grows_back(cluster, tmp_path):
    # The resource check counts min: [3,4] asks for at least 3 workers, which 2 nodes cannot hold.
    refused = run_train(
        *RUN,
        "scale.num_workers=[3,4]",
        "data.batch_size=48",
        "failure.max_failures=1",
        outputs=tmp_path / "refused",
        address=cluster.address,
        env=NO_AUTH,
    )
    assert refused.returncode == 1 and "asks for at least 3 workers" in refused.stdout + refused.stderr

    release = tmp_path / "release"
    driver = start_train(*RUN, *ELASTIC, *held_at_last_epoch(release), outputs=tmp_path, address=cluster.address, env=NO_AUTH)
    try:
        run_dir = wait_for_checkpoint(tmp_path, driver)
        first_workers = worker_pids(run_dir)
        nodes = {node_of(cluster, pid) for pid in first_workers}
        assert len(first_workers) == 2 and len(nodes) == 2
        # Not the node of Ray Train's controller: Ray restarts workers, never its controller.
        victim = victim_node(cluster, run_dir, nodes)
        lost_at = time.time()
        cluster.remove_node(victim, allow_graceful=False)

        # It continues on the one node left, without a replacement...
        wait_for_line(run_dir, driver, "resized from 2 to 1 workers", timeout=240)
        shrunk_in = time.time() - lost_at
        # ...and grows back once a node joins: after the 1-worker group's first checkpoint, which
        # carries the resize (a group restarted before it would continue from the 2-worker one).
        wait_for_an_epoch_on(run_dir, driver, workers=1)
        cluster.add_node(num_cpus=1)
        wait_for_line(run_dir, driver, "resized from 1 to 2 workers", timeout=240)
        release.touch()
        out, _ = driver.communicate(timeout=400)
    finally:
        release.touch()
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, out
    print(f"continued on 1 worker {shrunk_in:.1f} s after the node was lost")

    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["num_workers"] == {"min": 1, "max": 2}
    assert [(r["from"], r["to"]) for r in summary["resizes"]] == [(2, 1), (1, 2)]
    first, second = summary["resizes"]
    assert 0 < first["step"] < second["step"] and first["restarted_epoch"] is None and second["restarted_epoch"] is None
    assert summary["epochs_completed"] == EPOCHS
    # Each epoch validated once: none lost, none repeated, across both resizes.
    assert epochs_with_val(run_dir) == list(range(EPOCHS))
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    resized = [
        (int(float(r["resize/from_workers"])), int(float(r["resize/to_workers"])), int(r["step"]))
        for r in rows
        if r.get("resize/from_workers")
    ]
    assert resized == [(2, 1, first["step"]), (1, 2, second["step"])]
    sizes = [int(float(r["train/world_size"])) for r in rows if r.get("train/world_size")]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2
    # The console said each resize in one line.
    assert "resized from 2 to 1 workers" in out and "resized from 1 to 2 workers" in out


@pytest.mark.e2e
def test_a_resize_inside_an_epoch_skips_exactly_the_batches_trained_on_the_old_size(cluster, tmp_path):
    """Checkpoints every 25 of an epoch's 40 steps: the node goes after one inside an epoch, and the
    1-worker group skips the batches the 2 workers trained, so every step is trained once."""
    epochs, every = 8, 25
    per_epoch = _steps_per_epoch(2)
    assert _steps_per_epoch(1) == per_epoch  # the same global batches an epoch on either size
    driver = start_train(
        "experiment=vit_digits_smoke", f"trainer.max_epochs={epochs}", "trainer.test=false", "checkpoint.num_to_keep=1",
        f"checkpoint.every_n_steps={every}", *ELASTIC, "model._target_=tests.probe.RecordingViT",
        outputs=tmp_path, address=cluster.address, env=NO_AUTH,
    )  # fmt: skip
    try:
        run_dir = wait_for_checkpoint(tmp_path, driver)
        nodes = {node_of(cluster, pid) for pid in worker_pids(run_dir)}
        cluster.remove_node(victim_node(cluster, run_dir, nodes), allow_graceful=False)
        out, _ = driver.communicate(timeout=400)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, out

    summary = summary_of(run_dir)
    (resize,) = summary["resizes"]
    assert (resize["from"], resize["to"]) == (2, 1) and summary["world_size"] == 1
    # Resumed inside an epoch, skipping exactly the batches trained there, not restarting the epoch.
    assert resize["step"] % per_epoch != 0 and resize["step"] % every == 0
    assert resize["skipped_batches"] == resize["step"] - resize["epoch"] * per_epoch and resize["restarted_epoch"] is None
    assert summary["epochs_completed"] == epochs and summary["global_step"] == epochs * per_epoch
    assert epochs_with_val(run_dir) == list(range(epochs))
    assert logged_steps(run_dir) == list(range(9, epochs * per_epoch, 10))  # each logged step once, in order

    # Every training sample once per epoch, the interrupted one included: the 2 workers' batches up to
    # the checkpoint (their later ones were rolled back) and the 1 worker's rest of that epoch make
    # up exactly what a whole epoch on 1 worker trains.
    per_batch = 32 // 2
    before = seen_per_epoch(run_dir, world_size=2)[resize["epoch"]]
    after = seen_per_epoch(run_dir, world_size=1)
    trained = [f for rank in (0, 1) for f in before[rank][: resize["skipped_batches"] * per_batch]] + after[resize["epoch"]][0]
    whole = after[resize["epoch"] + 1][0]
    assert len(whole) == len(set(whole)) and Counter(trained) == Counter(whole)
    assert all(Counter(after[e][0]) == Counter(whole) for e in range(resize["epoch"] + 1, epochs))


def _steps_per_epoch(world_size: int) -> int:
    """Optimizer steps an epoch of RUN's digits on `world_size` workers (DistributedSampler pads the shards)."""
    import math

    from raydra.data.digits import DigitsDataModule

    data = DigitsDataModule()
    data.setup()
    per_worker = math.ceil(len(data.splits["train"]) / world_size)
    return math.ceil(per_worker / (data.hparams.batch_size // world_size))
