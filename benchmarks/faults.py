"""What a fault costs a run: a worker killed early, midway and late, a killed driver resumed, a lost node.

    python benchmarks/faults.py [--epochs 6] [--cpus 2] [--only preemption|elastic]

Every run is the digits ViT (experiment=vit_digits_smoke, seed 0, 2 CPU workers, no test split)
for --epochs epochs, on one `ray start --head` cluster that all of them join (stopped by process
id at the end), so none pays Ray's start. Each fault is injected half an epoch after the epoch
line it waits for, so it lands mid-epoch, after that epoch's checkpoint:

- worker kill (early, middle, late): SIGKILL of one RayTrainWorker, with failure.max_failures=1;
  once more in the middle with checkpoint.every_n_steps=10 (checkpoints inside the epoch);
- driver kill: SIGKILL of `python train.py`, then the same command with resume=latest;
- node removal: on a ray.cluster_utils.Cluster of a 0-CPU head and three 1-CPU nodes, with
  scale.placement_strategy=SPREAD, the node of one worker is removed; compared with an
  uninterrupted run on the same kind of cluster.

`--only preemption`: a worker's SIGTERM (a preemption notice: it checkpoints at that step) against
its SIGKILL at the same point, with the default checkpoint every epoch; for each, the steps trained
twice (completed before the fault, after the step the restart resumed from) and the extra wall time.

`--only elastic`: node loss with an elastic group (scale.num_workers=[1,2]) against a fixed one
(2 workers), each on a fresh ray.cluster_utils.Cluster of a 0-CPU head and two 1-CPU nodes; the
node of one worker is removed half an epoch into the middle epoch, and a replacement node joins
--replace-after seconds later. See elastic_rows.

For each: whether the run completed, epochs lost or repeated (an epoch missing from metrics.csv's
validation rows or there twice, or a final global step other than the uninterrupted run's), the
final val/acc against the uninterrupted run's, and the extra wall time. Prints a markdown table.
"""

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep import env  # noqa: E402

from raydra.testing import free_port, start_ray_head, stop_process_tree  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORKER = re.compile(r"\(RayTrainWorker pid=(\d+)")


class Run:
    """`python train.py` in the background, its console lines timestamped as they come."""

    def __init__(self, out: Path, *overrides: str, extra_env: dict = None) -> None:
        self.out = out
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "train.py"), *overrides],
            cwd=REPO,
            env={**env(), **(extra_env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip()))

    def wait_for_epoch(self, epoch: int, epochs: int) -> float:
        while True:
            for at, line in self.lines:
                if f"epoch {epoch}/{epochs} " in line:
                    return at
            if self.proc.poll() is not None:
                sys.exit(f"the run ended before epoch {epoch}:\n" + "\n".join(line for _, line in self.lines[-40:]))
            time.sleep(0.1)

    def finish(self, timeout: float = 1200) -> float:
        self.proc.wait(timeout=timeout)
        time.sleep(0.5)  # the reader thread's last lines
        return time.time() - self.started

    def run_dir(self) -> Path:
        (found,) = [p.parent for p in self.out.glob("runs/*/*/summary.json")]
        return found

    def worker_pids(self) -> list:
        log = self.run_dir() / "logs" / "ray.log"
        while True:
            pids = list(dict.fromkeys(map(int, WORKER.findall(log.read_text() if log.exists() else ""))))
            if pids:
                return pids
            time.sleep(0.2)


