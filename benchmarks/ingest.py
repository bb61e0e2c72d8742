"""Samples/s of the data path alone (no model): the default loader versus data.loader=ray_data.

    python benchmarks/ingest.py                       # CIFAR-10-shaped pickles made on the spot, 1 and 2 workers
    python benchmarks/ingest.py --images 50000 --workers 1 2 4
    python benchmarks/ingest.py --gpu-epoch           # also seed 002's experiment (vit_cifar10) on one GPU, both loaders

Both ways run inside Ray Train workers started by a TorchTrainer, as a run would: `dataloader` is
data=cifar10's own path (each worker holds its shard and augments batches on its device);
`ray_data` is the driver-built Ray Data stream (decode, crop/flip, normalise as map_batches
tasks; workers iterate `get_dataset_shard("train").iter_torch_batches`). Each worker reads the
train split for `--epochs` epochs; the figure is the last epoch's rows over its wall time, all
workers together. Workers hold half a CPU each so Ray Data has a CPU for its tasks beside them.
"""

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def write_cifar(root: Path, images: int) -> Path:
    from raydra.data.cifar10 import TEST_FILE, TRAIN_FILES

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = images // len(TRAIN_FILES)
    for name, count in [(n, per) for n in TRAIN_FILES] + [(TEST_FILE, max(per // 5, 10))]:
        data = rng.integers(0, 256, (count, 3 * 32 * 32), dtype=np.uint8)
        with open(folder / name, "wb") as file:
            pickle.dump({"data": data, "labels": rng.integers(0, 10, count).tolist()}, file)
    return root


def data_config(root: Path, loader: str, batch_size: int) -> dict:
    return {
        "_target_": "raydra.data.cifar10.CIFAR10DataModule",
        "root": str(root),
        "download": False,
        "batch_size": batch_size,
        "val_fraction": 0.1,
        "split_seed": 0,
        "augment": True,
        "crop_padding": 4,
        "flip": True,
        "mean": [0.4914, 0.4822, 0.4465],
        "std": [0.2470, 0.2435, 0.2616],
        "image_size": 32,
        "num_channels": 3,
        "num_classes": 10,
        "loader": loader,
    }


def read_loop(config: dict) -> dict:
    import ray.train
    import torch

    context = ray.train.get_context()
    world_size = context.get_world_size()
    torch.set_num_threads(1)
    if config["loader"] == "ray_data":
        from raydra.data.ray_data import ShardBatches

        loader = ShardBatches("train", config["rows"]["train"], config["data"]["batch_size"] // world_size, world_size, train=True, seed=0)
    else:
        from raydra.data.cifar10 import CIFAR10DataModule

        data = CIFAR10DataModule(**{k: v for k, v in config["data"].items() if k != "_target_"})
        data.trainer = SimpleNamespace(
            strategy=SimpleNamespace(root_device=ray.train.torch.get_device()), global_rank=context.get_world_rank(), world_size=world_size
        )
        data.setup()
        loader = data.train_dataloader()
    rows, seconds = 0, 0.0
    for _ in range(config["epochs"]):
        rows, started = 0, time.perf_counter()
        for images, labels in loader:
            images.sum().item()  # make sure the batch really exists on the device
            rows += len(labels)
        seconds = time.perf_counter() - started
    return {"rows": rows, "seconds": seconds}


def measure(root: Path, loader: str, workers: int, batch_size: int, epochs: int, use_gpu: bool) -> dict:
    import ray.train
    from ray.train.torch import TorchTrainer

    config = {"data": data_config(root, loader, batch_size), "loader": loader, "epochs": epochs}
    datasets = None
    if loader == "ray_data":
        from raydra.data.ray_data import build

        datasets, config["rows"] = build(config["data"], verbose=False)
        datasets = {"train": datasets["train"]}

    trainer = TorchTrainer(
        read_loop,
        train_loop_config=config,
        datasets=datasets,
        scaling_config=ray.train.ScalingConfig(
            num_workers=workers, use_gpu=use_gpu, resources_per_worker={"CPU": 0.5, **({"GPU": 1} if use_gpu else {})}
        ),
        run_config=ray.train.RunConfig(name=f"ingest_{loader}_{workers}_{time.time_ns()}", storage_path=tempfile.mkdtemp(prefix="ingest_")),
    )
    result = trainer.fit()
    if result.error:
        raise result.error
    out = result.return_value  # rank 0's figures; every worker reads the same share
    return {
        "loader": loader,
        "workers": workers,
        "rows_per_worker": out["rows"],
        "epoch_s": out["seconds"],
        "samples_per_s": out["rows"] * workers / out["seconds"],
    }


def gpu_epoch(root: Path, loader: str) -> dict:
    """Seed 002's run (experiment=vit_cifar10) on one GPU worker through train.py: its epoch time."""
    out = Path(tempfile.mkdtemp(prefix="ingest_gpu_"))
    subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "experiment=vit_cifar10",
            f"data.root={root}",
            f"data.loader={loader}",
            "scale=gpu",
            "scale.num_workers=1",
            "logger=csv",
            "trainer.test=false",
            f"paths.outputs={out}",
        ],
        cwd=REPO,
        check=True,
    )
    summary = json.loads(next(out.glob("runs/**/summary.json")).read_text())
    throughput = summary["throughput"]
    return {"loader": loader, "samples_per_s": throughput.get("samples_per_s"), "wall_s": summary["wall_time_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=10_000, help="training images (CIFAR-10 has 50000)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-size", type=int, default=512, help="global batch, as seed 002")
    parser.add_argument("--epochs", type=int, default=2, help="epochs read; the last one is timed")
    parser.add_argument("--gpu", action="store_true", help="GPU workers (one GPU each)")
    parser.add_argument("--gpu-epoch", action="store_true", help="also run seed 002's experiment on one GPU")
    args = parser.parse_args()

    import logging

    import ray

    logging.getLogger("ray").setLevel(logging.ERROR)
    ray.init(address="local", num_cpus=None if args.gpu or args.gpu_epoch else 2, log_to_driver=False, include_dashboard=False)
    root = write_cifar(Path(tempfile.mkdtemp(prefix="ingest_cifar_")), args.images)
    rows = [measure(root, loader, n, args.batch_size, args.epochs, args.gpu) for n in args.workers for loader in ("dataloader", "ray_data")]
    print(
        f"\n{date.today()}  python benchmarks/ingest.py {' '.join(sys.argv[1:])}  "
        f"({args.images} CIFAR-shaped train images less 10% val, global batch {args.batch_size}, last of {args.epochs} epochs)\n"
    )
    print("| loader | workers | rows per worker | epoch s | samples/s |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['loader']} | {r['workers']} | {r['rows_per_worker']} | {r['epoch_s']:.2f} | {r['samples_per_s']:.0f} |")
    if args.gpu_epoch:
        ray.shutdown()
        full = write_cifar(Path(tempfile.mkdtemp(prefix="ingest_cifar50k_")), 50_000)
        print("\nseed 002 (experiment=vit_cifar10) on one GPU worker, 50k images:")
        for loader in ("dataloader", "ray_data"):
            print(gpu_epoch(full, loader))


if __name__ == "__main__":
    main()
