"""The hang watchdog's meeting point: every worker's heartbeat comes here, a hang is declared here and
its stopped rank named, stragglers are found here, and the driver writes what was found into the
run directory as it comes (the workers' side: raydra.worker.watchdog).

    Watch       the workers' shared view of one fit: a Ray actor under Ray (every worker reaches it,
                on any node, without a shared disk), a plain object in local mode
    WatchLink   how a worker calls it, either way
    Watching    the driver's side: makes the Watch, writes <run>/diagnostics/ and the console lines
                from a thread as hangs and stragglers are found, and gives the record its findings
    RunHung     what a fit raises when a hang ended it (no failure.max_failures left)

Which rank stopped: each worker reports where it is as a position that only grows while it trains
(the step, the hook within the step, the batch within a validation). In a collective hang the rank
that stopped is the one furthest behind: the others went on to the next collective and wait there.
When every rank stands at the same place, none is behind the others, and all are named.

Stragglers: each worker reports when it reached each step's two meeting points: its backward (where
DDP reduces the gradients) and the end of its batch-end hooks (where the next step's collectives
begin). The first rank there is on time; a rank that arrives later, step after step, is the one the
others wait for. Comparing start times across nodes relies on their clocks agreeing (NTP keeps
them within about a millisecond; the lags that matter are a share of a step).
"""

import collections
import contextlib
import dataclasses
import logging
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from raydra.errors import RaydraError
from raydra.records import envelope, summary
from raydra.records.layout import hang_diagnostics
from raydra.records.ledger import Ledger, RankTime, Waited, read_buckets
from raydra.records.summary import Hang, StoppedRank, Straggler
from raydra.worker.time_spent import last_words

log = logging.getLogger("raydra")

# A rank whose heartbeats stop (its process stuck holding the GIL, or gone without Ray noticing yet)
# counts as stopped this long after its own deadline would have passed.
SILENT_MARGIN_S = 30.0
# How often the driver takes the Watch's news.
NEWS_EVERY_S = 2.0


