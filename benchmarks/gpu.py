"""GPU throughput and MFU: raydra next to a plain PyTorch loop doing the same work on the same device.

    python benchmarks/gpu.py                          # every workload, plain loop and raydra
    python benchmarks/gpu.py --only plain             # plain loops only (no Ray needed)
    python benchmarks/gpu.py --workloads seed002

Workloads: seed 002's ViT (CIFAR-10-shaped 32x32x3, patch 4, 12 layers, 8 heads, hidden 384, MLP
768, global batch 512) and ViT-B/16 at 224 px (batch 128), each in fp32 (TF32 matmuls) and
bf16-mixed, eager and torch.compile. The plain loop keeps a pool of batches on the device, so it
is the ceiling; raydra runs `train.py data=synthetic` on one GPU worker through Ray Train. MFU is
model FLOPs (counted with torch.utils.flop_counter on one step) over the dense peak.

Both sides train the same model: Hugging Face's ViTForImageClassification with the workload's
shape, AdamW (lr 1e-3, weight decay 0.01) at a constant rate, no dropout or label smoothing.
raydra's side sets `model.conv_stem=[]`: model/vit.yaml's default stem (two 3x3 convolutions at
full resolution, for digits) has no counterpart in the plain loop. The H200 figures of 2026-11-27
were taken with the stem on raydra's side, a larger model than the plain loop's
(tests/package/test_gpu_suite.py now compares the two sides' weights).
"""

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

WORKLOADS = {
    # name: (image_size, patch, layers, heads, hidden, mlp, classes, batch, epoch samples)
    "seed002": dict(
        image_size=32, patch_size=4, num_layers=12, num_heads=8, hidden_size=384, mlp_size=768, num_classes=10, batch=512, epoch=50_000
    ),
    "vit_b16": dict(
        image_size=224, patch_size=16, num_layers=12, num_heads=12, hidden_size=768, mlp_size=3072, num_classes=1000, batch=128, epoch=None
    ),
}
PRECISIONS = ("32-true", "bf16-mixed")


def plain_network(w: dict):
    """The plain loop's model: the network raydra's ViTClassifier holds as `net`, nothing around it."""
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(
        ViTConfig(
            image_size=w["image_size"],
            patch_size=w["patch_size"],
            num_hidden_layers=w["num_layers"],
            num_attention_heads=w["num_heads"],
            hidden_size=w["hidden_size"],
            intermediate_size=w["mlp_size"],
            num_labels=w["num_classes"],
            num_channels=3,
        )
    )


