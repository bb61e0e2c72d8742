"""Idle slots and pruning of an Optuna search over `python train.py -m`: raydra's asynchronous sweeper
(`hydra/sweeper=optuna_async`) against Hydra's Optuna sweeper in batches of two on raydra's launcher,
and the asynchronous sweeper with Optuna's median pruner, on one `ray start --head` cluster.

    python benchmarks/async_sweep.py [--trials 12] [--cpus 2] [--seed 0] [--only async,batch,pruned]

Each sweep: `--trials` trials of the digits ViT smoke preset, 1-worker jobs (two at a time on 2
CPUs), trials of uneven length, and a space where half the learning rates are clearly worse (0.3 and
1.0 diverge): `model.optimizer.lr=1e-3,3e-3,0.3,1.0 trainer.max_epochs=range(3,9)`. All three use
Optuna's RandomSampler with the same seed, which samples the same trials whatever the results, so
the sweeps differ only in how their trials are run.

Per sweep, from its jobs.json (each job's `started_at` and `released_at`, when its slot freed):
- slot time: slots x (the last release - the first start);
- idle between jobs: each job started after the first `slots` waited from the release that made
  room for it (the k-th release, in time order) to its own start; their sum, and its share of the
  slot time (a batch's next pair waits for the batch's slower job);
- worker-seconds: the jobs' compute ledgers' allocated seconds (each summary.json's `ledger`), summed;
- the best val/acc and its trial; pruned trials, and how many epochs each logged after the epoch
  its pruner decided at (0 or 1: stopped within an epoch).
Prints a markdown table, with the load average.
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from sweep import env

from raydra.records import jobs as jobs_record
from raydra.testing import start_ray_head, stop_process_tree

REPO = Path(__file__).resolve().parents[1]
SPACE = ("model.optimizer.lr=1e-3,3e-3,0.3,1.0", "trainer.max_epochs=range(3,9)")
SWEEPERS = {
    "async": ("hydra/sweeper=optuna_async", "hydra/sweeper/sampler=random"),
    "batch": ("hydra/sweeper=optuna", "hydra/sweeper/sampler=random", "hydra.sweeper.n_jobs=2", "hydra.sweeper.direction=maximize"),
    "pruned": ("hydra/sweeper=optuna_async", "hydra/sweeper/sampler=random", "hydra/sweeper/pruner=median"),
}


def run_sweep(name: str, out: Path, address: str, args: argparse.Namespace) -> dict:
    sweep_dir = out / name
    overrides = [
        *SWEEPERS[name],
        f"hydra.sweeper.n_trials={args.trials}",
        f"hydra.sweeper.sampler.seed={args.seed}",
        *SPACE,
        "experiment=vit_digits_smoke",
        "trainer.test=false",
        "scale.num_workers=1",
        "logger=csv",
        f"hydra.sweep.dir={sweep_dir}",
        f"paths.outputs={out}",
        f"ray.address={address}",
    ]
    started = time.time()
    done = subprocess.run([sys.executable, str(REPO / "train.py"), "-m", *overrides], cwd=REPO, capture_output=True, text=True, env=env())
    wall = time.time() - started
    if done.returncode:
        sys.exit(f"the {name} sweep failed:\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    return {"name": name, "wall": wall, **measure(sweep_dir, slots=2)}


def _t(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def measure(sweep_dir: Path, slots: int) -> dict:
    record = jobs_record.read(sweep_dir)
    jobs = [job for job in record.jobs.values() if job.started_at and job.released_at]
    starts = sorted(_t(job.started_at) for job in jobs)
    releases = sorted(_t(job.released_at) for job in jobs)
    gaps = [start - release for start, release in zip(starts[slots:], releases)]
    slot_time = slots * (releases[-1] - starts[0])
    best, best_num = None, None
    pruned_after = []
    worker_s = 0.0
    for num, job in record.jobs.items():
        summary = json.loads((Path(job.dir) / "summary.json").read_text())
        worker_s += (summary.get("ledger") or {}).get("allocated_s") or 0.0
        value = (summary.get("metrics") or {}).get("best", {}).get("val/acc")
        if summary["status"] == "completed" and value is not None and (best is None or value > best):
            best, best_num = value, num
        if summary["status"] == "pruned":
            decided = int(summary["stopped_by"].split("at epoch ")[1].split(":")[0])
            with (Path(job.dir) / "metrics.csv").open() as file:
                epochs = {int(row["epoch"]) for row in csv.DictReader(file) if row.get("val/acc")}
            pruned_after.append(max(epochs) - decided)
    return {
        "jobs": len(jobs),
        "slot_time": slot_time,
        "idle": sum(max(0.0, gap) for gap in gaps),
        "gaps": gaps,
        "worker_s": worker_s,
        "best": best,
        "best_num": best_num,
        "pruned": len(pruned_after),
        "pruned_after": pruned_after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="async,batch,pruned")
    args = parser.parse_args()

    out = Path(tempfile.mkdtemp(prefix="raydra-async-sweep-"))
    proc, address = start_ray_head(out / "ray_start.log", env(), num_cpus=args.cpus)
    load = []
    try:
        # A warm cluster, as a researcher's is: Ray Train's first run on it makes its detached actors.
        warm = [sys.executable, str(REPO / "train.py"), "experiment=vit_digits_smoke", "trainer.max_epochs=1", "scale.num_workers=1"]
        subprocess.run(
            [*warm, "logger=csv", f"paths.outputs={out / 'warm'}", f"ray.address={address}"], cwd=REPO, capture_output=True, env=env()
        )
        rows = []
        for name in args.only.split(","):
            load.append(os.getloadavg()[0])
            rows.append(run_sweep(name, out, address, args))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        stop_process_tree(proc)
    print(f"\n{args.trials} trials, 2 slots, load average at each start {', '.join(f'{x:.1f}' for x in load)}; outputs {out}\n")
    print(
        "| sweep | wall s | slot time s | idle between jobs s | idle share | worker-s | best val/acc (trial) | pruned | epochs after decision |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|---|")
    for row in rows:
        print(
            f"| {row['name']} | {row['wall']:.0f} | {row['slot_time']:.0f} | {row['idle']:.1f} | {row['idle'] / row['slot_time']:.1%} | "
            f"{row['worker_s']:.0f} | {row['best']:.4f} (#{row['best_num']}) | {row['pruned']} | {row['pruned_after'] or '-'} |"
        )


if __name__ == "__main__":
    main()