class Watch:
    """Every worker's last heartbeat, this attempt's hang, and the stragglers found. One per fit; an
    attempt is one worker group (a restart after a failure starts the next)."""

    def __init__(self, straggler_threshold: float, straggler_window: int) -> None:
        self.threshold, self.window = straggler_threshold, straggler_window
        self.lock = threading.Lock()
        self.attempt = 0
        self.world_size = 0
        self.beats: Dict[int, Dict[str, Any]] = {}
        self.hangs: List[Dict[str, Any]] = []
        self._unsaid: List[Dict[str, Any]] = []
        self.pending: Dict[int, Dict[int, Tuple[Optional[float], float, int]]] = {}
        self.steps: List[Tuple[int, int, float, Dict[int, float]]] = []
        self.stragglers: Dict[int, Dict[str, Any]] = {}
        self.per_rank: Dict[int, Dict[str, float]] = {}
        self.deadlines: Dict[str, float] = {}
        # The compute ledger's figures: by attempt and rank, each worker's time as it last reported
        # it (raydra.worker.time_spent) and how long it waited for slower ranks.
        self.time: Dict[int, Dict[int, Dict[str, Any]]] = {}

    def register(self, rank: int, world_size: int, node: str, pid: int, deadline_s: float) -> int:
        """A worker starting (its start-up deadline `deadline_s`); returns its attempt. A rank already seen, or any start after a hang,
        means a new worker group: the next attempt, with nothing of the last carried over."""
        with self.lock:
            if self.hang is not None or rank in self.beats:
                self.attempt += 1
                self.beats, self.pending, self.steps = {}, {}, []
            self.world_size = world_size
            self.beats[rank] = {
                "node": node,
                "pid": pid,
                "seen": time.monotonic(),
                "position": [-1, 0, 0],
                "phase": "startup",
                "step": 0,
                "still_s": 0.0,
                "deadline_s": deadline_s,
            }
            return self.attempt

    def beat(self, rank: int, attempt: int, beat: Dict[str, Any]) -> Optional[int]:
        """A worker's heartbeat: where it is (`position`, `phase`, `step`), how long it has been
        still (`still_s`) against its deadline (`deadline_s`), and the steps it finished since the
        last (`steps`: [batch, global step, when it reached its backward, when it ended], wall clock). Returns this attempt's hang number once
        one is declared (then every worker keeps its stacks), else None."""
        with self.lock:
            if attempt != self.attempt:
                return None  # an earlier group's worker, on its way out
            spent = beat.pop("spent", None)
            self.beats[rank].update(beat, seen=time.monotonic())
            self.deadlines[beat["phase"]] = beat["deadline_s"]
            if spent:
                self._take_spent(rank, attempt, spent)
            self._take_steps(rank, beat.get("steps", ()))
            if self.hang is None and beat["still_s"] > beat["deadline_s"]:
                self._declare(rank, silent=())
            return self.hang["number"] if self.hang else None

    def spent(self, rank: int, attempt: int, spent: Dict[str, Any]) -> None:
        """A worker's time to its end (raydra.worker.watchdog.Watchdog.stop), for the compute ledger."""
        with self.lock:
            self._take_spent(rank, attempt, spent)

    def last_words(self, left: List[Dict[str, Any]]) -> None:
        """What killed workers left on their nodes (raydra.worker.time_spent.last_words): the end of
        the last step each finished, fresher than its last heartbeat."""
        with self.lock:
            for item in left:
                kept = self.time.get(item["attempt"], {}).get(item["rank"])
                if kept is None:
                    continue  # it never reported a first step: its attempt is the restart's
                known = kept.get("last_step")
                if not known or item["last_step"][0] > known[0]:
                    kept["last_step"] = item["last_step"]

    def _take_spent(self, rank: int, attempt: int, spent: Dict[str, Any]) -> None:
        kept = self._time_of(attempt, rank)
        saves = kept["saves"]
        kept.update({key: value for key, value in spent.items() if key != "saves"})
        for step, totals in spent.get("saves") or ():
            # The latest figures of a step's save (a preempted worker's save goes on until Ray takes it).
            saves[step] = totals
            # The rank's wait up to that step, if its steps have been matched with the others' by now.
            found = [waited for at, *waited in kept["waits"] if at == step]
            if found and step not in kept["waited_at_saves"]:
                kept["waited_at_saves"][step] = found[-1]

    def _time_of(self, attempt: int, rank: int) -> Dict[str, Any]:
        return self.time.setdefault(attempt, {}).setdefault(
            rank, {"saves": {}, "waited": [0.0, 0.0], "waited_at_saves": {}, "waits": collections.deque(maxlen=512)}
        )

    @property
    def hang(self) -> Optional[Dict[str, Any]]:
        """This attempt's hang, once declared."""
        return self.hangs[-1] if self.hangs and self.hangs[-1]["attempt"] == self.attempt else None

    def stacks(self, number: int, rank: int, text: str, flight: Optional[str]) -> None:
        """A worker's stacks (and torch's flight record of its collectives) for hang `number`."""
        with self.lock:
            for hang in self.hangs:
                if hang["number"] == number:
                    hang["stacks"].add(rank)
            self._unsaid.append({"kind": "stacks", "number": number, "rank": rank, "text": text, "flight": flight})

    def all_stacks(self, number: int) -> bool:
        """Whether every worker of the hung group has sent its stacks."""
        with self.lock:
            hang = next(h for h in self.hangs if h["number"] == number)
            return len(hang["stacks"]) >= hang["world_size"]

    def figures(self) -> Dict[int, Dict[str, float]]:
        """Per rank, over the last straggler window: its own step time (the run's step time less
        what it waited for the slowest rank) and how late it started its steps."""
        with self.lock:
            return dict(self.per_rank)

    def news(self) -> Dict[str, Any]:
        """What was found since the last call (the driver writes it down), after looking for silent
        ranks; and everything so far, for the record."""
        with self.lock:
            self._look_for_silence()
            news, self._unsaid = self._unsaid, []
            return {
                "news": news,
                "hangs": [{k: v for k, v in h.items() if k != "stacks"} for h in self.hangs],
                "attempt": self.attempt,
                "stragglers": list(self.stragglers.values()),
                "deadlines": dict(self.deadlines),
                "time": {a: {r: {k: v for k, v in t.items() if k != "waits"} for r, t in ranks.items()} for a, ranks in self.time.items()},
            }

    # -- hangs ------------------------------------------------------------------------------------

    def _look_for_silence(self) -> None:
        if self.hang is not None or len(self.beats) < self.world_size:
            return
        now = time.monotonic()
        # Silent: no heartbeat for longer than its deadline had left at its last one, and a margin.
        silent = [r for r, b in self.beats.items() if now - b["seen"] > b["deadline_s"] - b["still_s"] + SILENT_MARGIN_S]
        if silent:
            self._declare(silent[0], silent=silent)

    def _declare(self, rank: int, silent: Any) -> None:
        positions = {r: tuple(b["position"]) for r, b in self.beats.items()}
        # The ranks furthest behind; where every rank stands at the same place, that is all of them.
        behind = min(positions.values())
        stopped = sorted(set(silent) | {r for r, p in positions.items() if p == behind})
        now = time.monotonic()
        first = self.beats[stopped[0]]
        hang = {
            "number": len(self.hangs) + 1,
            "attempt": self.attempt,
            "world_size": self.world_size,
            "at": envelope.now(),
            "phase": first["phase"],
            "step": first.get("step"),
            "waited_s": round(max(self.beats[r]["still_s"] + now - self.beats[r]["seen"] for r in stopped), 1),
            "deadline_s": round(self.beats[rank]["deadline_s"], 1),
            "stopped": [
                {
                    "rank": r,
                    "node": self.beats[r]["node"],
                    "pid": self.beats[r]["pid"],
                    "phase": self.beats[r]["phase"],
                    "step": self.beats[r].get("step"),
                    "still_s": round(self.beats[r]["still_s"] + now - self.beats[r]["seen"], 1),
                }
                for r in stopped
            ],
            "stacks": set(),
        }
        self.hangs.append(hang)
        self._unsaid.append({"kind": "hang", "number": hang["number"]})

    # -- stragglers -------------------------------------------------------------------------------

    def _take_steps(self, rank: int, steps: Any) -> None:
        """Each rank's arrival at a step's two meeting points: its backward (where DDP's gradients
        are reduced: data and forward are behind it) and the end of its batch-end hooks (where the
        next step's collectives begin: the optimizer and every callback behind it). A rank's lag in
        a step is the later of its two arrivals after the first rank's."""
        for batch, step, backward_at, ended_at in steps:
            self.pending.setdefault(batch, {})[rank] = (backward_at, ended_at, step)
        complete = sorted(b for b, ranks in self.pending.items() if len(ranks) >= self.world_size)
        for batch in complete:
            ranks = self.pending.pop(batch)
            first = min(ended for _, ended, _ in ranks.values())
            backwards = [b for b, _, _ in ranks.values() if b is not None]
            first_backward = min(backwards) if len(backwards) == len(ranks) else None
            lags = {
                r: max(ended - first, backward - first_backward if first_backward is not None and backward is not None else 0.0)
                for r, (backward, ended, _) in ranks.items()
            }
            self.steps.append((batch, min(step for _, _, step in ranks.values()), first, lags))
            self._take_waits(lags, {r: ended for r, (_, ended, _) in ranks.items()}, {r: step for r, (_, _, step) in ranks.items()})
        # A rank that never reports a batch (an elastic group's resize) leaves it incomplete: forget it.
        if complete:
            for batch in [b for b in self.pending if b < complete[-1] - 1000]:
                del self.pending[batch]
        if self.world_size > 1 and len(self.steps) >= self.window:
            self._judge(self.steps)
            self.steps = []

    def _take_waits(self, lags: Dict[int, float], ends: Dict[int, float], steps: Dict[int, int]) -> None:
        """Each rank waited at this step's collectives for the slowest: the compute ledger's rank
        wait (raydra.records.ledger.Waited), and how much of it followed the step's end, where the
        next step's first collective waits for the rank that ended last."""
        slowest, last_end = max(lags.values()), max(ends.values())
        for rank, lag in lags.items():
            kept = self._time_of(self.attempt, rank)
            waited = slowest - lag
            total, between = kept["waited"]
            kept["waited"] = [total + waited, between + min(waited, last_end - ends[rank])]
            kept["waits"].append((steps[rank], *kept["waited"]))
            if steps[rank] in kept["saves"] and steps[rank] not in kept["waited_at_saves"]:
                kept["waited_at_saves"][steps[rank]] = list(kept["waited"])

    def _judge(self, steps: List[Tuple[int, int, float, Dict[int, float]]]) -> None:
        cycles = [(b[2] - a[2]) / (b[0] - a[0]) for a, b in zip(steps, steps[1:], strict=False) if b[0] > a[0]]
        if not cycles:
            return
        cycle = statistics.median(cycles)
        lags = {r: statistics.median(s[3].get(r, 0.0) for s in steps) for r in steps[-1][3]}
        slowest = max(lags.values())
        self.per_rank = {r: {"step_time_s": max(cycle - (slowest - lag), 0.0), "lag_s": lag} for r, lag in lags.items()}
        if self.threshold <= 0 or cycle <= 0:
            return
        for rank, lag in lags.items():
            if lag <= self.threshold * cycle:
                continue
            share = lag / cycle
            known = self.stragglers.get(rank)
            if known is None:
                known = self.stragglers[rank] = {
                    "rank": rank,
                    "node": self.beats.get(rank, {}).get("node"),
                    "first_step": steps[0][1],
                    "windows": 0,
                }
                self._unsaid.append({"kind": "straggler", "rank": rank})
            known.update(
                lag_s=round(lag, 4),
                step_time_s=round(cycle, 4),
                share=round(max(share, known.get("share") or 0), 3),
                last_step=steps[-1][1],
                windows=known["windows"] + 1,
            )


