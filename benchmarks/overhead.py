"""What raydra costs: the same model on the same data trained four ways, in one table.

    python benchmarks/overhead.py [--epochs 5]

Ways: a plain PyTorch loop, plain Lightning in one process, raydra with 1 worker and with 2
workers. Every way trains the digits ViT with 32 samples per worker per step on 1 CPU thread per
worker, so steady-state samples/s per worker is like for like. Start-up is launch to first
training step; the goal is per-worker steady throughput within 10% of plain Lightning.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = dict(image_size=8, num_channels=1, num_classes=10, patch_size=2, hidden_size=64, num_layers=4,
             num_heads=4, mlp_size=128)
OPTIMIZER = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3, "weight_decay": 0.05}
BATCH, WARMUP = 32, 5


def plain_torch(epochs: int, launched: float) -> dict:
    import torch

    from raydra.data.digits import DigitsDataModule
    from raydra.models.vit import ViTClassifier

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = DigitsDataModule(batch_size=BATCH)
    data.setup()
    net = ViTClassifier(optimizer=OPTIMIZER, **MODEL).net
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    first_step_at, steps, samples, seconds = None, 0, 0, 0.0
    for _ in range(epochs):
        tick = time.perf_counter()
        for images, labels in data.train_dataloader():
            first_step_at = first_step_at or time.time()
            loss = loss_fn(net(pixel_values=images).logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            tock = time.perf_counter()
            steps += 1
            if steps > WARMUP:
                samples, seconds = samples + len(labels), seconds + tock - tick
            tick = tock
    return {"startup_s": first_step_at - launched, "samples_per_s": samples / seconds, "workers": 1}


def plain_lightning(epochs: int, launched: float) -> dict:
    import torch

    from raydra.callbacks import Throughput
    from raydra.data.digits import DigitsDataModule
    from raydra.lightning import pl
    from raydra.models.vit import ViTClassifier

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    throughput = Throughput(world_size=1)
    trainer = pl.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, callbacks=[throughput],
    )
    trainer.fit(ViTClassifier(optimizer=OPTIMIZER, **MODEL), datamodule=DigitsDataModule(batch_size=BATCH))
    summary = throughput.summary()
    return {"startup_s": summary["first_step_at"] - launched, "samples_per_s": summary["samples_per_s"], "workers": 1}


def raydra(epochs: int, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as outputs:
        launched = time.time()
        subprocess.run(
            [sys.executable, "train.py", f"paths.outputs={outputs}", f"scale.num_workers={workers}",
             f"data.batch_size={BATCH * workers}", f"trainer.max_epochs={epochs}", "trainer.test=false",
             "logger=none"],
            cwd=REPO, check=True, capture_output=True,
        )
        wall = time.time() - launched
        (summary_file,) = Path(outputs).glob("runs/*/*/summary.json")
        throughput = json.loads(summary_file.read_text())["throughput"]
    return {"startup_s": throughput["first_step_at"] - launched, "samples_per_s": throughput["samples_per_s"],
            "workers": workers, "wall_s": wall}


def in_subprocess(way: str, epochs: int) -> dict:
    launched = time.time()
    out = subprocess.run(
        [sys.executable, __file__, "--way", way, "--epochs", str(epochs), "--launched", str(launched)],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["wall_s"] = time.time() - launched
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--way")
    parser.add_argument("--launched", type=float)
    args = parser.parse_args()
    if args.way:
        print(json.dumps({"plain_torch": plain_torch, "plain_lightning": plain_lightning}[args.way](
            args.epochs, args.launched)))
        return
    rows = {
        "plain PyTorch loop": in_subprocess("plain_torch", args.epochs),
        "plain Lightning": in_subprocess("plain_lightning", args.epochs),
        "raydra, 1 worker": raydra(args.epochs, 1),
        "raydra, 2 workers": raydra(args.epochs, 2),
    }
    base = rows["plain Lightning"]
    base_per_worker = base["samples_per_s"]
    print(f"digits ViT, {args.epochs} epochs, {BATCH} samples/worker/step, 1 CPU thread per worker\n")
    print("| way | start-up s | steady samples/s | per worker | per worker vs Lightning | wall s | wall vs Lightning |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        per_worker = r["samples_per_s"] / r["workers"]
        print(f"| {name} | {r['startup_s']:.1f} | {r['samples_per_s']:.0f} | {per_worker:.0f} | "
              f"{per_worker / base_per_worker:.2f}x | {r['wall_s']:.1f} | {r['wall_s'] / base['wall_s']:.2f}x |")


if __name__ == "__main__":
    main()
