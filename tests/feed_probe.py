"""raydra's launcher's side of an asynchronous sweeper's feed (raydra.multirun.feed), simulated: the
sweepers' seam tests (tests/multirun/test_optuna_sweeper.py, test_race.py) run their feeds against
it, with jobs whose epochs come from a known curve, without Ray."""

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Set

from raydra.multirun.feed import JobEnd
from raydra.records.envelope import Status


@dataclass
class SimulatedLauncher:
    """raydra's launcher's side of a feed: `slots` jobs at a time, each epoch of each running job in
    turn; a job ends completed with its best value, or pruned when the feed asks. `lost_after`: the
    launcher is lost (the sweep's driver killed) once that many jobs have ended. `kept`: a resumed
    multirun's completed jobs by number, with their values: asked for again, each is told kept at
    once, as raydra's launcher does, and takes no slot."""

    curve: Callable[[List[str]], List[float]]
    slots: int = 2
    lost_after: int = 0
    kept: Dict[int, float] = field(default_factory=dict)
    # Jobs that fail at their first epoch's end (a bug in the config they run), by number.
    failing: Set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.asked: List[int] = []
        self.ended: List[JobEnd] = []

    def launch_as_slots_free(self, feed: Any) -> List[Any]:
        running: Dict[int, Any] = {}
        while True:
            while len(running) < self.slots:
                job = feed.next_job()
                if job is None:
                    break
                self.asked.append(job.num)
                if job.num in self.kept:
                    feed.job_ended(JobEnd(num=job.num, status=Status.KEPT, value=self.kept[job.num]))
                    continue
                running[job.num] = (job, self.curve(job.overrides), 0)
            if not running:
                return []
            for num, (job, values, epoch) in list(running.items()):
                if num in self.failing:
                    del running[num]
                    end = JobEnd(num=num, status=Status.FAILED, error="ValueError: boom")
                    feed.job_ended(end)
                    self.ended.append(end)
                    continue
                reason = feed.epoch_ended(num, epoch, values[epoch])
                if reason is not None or epoch == len(values) - 1:
                    status = Status.PRUNED if reason is not None else Status.COMPLETED
                    end = JobEnd(num=num, status=status, value=values[epoch] if reason else max(values))
                    del running[num]
                    feed.job_ended(end)
                    self.ended.append(end)
                    if self.lost_after and len(self.ended) >= self.lost_after:
                        raise SystemExit(137)
                else:
                    running[num] = (job, values, epoch + 1)


@dataclass
class Returned:
    """What a Hydra launcher's launch returns for a job (a JobReturn), as much as a sweeper reads."""

    return_value: Any
    status: Any = type("Completed", (), {"name": "COMPLETED"})()


@dataclass
class BatchLauncher:
    """A launcher with only Hydra's batch API (the basic launcher, submitit): each batch's jobs
    complete with their curve's best value; `batches` records (first job number, size)."""

    curve: Callable[[List[str]], List[float]]

    def __post_init__(self) -> None:
        self.batches: List[tuple] = []

    def launch(self, overrides: List[List[str]], initial_job_idx: int) -> List[Returned]:
        self.batches.append((initial_job_idx, len(overrides)))
        return [Returned(max(self.curve(o))) for o in overrides]
