"""Elastic worker groups (scale.num_workers=[min, max]): the refusals before Ray starts, and a real
run that loses a node inside an epoch and continues on fewer workers, every sample trained once.
The shrink-and-grow run, with its resizes on record, is test_cluster_storage's (on nodes that share
no disk, the harder case), so the suite starts it once.

The cluster is ray.cluster_utils.Cluster's: separate raylets on this machine, which Ray schedules
and fails like separate hosts (see test_multinode.py)."""

import re
from collections import Counter

import pytest
from helpers import (
    cluster_of_nodes,
    composed,
    epochs_with_val,
    logged_steps,
    lose_a_worker_node,
    run_train,
    start_train,
    steps_per_epoch,
    summary_of,
)
from omegaconf import OmegaConf
from probe import seen_per_epoch

from raydra.config.checks import validate
from raydra.errors import RaydraError
from raydra.testing import free_port

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
def test_a_resize_inside_an_epoch_skips_exactly_the_batches_trained_on_the_old_size(cluster, tmp_path):
    """Checkpoints every 25 of an epoch's 40 steps: the node goes after one inside an epoch, and the
    1-worker group skips the batches the 2 workers trained, so every step is trained once."""
    epochs, every = 8, 25
    per_epoch = steps_per_epoch(2)
    assert steps_per_epoch(1) == per_epoch  # the same global batches an epoch on either size
    driver = start_train(
        "experiment=vit_digits_smoke", f"trainer.max_epochs={epochs}", "trainer.test=false", "checkpoint.num_to_keep=1",
        f"checkpoint.every_n_steps={every}", *ELASTIC, "model._target_=tests.probe.RecordingViT",
        outputs=tmp_path, address=cluster.address, env=NO_AUTH,
    )  # fmt: skip
    run_dir, _, _ = lose_a_worker_node(cluster, driver, tmp_path)

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
