"""The test fixtures for clusters without a shared disk do what they claim: the worker node of
`private_disk_cluster` has its own outputs directory, and it reaches the `s3_server` as storage."""

import json
import subprocess
import sys
import uuid

import pyarrow.fs as pafs
import pytest
from conftest import S3_ENV, base_env

pytestmark = pytest.mark.e2e

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
