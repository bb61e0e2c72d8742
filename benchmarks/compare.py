"""How long `raydra compare` takes, and how large its HTML report is, for 10, 100 and 1,000 runs.

    python benchmarks/compare.py [--sizes 10 100 1000] [--repeats 3]

Synthetic run directories in raydra's formats (.hydra/config.yaml, overrides.yaml, hydra.yaml,
summary.json, and a metrics.csv of 30 epochs with 4 steps each): a sweep over the learning rate
with 5 seeds per value, so the table aggregates seeds. Each timing is a cold `python -m raydra
compare` process, as a user runs it, median of the repeats. Goals: table < 3 s, HTML < 15 s at 1,000.
"""

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
EPOCHS, STEPS_PER_EPOCH = 30, 4


def write_run(run: Path, lr: float, seed: int) -> None:
    (run / ".hydra").mkdir(parents=True)
    config = {
        "name": "vit_digits",
        "seed": seed,
        "model": {
            "_target_": "raydra.models.vit.ViTClassifier",
            "hidden_size": 64,
            "optimizer": {"_target_": "torch.optim.AdamW", "lr": lr},
        },
        "data": {"batch_size": 32},
        "trainer": {"max_epochs": EPOCHS},
        "logger": {"csv": {"flush_logs_every_n_steps": 50}},
    }
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"model.optimizer.lr={lr}", f"seed={seed}"]))
    choices = {"hydra": {"runtime": {"choices": {"model": "vit", "data": "digits", "logger": "csv", "hydra/launcher": "raydra"}}}}
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(choices))
    acc, step, rows = 0.1, 0, []
    for epoch in range(EPOCHS):
        for _ in range(STEPS_PER_EPOCH):
            step += 1
            rows.append({"epoch": epoch, "step": step, "train/loss": round(2.3 / step**0.5, 5)})
        acc = min(0.99, acc + lr * 10 * (1 - acc) + seed * 1e-4)
        rows.append({"epoch": epoch, "step": step, "val/acc": round(acc, 5), "val/loss": round(1 - acc, 5)})
    with open(run / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["epoch", "step", "train/loss", "val/acc", "val/loss"])
        writer.writeheader()
        writer.writerows(rows)
    summary = {
        "status": "completed",
        "run_dir": str(run),
        "monitor": {"metric": "val/acc", "mode": "max"},
        "wall_time_s": 60.0,
        "throughput": {"samples_per_s": 800.0},
        "metrics": {"final": {"val/acc": round(acc, 5), "epoch": EPOCHS - 1, "step": step}, "best": {"val/acc": round(acc, 5)}},
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2))


def timed(args: list) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "raydra", "compare", *args], cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    lines = ["| runs | table (s) | HTML (s) | HTML size (MB) |", "|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory(prefix="raydra-bench-compare-") as tmp:
        for n in args.sizes:
            root = Path(tmp, str(n))
            for i in range(n):
                write_run(root / str(i), lr=round(0.001 * (1 + i // 5), 6), seed=i % 5)
            html = Path(tmp, f"{n}.html")
            table = statistics.median(timed([str(root)]) for _ in range(args.repeats))
            page = statistics.median(timed([str(root), "--html", str(html)]) for _ in range(args.repeats))
            lines.append(f"| {n:,} | {table:.2f} | {page:.2f} | {html.stat().st_size / 1e6:.1f} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
