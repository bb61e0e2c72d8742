"""What a checkpoint costs training on object storage versus the local disk, waited for or in the background.

    python benchmarks/storage.py [--epochs 4] [--hidden 256] [--layers 6]

The same run (digits ViT, made larger so a checkpoint weighs tens of MB, one checkpoint per
epoch, 1 worker) four ways: checkpoints on the run's local disk or on an S3 server (moto's server
mode on a loopback port, the S3-compatible store the tests use), with `checkpoint.upload=wait`
(training waits for each upload) or `background` (Ray uploads from a thread while training goes
on). Reported per run, from its summary.json: the time training stood still per checkpoint
(`checkpoints.save_s_mean`), the upload time (`upload_s_mean`) and the wall time of the whole
`python train.py`. One `ray start --head` cluster serves every run, so none pays Ray's start.
Prints a markdown table; the goal: background upload to S3 keeps the wait per checkpoint within
1.2x of the local disk's.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep import env  # noqa: E402

from raydra.testing import start_ray_head, start_s3_server, stop_process_tree  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
S3_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1"}


def make_bucket(endpoint: str) -> str:
    import pyarrow.fs

    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    fs = pyarrow.fs.S3FileSystem(
        endpoint_override=endpoint,
        scheme="http",
        access_key=S3_ENV["AWS_ACCESS_KEY_ID"],
        secret_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
        region="us-east-1",
        allow_bucket_creation=True,
    )
    fs.create_dir(bucket)
    return f"s3://{bucket}/runs?endpoint_override={endpoint}&scheme=http"


def run(out: Path, address: str, common: list, *overrides: str) -> dict:
    before = set(out.glob("runs/*/*/summary.json"))
    started = time.time()
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), f"paths.outputs={out}", f"ray.address={address}", *common, *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**env(), **S3_ENV},
    )
    wall = time.time() - started
    if done.returncode:
        sys.exit(f"train.py {' '.join(overrides)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    (path,) = set(out.glob("runs/*/*/summary.json")) - before
    summary = json.loads(path.read_text())
    ckpt = summary["checkpoints"]
    return {"wait_s": ckpt["save_s_mean"], "upload_s": ckpt["upload_s_mean"], "wall_s": wall, "run_s": summary["wall_time_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args()

    out = Path(tempfile.mkdtemp(prefix="raydra-storage-bench-"))
    common = [
        "logger=csv",
        "scale.num_workers=1",
        "trainer.test=false",
        f"trainer.max_epochs={args.epochs}",
        f"model.hidden_size={args.hidden}",
        f"model.mlp_size={args.hidden * 2}",
        f"model.num_layers={args.layers}",
        "checkpoint.num_to_keep=null",
    ]
    s3, endpoint = start_s3_server(out / "moto.log", S3_ENV)
    # The cluster's processes (Ray Train's controller among them) read the S3 credentials from their own environment.
    cluster, address = start_ray_head(out / "ray_start.log", {**env(), **S3_ENV}, num_cpus=2)
    try:
        uri = make_bucket(endpoint)
        # Quoted for Hydra's grammar: the URI's query holds '=' and '&'.
        s3_storage = f'paths.storage="{uri}"'
        rows = [
            ("local disk", "wait", run(out, address, common, "checkpoint.upload=wait")),
            ("local disk", "background", run(out, address, common, "checkpoint.upload=background")),
            ("S3 (moto)", "wait", run(out, address, common, s3_storage, "checkpoint.upload=wait")),
            ("S3 (moto)", "background", run(out, address, common, s3_storage, "checkpoint.upload=background")),
        ]
    finally:
        stop_process_tree(cluster)
        stop_process_tree(s3)
    local_wait = rows[0][2]["wait_s"]
    print(
        f"\n{args.epochs} epochs, ViT hidden {args.hidden} x {args.layers} layers, 1 worker, a checkpoint per epoch; "
        f"{time.strftime('%Y-%m-%d')}\n"
    )
    print("| storage | upload | training waits per checkpoint | upload per checkpoint | wait vs local disk | run wall time |")
    print("|---|---|---:|---:|---:|---:|")
    for where, mode, r in rows:
        print(f"| {where} | {mode} | {r['wait_s']:.3f} s | {r['upload_s']:.3f} s | {r['wait_s'] / local_wait:.2f}x | {r['run_s']:.1f} s |")


if __name__ == "__main__":
    main()