class WatchLink:
    """A worker's way to its run's Watch: a Ray actor's handle, or the Watch itself (local mode)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __call__(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        if isinstance(self.target, Watch):
            return getattr(self.target, method)(*args)
        import ray

        return ray.get(getattr(self.target, method).remote(*args), timeout=timeout)


class RunHung(RaydraError):
    """The watchdog found the run hung, and no restart was left: the run ended."""

    def __init__(self, findings: "Findings", ledger: Optional[Ledger] = None) -> None:
        super().__init__(findings.hangs[-1].sentence())
        self.findings, self.ledger = findings, ledger

    def ended(self, run: summary.RunRecord, started: float) -> summary.RunRecord:
        return run.hung(started=started, ledger=self.ledger, **self.findings.record_fields())


@dataclasses.dataclass(frozen=True)
class Findings:
    """What the watchdog found in one fit, as the record keeps it."""

    hangs: List[Hang]
    stragglers: List[Straggler]
    watchdog: Dict[str, Any]
    # The last worker group was ended by a hang: the fit's failure is that hang.
    ended_by_hang: bool
    # Each worker group's workers' time, for the compute ledger (raydra.records.ledger.run_ledger).
    attempts: List[List[RankTime]] = dataclasses.field(default_factory=list)

    def record_fields(self) -> Dict[str, Any]:
        """The run record's fields these findings fill (RunRecord.completed's and hung's)."""
        return {"hangs": self.hangs, "stragglers": self.stragglers, "watchdog": self.watchdog}


