"""A ViT that writes down which training samples each worker got, for tests that check sharding,
a callback that holds a run at its last epoch until the test lets it finish, and one that writes
down where each worker listens.

Workers import it as `tests.probe` (Ray puts the driver's working directory, the repository, on
their path). Each worker appends one fingerprint per training sample to
<run dir>/seen/rank<r>_epoch<e>_ws<world size>.txt; distinct images give distinct fingerprints, so
a sample seen twice in an epoch or by two workers shows as a repeat. The world size tells the
worker groups of an elastic run apart.
"""

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Optional

from raydra.data.digits import DigitsDataModule
from raydra.lightning import pl
from raydra.models.vit import ViTClassifier


class RecordingViT(ViTClassifier):
    """`pause_s`: each training step takes at least this long, so that a test's run trains for a
    time it can count on whatever the machine's speed (a SLURM time limit's warning comes on
    SLURM's clock, not the run's). `pause_until`: a file whose existence ends the pauses, so the
    rest of a run the test is done waiting for trains at full speed."""

    def __init__(self, *args, pause_s: float = 0.0, pause_until: Optional[str] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.pause_s = pause_s
        self.pause_until = pause_until

    def on_train_batch_start(self, batch, batch_idx):
        if not (self.pause_until and Path(self.pause_until).exists()):
            time.sleep(self.pause_s)
        images, _ = batch
        folder = Path(self.trainer.default_root_dir) / "seen"
        folder.mkdir(exist_ok=True)
        name = f"rank{self.trainer.global_rank}_epoch{self.current_epoch}_ws{self.trainer.world_size}.txt"
        with open(folder / name, "a") as file:
            for image in images.detach().cpu().numpy().round(4):
                file.write(hashlib.sha1(image.tobytes()).hexdigest() + "\n")


class HoldLastEpoch(pl.Callback):
    """Holds the run at the start of its last epoch until the file `release` exists. A test that
    does things to a running run (loses a node, adds one, signals it) needs it still training then,
    whatever the machine's speed: without a hold that took a margin of epochs (40 for the elastic
    runs), most of them trained after the test was done with it (~110 s of 230 on a slow day)."""

    def __init__(self, release: str):
        self.release = release

    def on_train_epoch_start(self, trainer, pl_module):
        while trainer.current_epoch >= trainer.max_epochs - 1 and not os.path.exists(self.release):
            time.sleep(0.2)


class Listening(pl.Callback):
    """Writes, on each worker as fit starts (the process group is up: rank 0 serves its rendezvous
    store), where this worker's process listens: <run dir>/listening/rank<r>.json with the node's
    address Ray gave it, MASTER_ADDR and MASTER_PORT (the store's), and every (address, port) it
    listens on."""

    def on_fit_start(self, trainer, pl_module):
        import json

        import psutil
        import ray

        listening = sorted({(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN})
        seen = {"node": ray.util.get_node_ip_address(), "master": [os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])]}
        folder = Path(trainer.default_root_dir) / "listening"
        folder.mkdir(exist_ok=True)
        (folder / f"rank{trainer.global_rank}.json").write_text(json.dumps({**seen, "listening": listening}))


class StepTimes(pl.Callback):
    """Writes down, on each worker, when each training step started and ended: lines of
    "<pid> start|end <global step> <wall time>" in <run dir>/steps/rank<r>.txt (appended by every
    attempt, each its own pid). What a test compares the compute ledger's lost work with: the steps
    a killed group took after its checkpoint, timed by the worker itself."""

    def _write(self, trainer, kind, step):
        folder = Path(trainer.default_root_dir) / "steps"
        folder.mkdir(exist_ok=True)
        with open(folder / f"rank{trainer.global_rank}.txt", "a") as file:
            file.write(f"{os.getpid()} {kind} {step} {time.time()}\n")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._write(trainer, "start", trainer.global_step + 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._write(trainer, "end", trainer.global_step)


def step_times(run_dir, pid):
    """{"start": {step: time}, "end": {step: time}} of the worker process `pid`, from StepTimes' files."""
    out = {"start": {}, "end": {}}
    for path in Path(run_dir, "steps").glob("rank*.txt"):
        for line in path.read_text().splitlines():
            who, kind, step, at = line.split()
            if int(who) == pid:
                out[kind][int(step)] = float(at)
    return out


def seen_per_epoch(run_dir, world_size=None):
    """{epoch: {rank: [fingerprints]}} from a finished run (of the groups of `world_size` workers only, if given)."""
    out = {}
    for path in sorted(Path(run_dir, "seen").glob("rank*_epoch*_ws*.txt")):
        rank, epoch, size = (int(part[len(prefix) :]) for part, prefix in zip(path.stem.split("_"), ("rank", "epoch", "ws")))
        if world_size in (None, size):
            out.setdefault(epoch, {}).setdefault(rank, []).extend(path.read_text().split())
    return out


class Stall(pl.Callback):
    """A researcher's bug, on rank `rank`: blocks forever at `where` (batch_end: after training step
    `step`; save: inside a checkpoint save) the first time there, or every time without `once` (a
    file written as it blocks, so a restarted group runs through). With `sleep_s`, rank `slow_rank`
    sleeps that long after every step instead: a straggler."""

    def __init__(
        self, rank: int = 1, step: int = 20, where: str = "batch_end", once: Optional[str] = None, slow_rank: int = -1, sleep_s: float = 0.0
    ):
        self.rank, self.step, self.where, self.once, self.slow_rank, self.sleep_s = rank, step, where, once, slow_rank, sleep_s

    def _stall(self, trainer):
        if trainer.global_rank != self.rank or (self.once and os.path.exists(self.once)):
            return
        if self.once:
            Path(self.once).write_text(str(os.getpid()))
        threading.Event().wait()  # forever

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == self.slow_rank:
            time.sleep(self.sleep_s)
        if self.where == "batch_end" and trainer.global_step == self.step:
            self._stall(trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self.where == "save" and trainer.global_step >= self.step:
            self._stall(trainer)


class StallInSetup(DigitsDataModule):
    """The digits, whose setup blocks forever on rank `rank` (a data loader stuck on a network filesystem)."""

    def __init__(self, *args, rank: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.rank = rank

    def setup(self, stage=None):
        if self.trainer is not None and self.trainer.global_rank == self.rank:
            threading.Event().wait()  # forever
        super().setup(stage)
