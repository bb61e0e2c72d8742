"""A real seed race (hydra/sweeper=race) on the digits ViT, run twice on one `ray start` cluster:
once to its verdict, once killed (SIGKILL of the driver, as a lost login node) after its first
`--kill-after` jobs completed and resumed with `hydra.launcher.resume=true`. Says whether the two
verdicts are the same, whether any job that had completed ran again, and what each race spent.

    python benchmarks/race_real.py [--lrs 1e-5,1e-3,3e-3] [--epochs 2] [--max-seeds 5] [--kill-after 3] [--cpus 2]

Each job: `experiment=vit_digits_smoke scale.num_workers=1 trainer.max_epochs=<epochs>
trainer.test=false`, two at a time on a 2-CPU head. The uninterrupted race's closing verdict is
printed as it printed it, and `raydra compare` of each race directory is run (its exit code checked).
"""

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sweep import env

from raydra.records import jobs as jobs_record
from raydra.records import race as race_record
from raydra.testing import start_ray_head, stop_process_tree

REPO = Path(__file__).resolve().parents[1]


def command(sweep_dir: Path, args: argparse.Namespace, address: str) -> list:
    return [
        sys.executable,
        str(REPO / "train.py"),
        "-m",
        "experiment=vit_digits_smoke",
        "trainer.test=false",
        "scale.num_workers=1",
        f"trainer.max_epochs={args.epochs}",
        "hydra/sweeper=race",
        f"hydra.sweeper.max_seeds={args.max_seeds}",
        f"model.optimizer.lr={args.lrs}",
        f"hydra.sweep.dir={sweep_dir}",
        f"paths.outputs={sweep_dir.parent}",
        f"ray.address={address}",
    ]


def verdict(sweep_dir: Path) -> tuple:
    record = race_record.read(sweep_dir)
    return (
        record.winner,
        record.decided,
        tuple(c.standing for c in record.configurations),
        tuple((look.level, look.leader, tuple(look.dropped), tuple(look.out_of_reach)) for look in record.looks),
    )


def killed_and_resumed(sweep_dir: Path, args: argparse.Namespace, address: str) -> tuple:
    """The race killed once `kill_after` jobs completed, then resumed; (wall s of both, the
    completed jobs' summary.json bytes as they were at the kill, the resumed run's stdout)."""
    started = time.time()
    driver = subprocess.Popen(
        command(sweep_dir, args, address), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env()
    )
    try:
        while True:
            if driver.poll() is not None:
                sys.exit(f"the race ended before {args.kill_after} jobs completed:\n{driver.communicate()[0][-3000:]}")
            record = jobs_record.read(sweep_dir) if (sweep_dir / "jobs.json").is_file() else None
            completed = [n for n, job in (record.jobs.items() if record else ()) if job.status == "completed"]
            if len(completed) >= args.kill_after:
                break
            time.sleep(0.3)
        driver.send_signal(signal.SIGKILL)
        driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    kept = {n: (sweep_dir / n / "summary.json").read_bytes() for n in completed}
    # Its running jobs stop as the driver's job server goes, recording themselves interrupted.
    while any(json.loads(p.read_text()).get("status") == "running" for p in sweep_dir.glob("*/summary.json")):
        time.sleep(1)
    done = subprocess.run(
        [*command(sweep_dir, args, address), "hydra.launcher.resume=true"], cwd=REPO, capture_output=True, text=True, env=env()
    )
    if done.returncode:
        sys.exit(f"the resumed race failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.time() - started, kept, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lrs", default="1e-5,1e-3,3e-3")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-seeds", type=int, default=5)
    parser.add_argument("--kill-after", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="race-real-"))
    proc, address = start_ray_head(out / "ray_start.log", env(), num_cpus=args.cpus)
    try:
        whole_dir = out / "whole" / "race"
        started = time.time()
        whole = subprocess.run(command(whole_dir, args, address), cwd=REPO, capture_output=True, text=True, env=env())
        if whole.returncode:
            sys.exit(f"the race failed:\n{whole.stdout[-3000:]}{whole.stderr[-3000:]}")
        whole_s = time.time() - started
        killed_dir = out / "killed" / "race"
        killed_s, kept, resumed_out = killed_and_resumed(killed_dir, args, address)
    finally:
        stop_process_tree(proc)

    print(whole.stdout[whole.stdout.index("race of") :] if "race of" in whole.stdout else whole.stdout[-2000:])
    ran_again = [n for n in kept if f"[{n}] started" in resumed_out or (killed_dir / n / "summary.json").read_bytes() != kept[n]]
    for name, sweep_dir, wall in (("uninterrupted", whole_dir, whole_s), ("killed and resumed", killed_dir, killed_s)):
        record = race_record.read(sweep_dir)
        shown = subprocess.run([sys.executable, "-m", "raydra", "compare", str(sweep_dir)], capture_output=True, text=True, env=env())
        print(
            f"{name}: {wall:.1f} s, {record.jobs_started} of {record.grid_jobs} jobs started, "
            f"worker-s {record.worker_s}, raydra compare exit {shown.returncode} (verdict shown: {'race of' in shown.stdout})"
        )
    print(f"same verdict: {verdict(whole_dir) == verdict(killed_dir)}; completed before the kill: {sorted(kept)}; ran again: {ran_again}")
    print(f"directories: {out}")


if __name__ == "__main__":
    main()
