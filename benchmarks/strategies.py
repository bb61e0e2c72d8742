"""The same model under ddp, fsdp and deepspeed with 2 workers: memory, speed and checkpoint cost.

    python benchmarks/strategies.py                 # CPU: a ViT of ~10 M parameters on 2 CPU workers
    python benchmarks/strategies.py --gpu           # GPU: ViT-L/16 at 224 px, bf16-mixed, one worker per GPU (at most 2)
    python benchmarks/strategies.py --gpu --workers 1 --only ddp zero2 zero3
    python benchmarks/strategies.py --gpu --epochs 1 --only zero2 zero3   # the GPU suite's step: one checkpoint each

Rows (--only takes their ids): ddp, fsdp (full sharding, sharded checkpoint), fsdp_grad_op,
fsdp_full_ckpt, zero2, zero3 (DeepSpeed). On one worker nothing is sharded across workers, so
fsdp's and ZeRO's memory equals ddp's less what each keeps in another precision or layout: the
table's first line says how many workers ran.

Each row is a real `train.py` run on data=synthetic, read back from its summary.json:
model state per worker (parameters + optimizer state this worker holds: its shard under fsdp),
peak memory per worker (resident set on CPU, CUDA max allocated on GPU), steady samples/s, the
checkpoint's size on disk and the time training stood still per checkpoint. deepspeed runs only on
GPU workers. Prints a markdown table.
"""

import argparse
import json
import shutil
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
        "scale=gpu",
    ],
}
STRATEGIES = {
    # id: (the table's name, overrides)
    "ddp": ("ddp", ["strategy=ddp"]),
    "fsdp": ("fsdp (full, sharded ckpt)", ["strategy=fsdp"]),
    "fsdp_grad_op": ("fsdp (grad_op)", ["strategy=fsdp", "strategy.sharding=grad_op"]),
    "fsdp_full_ckpt": ("fsdp (full, full ckpt)", ["strategy=fsdp", "strategy.checkpoint_layout=full"]),
    "zero2": ("deepspeed (ZeRO-2)", ["strategy=deepspeed", "strategy.stage=2"]),
    "zero3": ("deepspeed (ZeRO-3)", ["strategy=deepspeed", "strategy.stage=3"]),
}


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def run(name: str, overrides: list, outputs: Path) -> dict:
    """One train.py run in its own folder, deleted once its figures are read: ViT-L/16's
    checkpoints are ~5 GB each, and a GPU machine's disk holds only so many."""
    try:
        return _run(name, overrides, outputs)
    finally:
        shutil.rmtree(outputs, ignore_errors=True)


def _run(name: str, overrides: list, outputs: Path) -> dict:
    args = [
        sys.executable,
        str(REPO / "train.py"),
        "data=synthetic",
        "logger=csv",
        "trainer.test=false",
        "checkpoint.num_to_keep=1",
        f"paths.outputs={outputs}",
        "name=bench",
        *overrides,
    ]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    summaries = list(outputs.glob("runs/*/*/summary.json"))
    summary = json.loads(summaries[0].read_text()) if summaries else {}
    if done.returncode != 0:
        why = summary.get("error") or (done.stdout + done.stderr)[-300:]
        return {"strategy": name, "error": "failed: " + " ".join(str(why).replace("|", "/").split())[-400:]}
    memory = summary["memory_per_worker"]
    # Relative to the run directory (summary.json format 2).
    checkpoint = summaries[0].parent / summary["checkpoints"]["last"]
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
    parser.add_argument("--gpu", action="store_true", help="ViT-L/16 at 224 px with bf16-mixed on GPU workers")
    parser.add_argument("--only", nargs="*", choices=list(STRATEGIES), help="rows to run, by id: " + " ".join(STRATEGIES))
    parser.add_argument("--workers", type=int, default=None, help="workers (CPU: 2; GPU: the GPUs there are, at most 2)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run, a checkpoint at each one's end (default 2)")
    args = parser.parse_args()
    device = "gpu" if args.gpu else "cpu"
    workers = args.workers or (min(gpu_count(), 2) if args.gpu else 2)
    if args.gpu and workers < 1:
        sys.exit("--gpu needs a CUDA device: none is visible")
    where = f"{workers} GPU worker{'s' * (workers > 1)}" if args.gpu else f"{workers} CPU workers"
    alone = " (one worker: nothing is sharded across workers, so these are single-GPU figures)" if workers == 1 else ""
    print(f"{'ViT-L/16, 224 px, bf16-mixed' if args.gpu else 'ViT ~10 M parameters'} on {where}{alone}\n")
    # Rows print as each run ends, so a run cut short keeps what it measured; the first row that
    # ran is the one the others are compared with when ddp is not among them.
    print("| strategy | param+optim state per worker MB | vs ddp | peak memory per worker MB | samples/s | checkpoint MB | save s |")
    print("|---|---:|---:|---:|---:|---:|---:|", flush=True)
    ddp = None
    with tempfile.TemporaryDirectory() as tmp:
        for key, (name, overrides) in STRATEGIES.items():
            if args.only and key not in args.only:
                continue
            if key.startswith("zero") and not args.gpu:
                r = {"strategy": name, "error": "not run: DeepSpeed needs CUDA GPU workers"}
            else:
                r = run(
                    name,
                    overrides + MODELS[device] + [f"scale.num_workers={workers}", f"trainer.max_epochs={args.epochs}"],
                    Path(tmp) / key,
                )
            print(json.dumps(r), file=sys.stderr, flush=True)
            if "error" in r:
                print(f"| {r['strategy']} | {r['error']} | | | | | |", flush=True)
                continue
            ddp = r if key == "ddp" else ddp
            ratio = f"{r['state_mb'] / ddp['state_mb']:.2f}x" if ddp else ""
            print(
                f"| {r['strategy']} | {r['state_mb']:.1f} | {ratio} | {r['peak_mb']:.0f} | {r['samples_per_s']:.0f} "
                f"| {r['ckpt_mb']:.1f} | {r['save_s']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