def outcome(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    val_epochs = [int(r["epoch"]) for r in rows if r.get("val/acc")]
    return {
        "status": summary["status"],
        "global_step": summary.get("global_step"),
        "val_epochs": val_epochs,
        "val_acc": summary.get("metrics", {}).get("final", {}).get("val/acc"),
    }


def row(name: str, fault: dict, baseline: dict, fault_s: float, baseline_s: float, epochs: int) -> str:
    counts = {e: fault["val_epochs"].count(e) for e in range(epochs)}
    lost = sum(1 for c in counts.values() if c == 0)
    repeated = sum(c - 1 for c in counts.values() if c > 1) + sum(1 for e in fault["val_epochs"] if e not in counts)
    step_ok = fault["global_step"] == baseline["global_step"]
    completed = "yes" if fault["status"] == "completed" else f"no ({fault['status']})"
    steps = f"{fault['global_step']}" + ("" if step_ok else f" (uninterrupted: {baseline['global_step']})")
    acc = "-" if fault["val_acc"] is None else f"{fault['val_acc']:.4f} ({fault['val_acc'] - baseline['val_acc']:+.4f})"
    return f"| {name} | {completed} | {lost} / {repeated} | {steps} | {acc} | {fault_s:.1f} | {fault_s - baseline_s:+.1f} |"


def worker_kill(out: Path, common: list, epochs: int, after_epoch: int, epoch_s: float, *extra: str) -> tuple:
    run = Run(out, *common, "failure.max_failures=1", *extra)
    run.wait_for_epoch(after_epoch, epochs)
    time.sleep(epoch_s / 2)
    os.kill(run.worker_pids()[0], signal.SIGKILL)
    wall = run.finish()
    return outcome(run.run_dir()), wall


def logged_steps_completed(run_dir: Path) -> int:
    """Optimizer steps completed by now, from metrics.csv flushed every step (a row is labelled with
    the step count before it)."""
    path = run_dir / "metrics.csv"
    steps = [int(r["step"]) for r in csv.DictReader(path.open()) if r.get("step")] if path.exists() else []
    return max(steps, default=-1) + 1


def resumed_step(run_dir: Path) -> int:
    found = re.search(r"resumed from .* \(global step (\d+)\)", (run_dir / "logs" / "worker_0.log").read_text())
    return int(found.group(1)) if found else 0


def worker_signal(out: Path, common: list, epochs: int, after_epoch: int, epoch_s: float, signum: int) -> tuple:
    """One RayTrainWorker gets `signum` half an epoch after `after_epoch` began; returns the outcome,
    the wall time and the steps trained twice (completed before the signal, after the step resumed from)."""
    run = Run(out, *common, "failure.max_failures=1", *EVERY_STEP_LOGGED)
    run.wait_for_epoch(after_epoch, epochs)
    time.sleep(epoch_s / 2)
    pid = run.worker_pids()[0]
    completed = logged_steps_completed(run.run_dir())
    os.kill(pid, signum)
    wall = run.finish()
    return outcome(run.run_dir()), wall, max(0, completed - resumed_step(run.run_dir()))


# metrics.csv written at every step, so the steps completed at the moment of a fault can be read.
EVERY_STEP_LOGGED = ("trainer.log_every_n_steps=1", "logger.csv.flush_logs_every_n_steps=1")


def preemption_rows(address: str, root: Path, common: list, epochs: int) -> list:
    """A preemption notice (SIGTERM) against an unannounced kill (SIGKILL) of the same worker at the
    same point, half an epoch after the middle epoch began, with the default checkpoint every epoch."""
    common = [*common, f"ray.address={address}"]
    base_out = root / "preemption_baseline"
    base_run = Run(base_out, f"paths.outputs={base_out}", *common, *EVERY_STEP_LOGGED)
    base_s = base_run.finish()
    base = outcome(base_run.run_dir())
    lines = dict((line.split()[1], at) for at, line in base_run.lines if re.search(r"^epoch \d+/", line.strip()))
    epoch_s = (lines[f"{epochs}/{epochs}"] - lines[f"1/{epochs}"]) / (epochs - 1)
    print(f"uninterrupted: {base_s:.1f} s, {epoch_s:.1f} s an epoch", file=sys.stderr)
    rows = [preemption_row("none (uninterrupted)", base, base, 0, base_s, base_s)]
    after = epochs // 2
    for name, signum in (("SIGTERM (preemption notice)", signal.SIGTERM), ("SIGKILL (no notice)", signal.SIGKILL)):
        out = root / f"preemption_{signum}"
        result, wall, twice = worker_signal(out, [f"paths.outputs={out}", *common], epochs, after, epoch_s, signum)
        rows.append(preemption_row(f"worker {name}, epoch {after + 1}", result, base, twice, wall, base_s))
        print(rows[-1], file=sys.stderr)
    return rows


def preemption_row(name: str, fault: dict, baseline: dict, twice: int, fault_s: float, baseline_s: float) -> str:
    completed = "yes" if fault["status"] == "completed" else f"no ({fault['status']})"
    acc = "-" if fault["val_acc"] is None else f"{fault['val_acc']:.4f} ({fault['val_acc'] - baseline['val_acc']:+.4f})"
    return f"| {name} | {completed} | {twice} | {fault['global_step']} | {acc} | {fault_s:.1f} | {fault_s - baseline_s:+.1f} |"


def driver_kill(out: Path, common: list, epochs: int, after_epoch: int, epoch_s: float) -> tuple:
    run = Run(out, *common)
    run.wait_for_epoch(after_epoch, epochs)
    time.sleep(epoch_s / 2)
    run.proc.send_signal(signal.SIGKILL)
    first = run.finish()
    resumed = Run(out, *common, "resume=latest")
    second = resumed.finish()
    if resumed.proc.returncode:
        print("\n".join(line for _, line in resumed.lines[-30:]), file=sys.stderr)
    return outcome(run.run_dir()), first + second


def node_of(cluster, pid: int):
    import psutil

    parents = {p.pid for p in psutil.Process(pid).parents()}
    return next(n for n in [cluster.head_node, *cluster.worker_nodes] if n.all_processes["raylet"][0].process.pid in parents)


def node_runs(out: Path, common: list, epochs: int, after_epoch: int, epoch_s: float) -> tuple:
    """An uninterrupted SPREAD run and one that loses a worker's node, each on a fresh 3-node cluster."""
    from ray.cluster_utils import Cluster

    results = []
    for remove in (False, True):
        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 0, "gcs_server_port": free_port(), "dashboard_port": free_port()}
        )
        try:
            for _ in range(3):
                cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            target = out / ("node_removed" if remove else "node_baseline")
            run = Run(
                target,
                f"paths.outputs={target}",
                *common,
                f"ray.address={cluster.address}",
                "scale.placement_strategy=SPREAD",
                "failure.max_failures=1",
                # Cluster's nodes, started from this process, expect no auth token.
                extra_env={"RAY_AUTH_MODE": "disabled"},
            )
            if remove:
                run.wait_for_epoch(after_epoch, epochs)
                time.sleep(epoch_s / 2)
                ray_log = (run.run_dir() / "logs" / "ray.log").read_text()
                controller = re.search(r"\(TrainController pid=(\d+)", ray_log)
                spared = node_of(cluster, int(controller.group(1))) if controller else None
                victim = next(node_of(cluster, pid) for pid in run.worker_pids() if node_of(cluster, pid) is not spared)
                cluster.remove_node(victim, allow_graceful=False)
            wall = run.finish()
            results.append((outcome(run.run_dir()), wall))
        finally:
            cluster.shutdown()
    return results