class Watching:
    """The driver's side of one fit's watchdog: makes the Watch (`link`, for the workers), writes
    what it finds as it comes, and `close` hands the findings over."""

    def __init__(self, failure: Any, run_dir: Path, local: bool, run_id: str = "") -> None:
        self.run_dir, self.local, self.run_id = Path(run_dir), local, run_id
        args = (failure.straggler_threshold, failure.straggler_window)
        if local:
            target: Any = Watch(*args)
        else:
            import ray

            # No CPU of the run's: it only takes heartbeats. Owned by this process, so it ends with the fit's driver.
            target = ray.remote(num_cpus=0, max_restarts=0)(Watch).remote(*args)
        self.link = WatchLink(target)
        self.settings = {key: getattr(failure, key) for key in WATCHDOG_KEYS}
        self.last: Dict[str, Any] = {"hangs": [], "stragglers": [], "attempt": 0, "deadlines": {}}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="raydra-watch", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.wait(NEWS_EVERY_S):
            self._take_news()

    def _take_news(self) -> None:
        try:
            taken = self.link("news", timeout=10.0)
        except Exception as error:  # the actor gone with Ray's shutdown: nothing more to take
            log.debug(f"the watchdog's news: {error}")
            return
        self.last = taken
        hangs = {h["number"]: h for h in taken["hangs"]}
        for item in taken["news"]:
            if item["kind"] == "hang":
                hang = _hang(hangs[item["number"]], None)
                log.warning(f"{hang.sentence()}; {self._after_hang()}")
            elif item["kind"] == "stacks":
                self._write_stacks(item)
            elif item["kind"] == "straggler":
                found = next(s for s in taken["stragglers"] if s["rank"] == item["rank"])
                log.warning(
                    f"straggler: rank {found['rank']} ({found['node']}) reaches each step's collectives {found['lag_s']:.3f} s after the "
                    f"first rank ({found['share']:.0%} of a {found['step_time_s']:.3f} s step) since step {found['first_step']}; "
                    "the others wait for it"
                )

    def _after_hang(self) -> str:
        if self.local:
            return "the run ends (local mode restarts nothing)"
        return "the worker group ends; failure.max_failures decides whether it restarts from the last checkpoint"

    def _write_stacks(self, item: Dict[str, Any]) -> None:
        folder = self.run_dir / hang_diagnostics(item["number"])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{item['rank']}.stacks.txt").write_text(item["text"])
        if item["flight"]:
            (folder / f"rank{item['rank']}.flight.json").write_text(item["flight"])

    def close(self) -> Findings:
        """Stop following; take the last news and return the findings (a restarted group's hangs
        marked so)."""
        self._stop.set()
        self._thread.join(timeout=30)
        # The last steps of this node's workers that were killed (on other nodes, the next group's
        # workers handed theirs over as they started).
        with contextlib.suppress(Exception):
            left = last_words(self.run_id)
            if left:
                self.link("last_words", left, timeout=10.0)
        self._take_news()
        if not self.local:
            import ray

            # A multirun's jobs and a notebook fit many times in one process: each fit's watch goes with it.
            with contextlib.suppress(Exception):
                ray.kill(self.link.target)
        last = self.last
        hangs = [_hang(h, "restarted" if h["attempt"] < last["attempt"] else "ended") for h in last["hangs"]]
        ended = bool(last["hangs"]) and last["hangs"][-1]["attempt"] == last["attempt"]
        known = {f.name for f in dataclasses.fields(Straggler)}
        stragglers = [Straggler(**{k: v for k, v in s.items() if k in known}) for s in last["stragglers"]]
        watchdog = {**self.settings, "deadlines_s": {phase: round(s, 1) for phase, s in sorted(last["deadlines"].items())}}
        return Findings(
            hangs=hangs, stragglers=stragglers, watchdog=watchdog, ended_by_hang=ended, attempts=rank_times(last.get("time", {}))
        )


