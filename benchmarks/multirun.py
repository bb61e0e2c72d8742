"""Wall time of a 4-job `python train.py -m` multirun: Hydra's basic launcher (one job after another,
in one process) versus raydra's launcher (jobs side by side, as many as the cluster holds).

    python benchmarks/multirun.py [--epochs 10] [--cpus 2]

Both multiruns join one `ray start --head` cluster (started here, stopped by process id at the end),
so neither pays Ray's start. The jobs are four 1-worker digits ViT runs differing in learning rate.
Prints a markdown table and the machine's load average, which decides how far apart the two are.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sweep import env

from raydra.testing import start_ray_head, stop_process_tree

REPO = Path(__file__).resolve().parents[1]
LRS = "1e-4,3e-4,1e-3,3e-3"


def multirun(out: Path, launcher: str, common: list) -> tuple:
    outputs = out / launcher
    started = time.time()
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "-m",
            f"hydra/launcher={launcher}",
            f"paths.outputs={outputs}",
            f"model.optimizer.lr={LRS}",
            *common,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env(),
    )
    wall = time.time() - started
    if done.returncode:
        sys.exit(f"the {launcher} multirun failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    jobs = [json.loads(p.read_text()) for p in sorted(outputs.glob("sweeps/*/*/*/summary.json"))]
    at_once = re.search(r"up to (\d+) at a time", done.stdout)
    return wall, jobs, int(at_once.group(1)) if at_once else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()

    out = Path(tempfile.mkdtemp(prefix="raydra-multirun-bench-"))
    load_before = os.getloadavg()
    proc, address = start_ray_head(out / "ray_start.log", env(), num_cpus=args.cpus)
    try:
        common = ["experiment=vit_digits_smoke", "scale.num_workers=1", f"trainer.max_epochs={args.epochs}", f"ray.address={address}"]
        basic_s, basic_jobs, _ = multirun(out, "basic", common)
        raydra_s, raydra_jobs, at_once = multirun(out, "raydra", common)
    finally:
        stop_process_tree(proc)

    print(
        f"4 jobs (model.optimizer.lr={LRS}) of the digits ViT, {args.epochs} epochs, 1 worker each, on a "
        f"{args.cpus}-CPU `ray start` cluster; load average before: {load_before[0]:.2f}, after: {os.getloadavg()[0]:.2f}\n"
    )
    print("| launcher | wall s | jobs at once | vs basic |")
    print("|---|---:|---:|---:|")
    print(f"| `hydra/launcher=basic` (one after another, one process) | {basic_s:.1f} | 1 | 1.00x |")
    print(f"| raydra's (`-m` default: side by side, a process per job) | {raydra_s:.1f} | {at_once} | {basic_s / raydra_s:.2f}x |")
    print("\nper job: wall s as the job's summary.json records it (basic / raydra)")
    for a, b in zip(basic_jobs, raydra_jobs, strict=True):
        print(
            f"  {Path(a['run_dir']).name}  {a['status']} {a['wall_time_s']:.1f} / {b['status']} {b['wall_time_s']:.1f}"
            f"  best val/acc {a['metrics']['best'].get('val/acc', float('nan')):.4f} / {b['metrics']['best'].get('val/acc', float('nan')):.4f}"
        )


if __name__ == "__main__":
    main()