def plain_loop(workload: dict, precision: str, compiled: bool, steps: int = 40) -> dict:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from raydra.worker.throughput import peak_flops

    torch.set_float32_matmul_precision("high")
    device = torch.device("cuda")
    w = workload
    net = plain_network(w).to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-2, fused=True)
    pool = [
        (
            torch.randn(w["batch"], 3, w["image_size"], w["image_size"], device=device),
            torch.randint(0, w["num_classes"], (w["batch"],), device=device),
        )
        for _ in range(4)
    ]
    forward = torch.compile(net) if compiled else net
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16-mixed")

    def step(images, labels):
        with autocast:
            loss = torch.nn.functional.cross_entropy(forward(pixel_values=images).logits, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with FlopCounterMode(display=False) as counter:
        with autocast:
            loss = torch.nn.functional.cross_entropy(net(pixel_values=pool[0][0]).logits, pool[0][1])
        loss.backward()
    optimizer.zero_grad(set_to_none=True)
    for images, labels in itertools.islice(itertools.cycle(pool), 10):  # warm-up (and compilation)
        step(images, labels)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for images, labels in itertools.islice(itertools.cycle(pool), steps):
        step(images, labels)
    torch.cuda.synchronize()
    seconds_per_step = (time.perf_counter() - started) / steps
    return {
        "samples_per_s": w["batch"] / seconds_per_step,
        "mfu": counter.get_total_flops() / seconds_per_step / peak_flops(device, precision),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def raydra_overrides(w: dict, precision: str, compiled: bool, steps: int) -> list:
    """train.py's overrides for the workload: the plain loop's model, data and optimizer."""
    return [
        "scale=gpu",
        "scale.cpus_per_worker=8",
        "logger=none",
        "data=synthetic",
        f"data.image_size={w['image_size']}",
        f"data.num_classes={w['num_classes']}",
        f"data.batch_size={w['batch']}",
        f"data.num_samples={w['epoch'] or w['batch'] * steps}",
        f"data.val_samples={w['batch']}",
        "data.num_channels=3",
        f"model.patch_size={w['patch_size']}",
        f"model.num_layers={w['num_layers']}",
        f"model.num_heads={w['num_heads']}",
        f"model.hidden_size={w['hidden_size']}",
        f"model.mlp_size={w['mlp_size']}",
        # The plain loop has no convolutional stem: without this, raydra trained a larger model.
        "model.conv_stem=[]",
        "model.optimizer.weight_decay=0.01",
        "model.scheduler=null",
        f"trainer.precision={precision}",
        f"trainer.compile={str(compiled).lower()}",
        "trainer.max_epochs=1",
        "trainer.test=false",
    ]


def raydra_run(workload: dict, precision: str, compiled: bool, steps: int = 60) -> dict:
    with tempfile.TemporaryDirectory() as outputs:
        overrides = [f"paths.outputs={outputs}", *raydra_overrides(workload, precision, compiled, steps)]
        done = subprocess.run([sys.executable, "train.py", *overrides], cwd=REPO, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
        (summary_file,) = Path(outputs).glob("runs/*/*/summary.json")
        summary = json.loads(summary_file.read_text())
    throughput = summary["throughput"]
    return {
        "samples_per_s": throughput["samples_per_s"],
        "mfu": throughput.get("mfu"),
        "peak_memory_gib": summary["peak_memory_bytes"] / 2**30,
    }


def comma_list(allowed):
    """An argparse type: a comma-separated list of allowed words, checked as the flag is read."""

    def check(text: str) -> str:
        wrong = set(text.split(",")) - set(allowed)
        if wrong:
            raise argparse.ArgumentTypeError(f"no {', '.join(sorted(wrong))}; choose from {', '.join(allowed)}")
        return text

    return check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--workloads", default="seed002,vit_b16", type=comma_list(WORKLOADS), help="comma-separated: " + ",".join(WORKLOADS)
    )
    parser.add_argument("--only", choices=["plain", "raydra"])
    parser.add_argument("--compile", default="false,true", type=comma_list(("false", "true")), help="comma-separated: false (eager), true")
    parser.add_argument(
        "--precisions", default=",".join(PRECISIONS), type=comma_list(PRECISIONS), help="comma-separated: " + ",".join(PRECISIONS)
    )
    args = parser.parse_args()
    import torch  # after the arguments: --help and a wrong flag answer without loading torch

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| workload | precision | compile | way | samples/s | MFU | peak GiB | epoch s (50k) | vs plain |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for name in args.workloads.split(","):
        for precision in args.precisions.split(","):
            for compiled in [c == "true" for c in args.compile.split(",")]:
                plain = None
                for way, fn in (("plain loop", plain_loop), ("raydra", raydra_run)):
                    if args.only and not way.startswith(args.only):
                        continue
                    try:
                        r = fn(WORKLOADS[name], precision, compiled)
                    except Exception as error:  # one failed cell must not hide the others
                        print(f"| {name} | {precision} | {compiled} | {way} | failed: {str(error)[-200:]!r} |")
                        continue
                    plain = plain or (r if way == "plain loop" else None)
                    epoch = f"{50_000 / r['samples_per_s']:.1f}" if WORKLOADS[name]["epoch"] else "-"
                    ratio = f"{r['samples_per_s'] / plain['samples_per_s']:.2f}x" if plain else "-"
                    mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "-"
                    print(
                        f"| {name} | {precision} | {compiled} | {way} | {r['samples_per_s']:.0f} | {mfu} | "
                        f"{r['peak_memory_gib']:.1f} | {epoch} | {ratio} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
