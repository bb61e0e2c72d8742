"""Wall time of a 4-job `python train.py -m` multirun: Hydra's basic launcher (one job after another,
in one process) versus raydra's launcher (jobs side by side, as many as the cluster holds).

    python benchmarks/multirun.py [--mode both|warm|cold] [--epochs 10] [--cold-epochs 3] [--cpus 2] [--rounds 3]

Two cases, each its own table:

- warm: a `ray start --head` cluster per round (stopped by process id after it), warmed with one
  1-epoch run (Ray Data's AutoscalingCoordinator, a detached actor the first Ray Train run on a
  cluster makes, and the page cache: a researcher's cluster is up before their multirun); both
  multiruns join it (`ray.address=`), so neither pays Ray's start. Four 1-worker jobs of the digits
  ViT smoke preset (`experiment=vit_digits_smoke`), lr 1e-4, 3e-4, 1e-3, 3e-3, `--epochs` epochs.
- cold: a researcher's laptop, no cluster running: each multirun starts its own local Ray (raydra's
  launcher for its jobs, the basic launcher's first job for all four) and pays for it. The command
  as a new user types it: `python train.py -m model.optimizer.lr=1e-3,2e-3,3e-3,4e-3
  scale.num_workers=1 trainer.max_epochs=3 logger=csv` (the default run's model and data).

A shared machine's speed drifts by more than a round lasts, so the two launchers alternate within
each round (which goes first alternates too); each table gives the median wall time of each and the
median and range of the per-round ratio, with the load average, which decides how far apart the
two are. Each multirun's busy CPU seconds and share of the cores (the whole machine's, by psutil)
say how far the CPU bounds it: the line under each table gives the ratio raydra's
launcher would reach with every core busy throughout, its CPU work unchanged. Two slots allow 2.0x
only where one job alone leaves half the cores idle.
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from sweep import env

from raydra.testing import start_ray_head, stop_process_tree

REPO = Path(__file__).resolve().parents[1]
WARM_LRS = "1e-4,3e-4,1e-3,3e-3"
COLD_LRS = "1e-3,2e-3,3e-3,4e-3"


def _cpu_times() -> tuple:
    """The machine's (busy, all) CPU seconds so far, over all its cores. Guest time is already in
    user time, so it is not counted again."""
    import psutil

    t = psutil.cpu_times()
    every = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    return every - t.idle - getattr(t, "iowait", 0.0), every


def train(outputs: Path, address: Optional[str], launcher: Optional[str], lrs: str, overrides: list) -> tuple:
    """`python train.py -m` with `launcher` (or a single run: launcher None), on the cluster at
    `address` or (None) a local Ray of its own; returns its wall time, its jobs' summaries, how
    many ran at once and the machine's CPU use while it ran: (busy CPU s, busy share of all its
    cores)."""
    multirun = ["-m", f"hydra/launcher={launcher}", f"model.optimizer.lr={lrs}"] if launcher else []
    joined = [f"ray.address={address}"] if address else []
    cpu_before = _cpu_times()
    started = time.time()
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *multirun, f"paths.outputs={outputs}", *joined, *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env() if address else _own_local_ray_env(),
    )
    wall = time.time() - started
    cpu_after = _cpu_times()
    busy_s = cpu_after[0] - cpu_before[0]
    busy = (busy_s, busy_s / (cpu_after[1] - cpu_before[1]))
    if done.returncode:
        sys.exit(f"train.py {' '.join(multirun)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    at_once = re.search(r"up to (\d+) at a time", done.stdout)
    jobs = [json.loads(p.read_text()) for p in sorted(outputs.glob("sweeps/*/*/*/summary.json"))]
    return wall, jobs, int(at_once.group(1)) if at_once else 1, busy


def _own_local_ray_env() -> dict:
    """A process that starts its own local Ray: no token or address of another cluster."""
    return {k: v for k, v in env().items() if not k.startswith("RAY_AUTH") and k != "RAY_API_SERVER_ADDRESS"}


def _each(walls: list) -> str:
    return " / ".join(f"{w:.1f}" for w in walls)


def _shares(busy: list) -> str:
    return " / ".join(f"{b[0]:.0f} ({b[1]:.0%})" for b in busy)


def _ceiling(basic_walls: list, raydra_busy: list) -> float:
    """How much sooner than the basic launcher raydra's could have finished, had its multirun kept
    every core busy: the basic launcher's wall time over raydra's busy CPU seconds spread on all
    the cores (the median over rounds)."""
    return statistics.median(w / (b[0] / (os.cpu_count() or 1)) for w, b in zip(basic_walls, raydra_busy, strict=True))


def measure(out: Path, cold: bool, args: argparse.Namespace) -> None:
    load_before = os.getloadavg()
    if cold:
        lrs, common = COLD_LRS, ["scale.num_workers=1", f"trainer.max_epochs={args.cold_epochs}", "logger=csv", f"ray.num_cpus={args.cpus}"]
    else:
        lrs, common = WARM_LRS, ["experiment=vit_digits_smoke", "scale.num_workers=1", f"trainer.max_epochs={args.epochs}"]
    walls = {"basic": [], "raydra": []}
    busy = {"basic": [], "raydra": []}
    last = {}
    for r in range(args.rounds):
        round_dir = out / f"{'cold' if cold else 'warm'}{r}"
        round_dir.mkdir()
        proc, address = (None, None) if cold else start_ray_head(round_dir / "ray_start.log", env(), num_cpus=args.cpus)
        try:
            if not cold:
                train(round_dir / "warm-up", address, None, lrs, [*common[:-1], "trainer.max_epochs=1"])
            for launcher in ("basic", "raydra") if r % 2 == 0 else ("raydra", "basic"):
                wall, jobs, at_once, cpu_busy = train(round_dir / launcher, address, launcher, lrs, common)
                walls[launcher].append(wall)
                busy[launcher].append(cpu_busy)
                last[launcher] = (jobs, at_once)
        finally:
            if proc is not None:
                stop_process_tree(proc)
    ratios = [b / r for b, r in zip(walls["basic"], walls["raydra"], strict=True)]

    if cold:
        print(
            f"\ncold: `python train.py -m model.optimizer.lr={lrs} {' '.join(common[:-1])}` with no cluster running (each multirun "
            f"starts a local Ray of {args.cpus} CPUs); {args.rounds} rounds; load average before: {load_before[0]:.2f}, after: {os.getloadavg()[0]:.2f}\n"
        )
    else:
        print(
            f"\nwarm: 4 jobs (model.optimizer.lr={lrs}) of the digits ViT, {args.epochs} epochs, 1 worker each, on a "
            f"{args.cpus}-CPU `ray start` cluster per round, warmed; {args.rounds} rounds; load average before: "
            f"{load_before[0]:.2f}, after: {os.getloadavg()[0]:.2f}\n"
        )
    print("| launcher | wall s (median) | rounds | jobs at once | busy CPU s (share of the cores), rounds | vs basic (median, range) |")
    print("|---|---:|---|---:|---|---:|")
    print(
        f"| `hydra/launcher=basic` (one after another, one process) | {statistics.median(walls['basic']):.1f} | {_each(walls['basic'])} "
        f"| 1 | {_shares(busy['basic'])} | 1.00x |"
    )
    print(
        f"| raydra's (`-m` default: side by side, a process per job) | {statistics.median(walls['raydra']):.1f} | {_each(walls['raydra'])} "
        f"| {last['raydra'][1]} | {_shares(busy['raydra'])} | **{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}) |"
    )
    ceiling = _ceiling(walls["basic"], busy["raydra"])
    job_count = len(lrs.split(","))
    # Equal jobs in waves of `at_once`: 4 jobs 2 at a time take 2 jobs' time, 2.0x at most.
    by_slots = job_count / math.ceil(job_count / last["raydra"][1])
    print(
        f"\nraydra's launcher with all {os.cpu_count()} cores busy throughout its multiruns would have been "
        f"{ceiling:.2f}x the basic launcher (median over rounds): the most its CPU work allows on this machine; "
        f"{job_count} jobs {last['raydra'][1]} at a time allow at most {by_slots:.2f}x"
    )
    print("\nper job in the last round: wall s as the job's summary.json records it (basic / raydra)")
    for a, b in zip(last["basic"][0], last["raydra"][0], strict=True):
        print(
            f"  {Path(a['run_dir']).name}  {a['status']} {a['wall_time_s']:.1f} / {b['status']} {b['wall_time_s']:.1f}"
            f"  best val/acc {a['metrics']['best'].get('val/acc', float('nan')):.4f} / {b['metrics']['best'].get('val/acc', float('nan')):.4f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("both", "warm", "cold"), default="both")
    parser.add_argument("--epochs", type=int, default=10, help="epochs of each warm-case job")
    parser.add_argument("--cold-epochs", type=int, default=3, help="epochs of each cold-case job")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    out = Path(tempfile.mkdtemp(prefix="raydra-multirun-bench-"))
    if args.mode in ("both", "warm"):
        measure(out, cold=False, args=args)
    if args.mode in ("both", "cold"):
        measure(out, cold=True, args=args)


if __name__ == "__main__":
    main()
