"""The same model under ddp, fsdp and deepspeed with 2 workers: memory, speed and checkpoint cost.

    python benchmarks/strategies.py                 # CPU: a ViT of ~10 M parameters on 2 CPU workers
    python benchmarks/strategies.py --gpu           # GPU: ViT-L/16 at 224 px on 2 GPU workers, bf16-mixed

Each row is a real `train.py` run on data=synthetic, read back from its summary.json:
model state per worker (parameters + optimizer state this worker holds: its shard under fsdp),
peak memory per worker (resident set on CPU, CUDA max allocated on GPU), steady samples/s, the
checkpoint's size on disk and the time training stood still per checkpoint. deepspeed runs only on
GPU workers. Prints a markdown table.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MODELS = {
    # ~10 M parameters: big enough that sharding shows, small enough for 2 CPU cores.
    "cpu": [
        "model.hidden_size=384",
        "model.num_layers=6",
        "model.num_heads=6",
        "model.mlp_size=1536",
        "model.patch_size=8",
        "data.image_size=32",
        "data.num_samples=1024",
        "data.val_samples=256",
        "data.batch_size=32",
        "trainer.max_epochs=2",
    ],
    # ViT-L/16: 304 M parameters, 4.9 GB of fp32 weights + AdamW state.
    "gpu": [
        "model.hidden_size=1024",
        "model.num_layers=24",
        "model.num_heads=16",
        "model.mlp_size=4096",
        "model.patch_size=16",
        "data.image_size=224",
        "data.num_samples=4096",
        "data.val_samples=256",
        "data.batch_size=64",
        "trainer.max_epochs=2",
        "scale=gpu",
        "scale.num_workers=2",
    ],
}
STRATEGIES = {
    "ddp": ["strategy=ddp"],
    "fsdp (full, sharded ckpt)": ["strategy=fsdp"],
    "fsdp (grad_op)": ["strategy=fsdp", "strategy.sharding=grad_op"],
    "fsdp (full, full ckpt)": ["strategy=fsdp", "strategy.checkpoint_layout=full"],
    "deepspeed (ZeRO-2)": ["strategy=deepspeed", "strategy.stage=2"],
    "deepspeed (ZeRO-3)": ["strategy=deepspeed", "strategy.stage=3"],
}


def run(name: str, overrides: list, outputs: Path) -> dict:
    args = [
        sys.executable,
        str(REPO / "train.py"),
        "data=synthetic",
        "logger=csv",
        "trainer.test=false",
        "checkpoint.num_to_keep=1",
        f"paths.outputs={outputs}",
        f"name=bench_{len(list(outputs.glob('runs/*/*')))}",
        *overrides,
    ]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    summaries = sorted(outputs.glob("runs/*/*/summary.json"), key=lambda p: p.stat().st_mtime)
    summary = json.loads(summaries[-1].read_text())
    if done.returncode != 0:
        return {"strategy": name, "error": summary.get("error") or done.stdout[-300:]}
    memory = summary["memory_per_worker"]
    checkpoint = Path(summary["checkpoints"]["last"])
    files = [checkpoint] if checkpoint.is_file() else [p for p in checkpoint.rglob("*") if p.is_file()]
    return {
        "strategy": name,
        "state_mb": max(m["model_state_bytes"] for m in memory) / 2**20,
        "peak_mb": max(m["peak_bytes"] for m in memory) / 2**20,
        "samples_per_s": summary["throughput"].get("samples_per_s", float("nan")),
        "ckpt_mb": sum(p.stat().st_size for p in files) / 2**20,
        "save_s": summary["checkpoints"]["save_s_mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="ViT-L/16 on 2 GPU workers with bf16-mixed")
    parser.add_argument("--only", nargs="*", help="strategy rows to run (names as in the table)")
    args = parser.parse_args()
    device = "gpu" if args.gpu else "cpu"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in STRATEGIES.items():
            if args.only and name not in args.only:
                continue
            if name.startswith("deepspeed") and not args.gpu:
                rows.append({"strategy": name, "error": "not run: DeepSpeed needs CUDA GPU workers"})
                continue
            rows.append(run(name, overrides + MODELS[device], Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    ddp = next((r for r in rows if r["strategy"] == "ddp" and "error" not in r), None)
    print("| strategy | param+optim state per worker MB | vs ddp | peak memory per worker MB | samples/s | checkpoint MB | save s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['strategy']} | {r['error']} | | | | | |")
            continue
        ratio = f"{r['state_mb'] / ddp['state_mb']:.2f}x" if ddp else ""
        print(
            f"| {r['strategy']} | {r['state_mb']:.1f} | {ratio} | {r['peak_mb']:.0f} | {r['samples_per_s']:.0f} "
            f"| {r['ckpt_mb']:.1f} | {r['save_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
