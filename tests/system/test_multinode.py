"""A run spread over several Ray nodes, and the loss of one of them mid-run.

The nodes are ray.cluster_utils.Cluster's: separate raylets (and object stores) on this machine,
which Ray schedules and fails exactly like separate hosts. The run directory is local, so it is
the shared storage every node reaches, as `paths.outputs` must be on a real cluster.
"""

import contextlib

import psutil
import pytest
from helpers import (
    EPOCHS,
    RUN,
    cluster_of_nodes,
    epochs_with_val,
    lose_a_worker_node,
    resumed_at,
    start_train,
    steps_per_epoch,
    summary_of,
    worker_pids,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(monkeypatch):
    """A head node with no CPU and three 1-CPU nodes (helpers.cluster_of_nodes)."""
    with cluster_of_nodes(monkeypatch, nodes=3, temp_prefix="raym-") as cluster:
        yield cluster


def test_a_spread_run_survives_losing_a_node_that_holds_a_worker(cluster, tmp_path):
    # Cluster's nodes are started from this process without an auth token, so the driver sends none
    # (with RAY_AUTH_MODE=token, as for the session cluster, its controller actor never started).
    driver = start_train(
        *RUN,
        "scale.placement_strategy=SPREAD",
        "failure.max_failures=1",
        outputs=tmp_path,
        address=cluster.address,
        env={"RAY_AUTH_MODE": "disabled"},
    )

    def while_it_trains(first_workers, nodes):
        # SPREAD: the two workers run on two different nodes.
        assert len(first_workers) == 2 and len(nodes) == 2 and cluster.head_node not in nodes
        # On several nodes a drain can take some workers and leave the driver: Ray Train's
        # preemption watcher runs (raydra leaves it out only on a one-node cluster, test_cluster).
        assert _actor_process_running(cluster, "PreemptionWatcher")

    # Remove a node holding a worker, but not the one the run's controller lives on: losing the
    # controller ends the run whatever max_failures says (Ray restarts workers, not its controller).
    run_dir, first_workers, _ = lose_a_worker_node(cluster, driver, tmp_path, while_it_trains)

    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["epochs_completed"] == EPOCHS and summary["global_step"] == EPOCHS * steps_per_epoch(2)
    assert epochs_with_val(run_dir) == list(range(EPOCHS))
    # A new worker group, on the two nodes left, continuing from a checkpoint rather than from scratch.
    restarted = [pid for pid in worker_pids(run_dir) if pid not in first_workers]
    assert len(restarted) == 2
    epoch, batch, _, _ = resumed_at(run_dir)
    assert epoch >= 1 and batch == 0


def _actor_process_running(cluster, class_name: str) -> bool:
    """Whether a process the cluster's raylets started is an actor of `class_name` (Ray names an
    actor's process ray::<class name>)."""
    for node in [cluster.head_node, *cluster.worker_nodes]:
        for process in psutil.Process(node.all_processes["raylet"][0].process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if f"ray::{class_name}" in " ".join(process.cmdline()):
                    return True
    return False
