"""Wall time of a 4-trial `tune=asha` sweep versus the same 4 configs run one after another.

    python benchmarks/sweep.py [--epochs 10] [--samples 4] [--cpus 2]

Starts one `ray start --head` cluster (stopped by process id at the end) that both sides join, so
neither pays Ray's start. The sweep runs its trials side by side (one worker each, as many as the
cluster holds) and stops poor ones early; the baseline runs each trial's sampled config to the
end, one `python train.py` after another. Prints a markdown table.
"""

import argparse
import csv
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raydra.records import sweep
from raydra.testing import start_ray_head, stop_process_tree

REPO = Path(__file__).resolve().parents[1]


# The benchmark cluster's token: `ray start` with token authentication refuses to start without one.
RAY_AUTH_TOKEN = secrets.token_hex(32)


def env() -> dict:
    """What the benchmark's cluster and every `python train.py` it starts run with."""
    e = dict(os.environ, WANDB_MODE="offline", RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=RAY_AUTH_TOKEN)
    e.pop("RAY_ADDRESS", None)
    return e


def train(*overrides: str) -> float:
    started = time.time()
    done = subprocess.run([sys.executable, str(REPO / "train.py"), *overrides], cwd=REPO, capture_output=True, text=True, env=env())
    if done.returncode:
        sys.exit(f"train.py {' '.join(overrides)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()

    out = Path(tempfile.mkdtemp(prefix="raydra-sweep-bench-"))
    common = [f"paths.outputs={out}", "logger=csv", "scale.num_workers=1", f"trainer.max_epochs={args.epochs}"]
    proc, address = start_ray_head(out / "ray_start.log", env(), num_cpus=args.cpus)
    try:
        common.append(f"ray.address={address}")
        sweep_s = train("tune=asha", f"tune.num_samples={args.samples}", *common)
        (sweep_dir,) = [p.parent for p in out.glob("sweeps/*/*/sweep.json")]
        record = sweep.read(sweep_dir)
        trials = list(csv.DictReader((sweep_dir / "trials.csv").open()))
        keys = list(record.space)
        one_by_one = []
        for trial in trials:
            one_by_one.append(train(*common, *[f"{key}={trial[key]}" for key in keys]))
    finally:
        stop_process_tree(proc)

    sequential_s = sum(one_by_one)
    stopped = sum(t["status"] == "stopped" for t in trials)
    print(
        f"{args.samples} trials of the digits ViT, {args.epochs} epochs, 1 worker each, on a {args.cpus}-CPU Ray cluster "
        f"(search space: {', '.join(keys)}); sweep: {record.max_concurrent} trials at a time, {stopped} stopped early by ASHA\n"
    )
    print("| way | wall s | vs one after another |")
    print("|---|---:|---:|")
    print(f"| the same {len(trials)} configs one after another (`python train.py` each) | {sequential_s:.1f} | 1.00x |")
    print(f"| `python train.py tune=asha` | {sweep_s:.1f} | {sequential_s / sweep_s:.2f}x |")
    print("\nper trial (sweep):")
    for trial, alone in zip(trials, one_by_one):
        print(
            f"  {trial['trial']}  "
            + "  ".join(f"{k}={trial[k]}" for k in keys)
            + f"  {trial['status']} after {trial['epochs']} epochs, {trial['wall_s']} s in the sweep; {alone:.1f} s alone"
        )


if __name__ == "__main__":
    main()