# The failure.* keys that set the watchdog, recorded with the deadlines they gave the run.
WATCHDOG_KEYS = (
    "startup_timeout_s",
    "step_timeout_factor",
    "step_timeout_min_s",
    "checkpoint_timeout_s",
    "straggler_threshold",
    "straggler_window",
)


def _hang(found: Dict[str, Any], outcome: Optional[str]) -> Hang:
    stopped = [StoppedRank(**s) for s in found["stopped"]]
    return Hang(
        at=found["at"],
        phase=found["phase"],
        step=found["step"],
        waited_s=found["waited_s"],
        deadline_s=found["deadline_s"],
        stopped=stopped,
        diagnostics=hang_diagnostics(found["number"]),
        outcome=outcome,
    )


def rank_times(time_by_attempt: Dict[int, Dict[int, Dict[str, Any]]]) -> List[List[RankTime]]:
    """The Watch's figures as the ledger's RankTimes, attempt by attempt (an attempt whose workers
    never reached a step reported nothing and is left out: its time is the restart's)."""
    attempts = []
    for _, ranks in sorted(time_by_attempt.items()):
        times = []
        for rank, kept in sorted(ranks.items()):
            if kept.get("first_step_at") is None:
                continue
            last = kept.get("last_step") or [None, None, {}]
            times.append(
                RankTime(
                    rank=rank,
                    from_step=int(kept.get("from_step") or 0),
                    first_step_at=kept["first_step_at"],
                    restore_s=float(kept.get("restore_s") or 0.0),
                    totals=read_buckets(kept.get("totals") or {}),
                    last_step=last[0],
                    last_step_at=last[1],
                    at_last_step=read_buckets(last[2] or {}),
                    at_saves={int(step): read_buckets(totals) for step, totals in kept["saves"].items()},
                    waited=Waited(*kept["waited"]),
                    waited_at_saves={int(step): Waited(*w) for step, w in kept.get("waited_at_saves", {}).items()},
                )
            )
        if times:
            attempts.append(times)
    return attempts