def elastic_run(out: Path, common: list, epochs: int, after_epoch: int, lose: bool, replace_after: float, *scale: str) -> dict:
    """One run on a fresh cluster (0-CPU head, two 1-CPU nodes); with `lose`, the node of a worker
    that does not hold Ray Train's controller is removed half an epoch after `after_epoch` ends, and
    a replacement joins `replace_after` seconds later."""
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="raye-")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "gcs_server_port": free_port(), "dashboard_port": free_port(), "temp_dir": temp_dir},
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        run = Run(
            out,
            f"paths.outputs={out}",
            *common,
            f"ray.address={cluster.address}",
            "failure.max_failures=3",
            "scale.resize_check_s=5",
            *scale,
            extra_env={"RAY_AUTH_MODE": "disabled"},
        )
        lost_at = None
        if lose:
            previous = run.wait_for_epoch(after_epoch - 1, epochs)
            epoch_end = run.wait_for_epoch(after_epoch, epochs)
            lines_before = len(run.lines)
            time.sleep(max(0.0, epoch_end + (epoch_end - previous) / 2 - time.time()))
            controller = re.search(r"\(TrainController pid=(\d+)", (run.run_dir() / "logs" / "ray.log").read_text())
            spared = node_of(cluster, int(controller.group(1))) if controller else None
            victim = next(node_of(cluster, pid) for pid in run.worker_pids() if node_of(cluster, pid) is not spared)
            lost_at = time.time()
            cluster.remove_node(victim, allow_graceful=False)
            while time.time() < lost_at + replace_after and run.proc.poll() is None:
                time.sleep(0.2)
            cluster.add_node(num_cpus=1)
        wall = run.finish()
        result = outcome(run.run_dir())
        result["wall_s"] = wall
        if lose:
            # The first epoch finished after the loss: training was going again by then.
            after = [at for at, line in run.lines[lines_before:] if re.search(r"^epoch \d+/", line.strip()) and at > lost_at]
            result["resumed_s"] = (after[0] - lost_at) if after else None
        rows = list(csv.DictReader((run.run_dir() / "metrics.csv").open()))
        result["rates"] = [
            (float(r.get("train/world_size") or 2), float(r["train/samples_per_s"])) for r in rows if r.get("train/samples_per_s")
        ]
        summary = json.loads((run.run_dir() / "summary.json").read_text())
        result["resizes"] = [(r["from"], r["to"]) for r in summary.get("resizes", [])]
        return result
    finally:
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def elastic_rows(root: Path, common: list, epochs: int, replace_after: float) -> list:
    """Node loss, elastic ([1,2]) against fixed (2) size. Columns: time from the loss to the first
    epoch finished after it; total wall time; mean train/samples_per_s of the epochs trained on the
    node left (a fixed group trains none: it waits for the replacement) and of the full-size epochs."""
    after = epochs // 2
    runs = [
        ("none, fixed 2 workers (uninterrupted)", False, "scale.num_workers=2"),
        ("node loss, fixed 2 workers", True, "scale.num_workers=2"),
        ("node loss, elastic [1,2]", True, "scale.num_workers=[1,2]"),
    ]
    rows = []
    for name, lose, scale in runs:
        out = root / re.sub(r"\W+", "_", name)
        r = elastic_run(out, [f"paths.outputs={out}", *common], epochs, after, lose, replace_after, scale)
        counts = {e: r["val_epochs"].count(e) for e in range(epochs)}
        lost = sum(1 for c in counts.values() if c == 0)
        repeated = sum(c - 1 for c in counts.values() if c > 1)
        one = [rate for size, rate in r["rates"] if size == 1]
        full = [rate for size, rate in r["rates"] if size == 2]
        mean = lambda xs: f"{sum(xs) / len(xs):.0f}" if xs else "0"  # noqa: E731
        resumed = "-" if r.get("resumed_s") is None else f"{r['resumed_s']:.1f}"
        resizes = ", ".join(f"{a}->{b}" for a, b in r["resizes"]) or "-"
        rows.append(
            f"| {name} | {r['status']} | {lost} / {repeated} | {r['global_step']} | {resumed} | {r['wall_s']:.1f} | "
            f"{mean(one) if lose else '-'} | {mean(full)} | {resizes} |"
        )
        print(rows[-1], file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--only", choices=["all", "preemption", "elastic"], default="all", help="run only this comparison")
    parser.add_argument("--replace-after", type=float, default=30.0, help="--only elastic: seconds from a node's loss to its replacement")
    args = parser.parse_args()
    epochs = args.epochs
    if args.only == "elastic":
        root = Path(tempfile.mkdtemp(prefix="raydra-faults-bench-"))
        common = ["experiment=vit_digits_smoke", f"trainer.max_epochs={epochs}", "trainer.test=false", "seed=0", "checkpoint.num_to_keep=1"]
        rows = elastic_rows(root, common, epochs, args.replace_after)
        print(
            f"digits ViT, {epochs} epochs, seed 0; a worker's node lost half an epoch after epoch {epochs // 2} ends, "
            f"a replacement node joins {args.replace_after:.0f} s later; run directories under {root}\n"
        )
        print(
            "| run | status | epochs lost / repeated | global step | loss -> next epoch done s | wall s "
            "| samples/s on the node left | samples/s at 2 workers | resizes |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---|")
        print("\n".join(rows))
        return

    root = Path(tempfile.mkdtemp(prefix="raydra-faults-bench-"))
    common = ["experiment=vit_digits_smoke", f"trainer.max_epochs={epochs}", "trainer.test=false", "seed=0", "checkpoint.num_to_keep=1"]
    rows = []
    if args.only == "preemption":
        proc, address = start_ray_head(root / "ray_start.log", env(), num_cpus=args.cpus)
        try:
            rows = preemption_rows(address, root, common, epochs)
        finally:
            stop_process_tree(proc)
        print(f"digits ViT, {epochs} epochs, 2 CPU workers, seed 0, a checkpoint every epoch; run directories under {root}\n")
        print("| fault | completed | steps trained twice | global step | final val/acc (vs uninterrupted) | wall s | extra wall s |")
        print("|---|---|---:|---:|---:|---:|---:|")
        print("\n".join(rows))
        return
    proc, address = start_ray_head(root / "ray_start.log", env(), num_cpus=args.cpus)
    try:

        def on_cluster(name: str) -> tuple:
            out = root / name
            return out, [f"paths.outputs={out}", *common, f"ray.address={address}"]

        out, overrides = on_cluster("baseline")
        base_run = Run(out, *overrides)
        base_s = base_run.finish()
        base = outcome(base_run.run_dir())
        lines = dict((line.split()[1], at) for at, line in base_run.lines if re.search(r"^epoch \d+/", line.strip()))
        epoch_s = (lines[f"{epochs}/{epochs}"] - lines[f"1/{epochs}"]) / (epochs - 1)
        rows.append(row("none (uninterrupted)", base, base, base_s, base_s, epochs))
        print(f"uninterrupted: {base_s:.1f} s, {epoch_s:.1f} s an epoch", file=sys.stderr)

        for name, after in (("early", 1), ("middle", epochs // 2), ("late", epochs - 1)):
            out, overrides = on_cluster(f"worker_{name}")
            result, wall = worker_kill(out, overrides, epochs, after, epoch_s)
            rows.append(row(f"worker SIGKILL, {name} (epoch {after + 1})", result, base, wall, base_s, epochs))
            print(rows[-1], file=sys.stderr)
        out, overrides = on_cluster("worker_steps")
        result, wall = worker_kill(out, overrides, epochs, epochs // 2, epoch_s, "checkpoint.every_n_steps=10")
        rows.append(
            row(f"worker SIGKILL, middle (epoch {epochs // 2 + 1}), checkpoint.every_n_steps=10", result, base, wall, base_s, epochs)
        )
        print(rows[-1], file=sys.stderr)
        out, overrides = on_cluster("driver")
        result, wall = driver_kill(out, overrides, epochs, epochs // 2, epoch_s)
        rows.append(row(f"driver SIGKILL (epoch {epochs // 2 + 1}), then resume=latest", result, base, wall, base_s, epochs))
        print(rows[-1], file=sys.stderr)
    finally:
        stop_process_tree(proc)

    (node_base, node_base_s), (node_fault, node_s) = node_runs(root, common, epochs, epochs // 2, epoch_s)
    rows.append(row("none, 3-node cluster, SPREAD (uninterrupted)", node_base, node_base, node_base_s, node_base_s, epochs))
    rows.append(row(f"node removal (epoch {epochs // 2 + 1}), 3-node cluster, SPREAD", node_fault, node_base, node_s, node_base_s, epochs))

    print(
        f"digits ViT, {epochs} epochs, 2 CPU workers, seed 0; faults half an epoch after the epoch shown began "
        f"(one epoch: {epoch_s:.1f} s); run directories under {root}\n"
    )
    print("| fault | completed | epochs lost / repeated | global step | final val/acc (vs uninterrupted) | wall s | extra wall s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
