"""Wall time of a 4-job `python train.py -m` multirun: Hydra's basic launcher (one job after another,
in one process) versus raydra's launcher (jobs side by side, as many as the cluster holds).

    python benchmarks/multirun.py [--epochs 10] [--cpus 2] [--rounds 3]

Each round starts a `ray start --head` cluster (stopped by process id after it), warms it with one
1-epoch run (Ray Data's AutoscalingCoordinator, a detached actor the first Ray Train run on a
cluster makes, and the page cache: a researcher's cluster is up before their multirun), then times
both multiruns on it. Neither pays Ray's start. The jobs are four 1-worker digits ViT runs
differing in learning rate. A shared machine's speed drifts by more than a round lasts, so the two
launchers alternate within each round (which goes first alternates too) and the table gives the
median wall time of each and the median and range of the per-round ratio. Prints a markdown table
and the load average, which decides how far apart the two are.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sweep import env

from raydra.testing import start_ray_head, stop_process_tree

REPO = Path(__file__).resolve().parents[1]
LRS = "1e-4,3e-4,1e-3,3e-3"


def train(outputs: Path, address: str, launcher: str, overrides: list) -> tuple:
    """`python train.py -m` with `launcher` (or a single run: launcher None) on the cluster at
    `address`; returns its wall time and its jobs' summaries."""
    multirun = ["-m", f"hydra/launcher={launcher}", f"model.optimizer.lr={LRS}"] if launcher else []
    started = time.time()
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *multirun, f"paths.outputs={outputs}", f"ray.address={address}", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env(),
    )
    wall = time.time() - started
    if done.returncode:
        sys.exit(f"train.py {' '.join(multirun)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    at_once = re.search(r"up to (\d+) at a time", done.stdout)
    jobs = [json.loads(p.read_text()) for p in sorted(outputs.glob("sweeps/*/*/*/summary.json"))]
    return wall, jobs, int(at_once.group(1)) if at_once else 1


def _each(walls: list) -> str:
    return " / ".join(f"{w:.1f}" for w in walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    out = Path(tempfile.mkdtemp(prefix="raydra-multirun-bench-"))
    load_before = os.getloadavg()
    common = ["experiment=vit_digits_smoke", "scale.num_workers=1", f"trainer.max_epochs={args.epochs}"]
    walls = {"basic": [], "raydra": []}
    last = {}
    for r in range(args.rounds):
        round_dir = out / f"round{r}"
        round_dir.mkdir()
        proc, address = start_ray_head(round_dir / "ray_start.log", env(), num_cpus=args.cpus)
        try:
            train(round_dir / "warm-up", address, None, [*common[:-1], "trainer.max_epochs=1"])
            for launcher in ("basic", "raydra") if r % 2 == 0 else ("raydra", "basic"):
                wall, jobs, at_once = train(round_dir / launcher, address, launcher, common)
                walls[launcher].append(wall)
                last[launcher] = (jobs, at_once)
        finally:
            stop_process_tree(proc)
    ratios = [b / r for b, r in zip(walls["basic"], walls["raydra"], strict=True)]

    print(
        f"4 jobs (model.optimizer.lr={LRS}) of the digits ViT, {args.epochs} epochs, 1 worker each, on a "
        f"{args.cpus}-CPU `ray start` cluster per round, warmed; {args.rounds} rounds; load average before: "
        f"{load_before[0]:.2f}, after: {os.getloadavg()[0]:.2f}\n"
    )
    print("| launcher | wall s (median) | rounds | jobs at once | vs basic (median, range) |")
    print("|---|---:|---|---:|---:|")
    print(
        f"| `hydra/launcher=basic` (one after another, one process) | {statistics.median(walls['basic']):.1f} | {_each(walls['basic'])} | 1 | 1.00x |"
    )
    print(
        f"| raydra's (`-m` default: side by side, a process per job) | {statistics.median(walls['raydra']):.1f} | {_each(walls['raydra'])} "
        f"| {last['raydra'][1]} | **{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}) |"
    )
    print("\nper job in the last round: wall s as the job's summary.json records it (basic / raydra)")
    for a, b in zip(last["basic"][0], last["raydra"][0], strict=True):
        print(
            f"  {Path(a['run_dir']).name}  {a['status']} {a['wall_time_s']:.1f} / {b['status']} {b['wall_time_s']:.1f}"
            f"  best val/acc {a['metrics']['best'].get('val/acc', float('nan')):.4f} / {b['metrics']['best'].get('val/acc', float('nan')):.4f}"
        )


if __name__ == "__main__":
    main()
