"""What raydra costs: the same model on the same data trained four ways, in one table.

    python benchmarks/overhead.py [--epochs 10] [--repeats 3]
    python benchmarks/overhead.py --watchdog-cost [--epochs 10] [--repeats 3]

--watchdog-cost: raydra with its hang watchdog (the default) against failure.watchdog=false, 1 and 2
workers, in rounds as above: what the watchdog costs a steady run (its goal: at most 1%).

Ways: a plain PyTorch loop, plain Lightning in one process, Ray Train + Lightning written by hand
as Ray's guide does (the floor under raydra's start-up: Ray and Ray Train alone), raydra in local
mode (the same worker function in the driver's process, no Ray), with 1 worker and with 2 workers. Every way trains the digits ViT with 32 samples per worker per step on 1 CPU thread per
worker, so steady-state samples/s per worker is like for like. Start-up is launch to first
training step; the goal is per-worker steady throughput within 10% of plain Lightning.

A shared machine's speed drifts by more than the gap being measured, so the ways run in rounds
(every way once per round) and the table reports each way's median over the rounds, with the
ratio to Lightning taken within each round and its range shown.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The default run's model (model/vit.yaml on data=digits).
MODEL = dict(
    image_size=8, num_channels=1, num_classes=10, patch_size=2, hidden_size=64, num_layers=4, num_heads=4, mlp_size=128, conv_stem=[32, 32]
)
OPTIMIZER = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3, "weight_decay": 0.05}
BATCH, WARMUP = 32, 5
FLOOR = "Ray Train + Lightning by hand, 1 worker"


def plain_torch(epochs: int, launched: float) -> dict:
    import torch

    from raydra.data.digits import DigitsDataModule
    from raydra.models.vit import ViTClassifier

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = DigitsDataModule(batch_size=BATCH)
    data.setup()
    model = ViTClassifier(optimizer=OPTIMIZER, **MODEL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    first_step_at, steps, samples, seconds = None, 0, 0, 0.0
    for _ in range(epochs):
        tick = time.perf_counter()
        for images, labels in data.train_dataloader():
            first_step_at = first_step_at or time.time()
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            tock = time.perf_counter()
            steps += 1
            if steps > WARMUP:
                samples, seconds = samples + len(labels), seconds + tock - tick
            tick = tock
    return {"startup_s": first_step_at - launched, "samples_per_s": samples / seconds, "workers": 1}


def plain_lightning(epochs: int, launched: float) -> dict:
    return lightning_fit(epochs, launched, devices=1)


def lightning_fit(epochs: int, launched: float, ray_train: bool = False, **trainer_args) -> dict:
    """The digits ViT trained by Lightning's Trainer, in this process or (`ray_train`) as a Ray
    Train worker with Ray's strategy and environment, as Ray's Lightning guide writes it."""
    import torch

    from raydra.data.digits import DigitsDataModule
    from raydra.lightning import pl
    from raydra.models.vit import ViTClassifier
    from raydra.worker.throughput import Throughput

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    throughput = Throughput(world_size=1)
    if ray_train:
        from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment

        trainer_args = dict(devices="auto", strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()])
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[throughput],
        **trainer_args,
    )
    if ray_train:
        from ray.train.lightning import prepare_trainer

        trainer = prepare_trainer(trainer)
    trainer.fit(ViTClassifier(optimizer=OPTIMIZER, **MODEL), datamodule=DigitsDataModule(batch_size=BATCH))
    summary = throughput.summary()
    return {"startup_s": summary["first_step_at"] - launched, "samples_per_s": summary["samples_per_s"], "workers": 1}


def ray_train_lightning(epochs: int, launched: float) -> dict:
    """The stack raydra stands on, written by hand as Ray's Lightning guide does: a local Ray,
    TorchTrainer, one worker, RayDDPStrategy and RayLightningEnvironment, prepare_trainer. Its
    start-up is the floor under raydra's on the same machine: what Ray and Ray Train cost before
    any of raydra's own work."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def train_func(config: dict) -> None:
        Path(config["out"]).write_text(json.dumps(lightning_fit(config["epochs"], config["launched"], ray_train=True)))

    with tempfile.TemporaryDirectory() as storage:
        ray.init(include_dashboard=False, log_to_driver=False)
        out = Path(storage) / "throughput.json"
        TorchTrainer(
            train_func,
            train_loop_config={"epochs": epochs, "launched": launched, "out": str(out)},
            scaling_config=ScalingConfig(num_workers=1, use_gpu=False),
            run_config=RunConfig(storage_path=storage, name="floor"),
        ).fit()
        return json.loads(out.read_text())


def raydra(epochs: int, workers: int, *extra: str) -> dict:
    with tempfile.TemporaryDirectory() as outputs:
        launched = time.time()
        subprocess.run(
            [
                sys.executable,
                "train.py",
                f"paths.outputs={outputs}",
                f"scale.num_workers={workers}",
                f"data.batch_size={BATCH * max(1, workers)}",
                f"trainer.max_epochs={epochs}",
                "trainer.test=false",
                "logger=none",
                *extra,
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        wall = time.time() - launched
        (summary_file,) = Path(outputs).glob("runs/*/*/summary.json")
        summary = json.loads(summary_file.read_text())
        throughput = summary["throughput"]
    return {
        "startup_s": throughput["first_step_at"] - launched,
        "samples_per_s": throughput["samples_per_s"],
        "workers": max(1, workers),
        "wall_s": wall,
        # Where the time to the first step went (summary.json's startup, raydra.run.startup).
        "phases": {p["phase"]: p["s"] for p in summary["startup"]["phases"]},
    }


def in_subprocess(way: str, epochs: int) -> dict:
    launched = time.time()
    out = subprocess.run(
        [sys.executable, __file__, "--way", way, "--epochs", str(epochs), "--launched", str(launched)],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["wall_s"] = time.time() - launched
    return result


def watchdog_parts() -> None:
    """What the watchdog adds, part by part, measured directly (a shared machine's run-to-run noise
    is larger than the cost itself): the training thread's marks per step (every hook of a batch),
    and one heartbeat to a Ray actor (serialising, the call, the reply: the whole process's CPU, Ray's
    threads included) from the worker's thread."""
    import types

    import ray

    from raydra.run.hang_watch import Watch, WatchLink
    from raydra.worker.watchdog import Heartbeat, Progress

    failure = types.SimpleNamespace(startup_timeout_s=900.0, step_timeout_factor=20.0, step_timeout_min_s=90.0, checkpoint_timeout_s=600.0)
    progress = Progress(failure)
    heartbeat = Heartbeat(progress, None, 2)
    tail = heartbeat.tail()
    trainer = types.SimpleNamespace(global_step=0)
    per_step = []
    for _ in range(5):
        steps = 20000
        tick = time.perf_counter()
        for i in range(steps):
            trainer.global_step = i
            heartbeat.on_train_batch_start(trainer, None, None, i)
            heartbeat.on_before_backward(trainer, None, None)
            heartbeat.on_after_backward(trainer, None)
            heartbeat.on_before_optimizer_step(trainer, None, None)
            heartbeat.on_train_batch_end(trainer, None, None, None, i)
            tail.on_train_batch_end(trainer, None, None, None, i)
            if len(progress.steps) > 1000:
                progress.steps.clear()
        per_step.append((time.perf_counter() - tick) / steps)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        link = WatchLink(ray.remote(num_cpus=0)(Watch).remote(0.2, 50))
        link("register", 0, 1, "node", 1, 900.0)
        beat = {"phase": "train", "step": 1, "position": [1, 5, 0], "still_s": 0.01, "deadline_s": 90.0}
        for _ in range(20):
            link("beat", 0, 0, {**beat, "steps": [(1, 1, time.time(), time.time())]})
        cpu, wall, beats = time.process_time(), time.perf_counter(), 200
        for i in range(beats):
            # A second's steps of a 15 ms step, as the thread sends them.
            link("beat", 0, 0, {**beat, "steps": [(j, j, time.time(), time.time()) for j in range(i * 66, i * 66 + 66)]})
        beat_cpu, beat_wall = (time.process_time() - cpu) / beats, (time.perf_counter() - wall) / beats
    finally:
        ray.shutdown()
    marks = statistics.median(per_step)
    print("| part | cost | share of a 15 ms CPU step (this benchmark's) | share of a 100 ms GPU step |")
    print("|---|---:|---:|---:|")
    print(f"| the marks of one step (6 hooks), training thread | {marks * 1e6:.1f} us | {marks / 0.015:.3%} | {marks / 0.1:.4%} |")
    print(
        f"| one heartbeat a second (66 steps' times), watchdog thread (the process's CPU) | {beat_cpu * 1e3:.2f} ms CPU ({beat_wall * 1e3:.2f} ms wall) | "
        f"{beat_cpu:.3%} of a core | {beat_cpu:.3%} of a core |"
    )


def watchdog_cost(epochs: int, repeats: int) -> None:
    """Steady samples/s with the hang watchdog against without it, paired within each round."""
    watchdog_parts()
    print()
    ways = {
        (workers, on): (lambda w=workers, o=on: raydra(epochs, w, f"failure.watchdog={str(o).lower()}"))
        for workers in (1, 2)
        for on in (True, False)
    }
    rounds = []
    for i in range(repeats):
        rounds.append({key: run() for key, run in ways.items()})
        print(f"round {i + 1}/{repeats}: " + ", ".join(f"{k} {r['samples_per_s']:.0f}" for k, r in rounds[-1].items()), file=sys.stderr)
    print(f"digits ViT, {epochs} epochs, {BATCH} samples/worker/step, 1 CPU thread per worker, median of {repeats} rounds\n")
    print("| workers | samples/s, watchdog on | samples/s, off | on vs off (range over rounds) |")
    print("|---:|---:|---:|---:|")
    for workers in (1, 2):
        on = [r[(workers, True)]["samples_per_s"] for r in rounds]
        off = [r[(workers, False)]["samples_per_s"] for r in rounds]
        ratios = [a / b for a, b in zip(on, off, strict=True)]
        print(
            f"| {workers} | {statistics.median(on):.0f} | {statistics.median(off):.0f} | "
            f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--way")
    parser.add_argument("--launched", type=float)
    parser.add_argument("--watchdog-cost", action="store_true")
    args = parser.parse_args()
    if args.way:
        print(
            json.dumps(
                {"plain_torch": plain_torch, "plain_lightning": plain_lightning, "ray_train_lightning": ray_train_lightning}[args.way](
                    args.epochs, args.launched
                )
            )
        )
        return
    if args.watchdog_cost:
        watchdog_cost(args.epochs, args.repeats)
        return
    ways = {
        "plain PyTorch loop": lambda: in_subprocess("plain_torch", args.epochs),
        "plain Lightning": lambda: in_subprocess("plain_lightning", args.epochs),
        FLOOR: lambda: in_subprocess("ray_train_lightning", args.epochs),
        "raydra, local mode (scale.num_workers=0)": lambda: raydra(args.epochs, 0),
        "raydra, 1 worker": lambda: raydra(args.epochs, 1),
        "raydra, 2 workers": lambda: raydra(args.epochs, 2),
    }
    rounds = []
    for i in range(args.repeats):
        rounds.append({name: run() for name, run in ways.items()})
        print(
            f"round {i + 1}/{args.repeats}: "
            + ", ".join(f"{name} {r['samples_per_s'] / r['workers']:.0f}" for name, r in rounds[-1].items()),
            file=sys.stderr,
        )
    print(f"digits ViT, {args.epochs} epochs, {BATCH} samples/worker/step, 1 CPU thread per worker, median of {args.repeats} rounds\n")
    print(
        "| way | start-up s | start-up vs Lightning (range) | vs Ray Train by hand | steady samples/s | per worker | "
        "per worker vs Lightning (range) | wall s | wall vs Lightning |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in ways:
        ratio, low, high = _median(rounds, name, "samples_per_s", per_worker=True, vs_lightning=True)
        start, start_low, start_high = _median(rounds, name, "startup_s", vs_lightning=True)
        floor = statistics.median(r[name]["startup_s"] / r[FLOOR]["startup_s"] for r in rounds)
        print(
            f"| {name} | {_median(rounds, name, 'startup_s')[0]:.1f} | {start:.2f}x ({start_low:.2f}-{start_high:.2f}) | {floor:.2f}x | "
            f"{_median(rounds, name, 'samples_per_s')[0]:.0f} | "
            f"{_median(rounds, name, 'samples_per_s', per_worker=True)[0]:.0f} | {ratio:.2f}x ({low:.2f}-{high:.2f}) | "
            f"{_median(rounds, name, 'wall_s')[0]:.1f} | {_median(rounds, name, 'wall_s', vs_lightning=True)[0]:.2f}x |"
        )
    two = "raydra, 2 workers"
    print(f"\nwhere {two}' time to its first step goes (summary.json's startup; median of {args.repeats}; process start = 0)\n")
    print("| phase | s |")
    print("|---|---:|")
    for phase in rounds[0][two]["phases"]:
        print(f"| {phase} | {statistics.median(r[two]['phases'].get(phase, 0.0) for r in rounds):.1f} |")
    print(f"| **to the first step** | {_median(rounds, two, 'startup_s')[0]:.1f} |")


def _median(rounds: list, name: str, key: str, per_worker: bool = False, vs_lightning: bool = False) -> tuple:
    """(median, min, max) of one way's figure over the rounds; a ratio is taken within each round."""
    values = []
    for r in rounds:
        value = r[name][key] / (r[name]["workers"] if per_worker else 1)
        values.append(value / r["plain Lightning"][key] if vs_lightning else value)
    return statistics.median(values), min(values), max(values)


if __name__ == "__main__":
    main()
