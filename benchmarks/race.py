"""The seed race's statistics (raydra.multirun.racing.Race) under a simulated launcher: how often a
race picks the full grid's winner, what share of the grid's jobs it runs, and how often it declares
a difference where there is none.

    python benchmarks/race.py [--races 1000] [--null-races 2000] [--min-seeds 2] [--max-seeds 5]
                              [--alpha 0.05] [--futility 0.1] [--slots 2] [--seed 0] [--equal 3 4 6]
                              [--gaps G ...] [--only NAME ...] [--leader-only]

No Ray, no training: a stand-in job draws its metric from a known distribution. Each race draws a
configurations x seeds table, value[c][i] = mu[c] + seed[i] + noise, seed[i] ~ N(0, sd_seed) shared
by every configuration (seed value i is the same for all), noise ~ N(0, sd_noise); the full grid's
winner is the best max_seeds-seed mean of that same table. The race runs under `run_race`, a
`slots`-slot asynchronous launcher: a freed slot starts `race.wanted(taken)[0]`, a job lasts
uniform(0.8, 1.2), its end records its value if its configuration is still a contender and the race
is not done, and the running jobs of a dropped configuration (or of a finished race) are stopped
(they count as started). tests/multirun/test_race_statistics.py runs races through the same
`run_race`.

Per scenario (each stated in the output): races; agreement with the grid's winner; jobs started as
a share of the grid's (mean, and counting completed jobs only); worker time as a share of the
grid's (a stopped job counts the time it ran); wall time as a share of the grid's on the same slots;
races that ended with one contender left; the rate at which a truly best configuration was dropped
beyond noise (under all-equal or a tie for best, a false difference), with its binomial standard
error; the rate at which one left as out of reach (no difference claimed); the mean regret (true
mean of the grid's winner minus the race's, in noise sds); seconds.

`--leader-only` swaps Holm over every pair for Holm over the leader's k-1 comparisons only (a
subclass of Race), to show why the race tests every pair: under all-equal the leader is the best
of k draws and its comparisons reject far more often than alpha.
"""

import argparse
import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Set

import numpy as np

from raydra.multirun import racing
from raydra.multirun.racing import Cell, Look, Race

# The measured lr grid (experiments/race.md, 2026-11-28): the digits ViT smoke preset, 3 epochs,
# 1 worker, lr 1e-4, 3e-4, 1e-3, 3e-3, seeds 42-46; best val/acc per job. Means per lr, and the
# configuration + seed fit's seed and residual sds (gaps of 0.5-1.1 residual sds).
MEASURED_MEANS = (0.6807, 0.7704, 0.7215, 0.6644)
MEASURED_SD_SEED = 0.0285
MEASURED_SD_NOISE = 0.0968


@dataclass
class RaceRun:
    """What one race cost under the simulated launcher."""

    started: int
    completed: int
    # The time jobs ran, a stopped one's up to its stop.
    worker: float
    wall: float
    # The cells in the order their results were recorded.
    recorded: List[Cell]


def run_race(race: Race, table: np.ndarray, slots: int, rng: np.random.Generator) -> RaceRun:
    """Run `race` to its end on `slots` simulated slots, each job's value read from `table[c][i]`."""
    clock = 0.0
    running: Dict[Cell, float] = {}
    began: Dict[Cell, float] = {}
    taken: Set[Cell] = set()
    started = completed = 0
    worker = 0.0
    recorded: List[Cell] = []

    def fill() -> None:
        nonlocal started
        while len(running) < slots:
            wanted = race.wanted(taken)
            if not wanted:
                return
            cell = wanted[0]
            taken.add(cell)
            running[cell] = clock + rng.uniform(0.8, 1.2)
            began[cell] = clock
            started += 1

    fill()
    while running:
        cell = min(running, key=running.__getitem__)
        clock = running.pop(cell)
        completed += 1
        worker += clock - began[cell]
        if not race.done and cell[0] in race.contenders:
            race.record(cell, float(table[cell]))
            recorded.append(cell)
        for other in [c for c in running if race.done or c[0] not in race.contenders]:
            del running[other]
            worker += clock - began[other]
        fill()
    if not race.done:
        raise RuntimeError(f"the race wants nothing more but is not done: {race.looks}")
    return RaceRun(started=started, completed=completed, worker=worker, wall=clock, recorded=recorded)


def draw_table(mu: np.ndarray, seeds: int, sd_seed: float, sd_noise: float, rng: np.random.Generator) -> np.ndarray:
    """value[c][i] = mu[c] + seed[i] + noise: configuration + seed, seed effect shared by every row."""
    return mu[:, None] + rng.normal(0.0, sd_seed, seeds)[None, :] + rng.normal(0.0, sd_noise, (len(mu), seeds))


class LeaderOnlyRace(Race):
    """The race with Holm over the leader's k-1 comparisons instead of every pair (and no out-of-reach
    drops, whatever --futility says): a configuration is
    dropped when the leader beats it beyond noise. Invalid (the leader is chosen by the same data);
    here to be measured against."""

    def _look(self) -> Look:
        level, k = self.level, len(self.contenders)
        table = [[self.results[(c, i)] for i in range(level)] for c in self.contenders]
        look_alpha = self.alpha_at(level)
        means, se, df = racing._additive_fit(table)
        sign = 1.0 if self.maximize else -1.0
        order = sorted(range(k), key=lambda j: -sign * means[j])
        leader = order[0]
        raw = {(leader, j): racing._two_sided_p(means[leader] - means[j], se, df) for j in order[1:]}
        adjusted = racing._holm(raw)
        beaten = sorted(j for (_, j), p in adjusted.items() if p <= look_alpha)
        look = Look(
            level=level,
            contenders=list(self.contenders),
            leader=self.contenders[leader],
            comparisons={},
            dropped=[self.contenders[j] for j in beaten],
            means={self.contenders[j]: means[j] for j in range(k)},
        )
        self.looks.append(look)
        self.contenders = [c for c in self.contenders if c not in look.dropped]
        return look


@dataclass(frozen=True)
class Scenario:
    name: str
    # What it is, in words, for the output.
    says: str
    # All configurations equal: run --null-races races of it.
    equal: bool
    sd_seed: float
    sd_noise: float
    # The configurations' true means for one race (fixed, or drawn per race).
    means: Callable[[np.random.Generator], np.ndarray]


def scenarios(equal: List[int], gaps: List[float]) -> List[Scenario]:
    """The default set, and a fixed-gap scenario per `gaps`. Gaps are stated in residual (noise) sds: the seed effect cancels in the
    configuration + seed fit, so what a gap of g sds costs depends on g alone."""
    measured = np.asarray(MEASURED_MEANS)
    fixed = [
        Scenario(
            "measured-lr",
            f"(a) the measured lr grid: means {', '.join(f'{m:.4f}' for m in measured)}, "
            f"sd_seed {MEASURED_SD_SEED:.4f}, sd_noise {MEASURED_SD_NOISE:.4f}",
            False,
            MEASURED_SD_SEED,
            MEASURED_SD_NOISE,
            lambda rng: measured,
        )
    ]
    for k in equal:
        fixed.append(
            Scenario(f"equal-{k}", f"(b) {k} equal configurations, sd_seed 1, sd_noise 1", True, 1.0, 1.0, lambda rng, k=k: np.zeros(k))
        )
    fixed.append(
        Scenario(
            "two-best",
            "(c) 4 configurations: two equal best, two 3 and 6 sds worse; sd_seed 1, sd_noise 1",
            False,
            1.0,
            1.0,
            lambda rng: np.array([0.0, 0.0, -3.0, -6.0]),
        )
    )
    fixed.append(
        Scenario(
            "lr-curve",
            "(d1) an lr grid of 5 values a factor 3 apart: mu = -c (x - x*)^2 in grid steps x, the optimum x* "
            "uniform over the grid, c uniform(1, 4) sds (one step off the optimum costs 1-4 sds, two steps 4-16); sd_seed 1, sd_noise 1",
            False,
            1.0,
            1.0,
            lambda rng: -rng.uniform(1.0, 4.0) * (np.arange(5) - rng.uniform(0.0, 4.0)) ** 2,
        )
    )
    fixed.append(
        Scenario(
            "wide-lr",
            "(d2) a coarse lr grid of 4 values a factor 10 apart, trained to convergence: mu = -c (x - x*)^2, x* uniform over "
            "the grid, c uniform(5, 15) sds (one step off the optimum costs 5-15 sds); sd_seed 1, sd_noise 1",
            False,
            1.0,
            1.0,
            lambda rng: -rng.uniform(5.0, 15.0) * (np.arange(4) - rng.uniform(0.0, 3.0)) ** 2,
        )
    )
    fixed.append(
        Scenario(
            "close-archs",
            "(d3) 4 architectures whose means are drawn N(0, 1 sd) per race: gaps of the order of the noise; sd_seed 1, sd_noise 1",
            False,
            1.0,
            1.0,
            lambda rng: rng.normal(0.0, 1.0, 4),
        )
    )
    fixed.append(
        Scenario(
            "few-good",
            "(d4) 6 configurations: 2 good ones drawn N(0, 1 sd), 4 broken ones 5-20 sds worse (uniform); sd_seed 1, sd_noise 1",
            False,
            1.0,
            1.0,
            lambda rng: np.concatenate([rng.normal(0.0, 1.0, 2), -rng.uniform(5.0, 20.0, 4)]),
        )
    )
    for g in gaps:
        fixed.append(
            Scenario(
                f"gap-{g:g}",
                f"4 configurations evenly spread: means 0, -{g:g}, -{2 * g:g}, -{3 * g:g} sds; sd_seed 1, sd_noise 1",
                False,
                1.0,
                1.0,
                lambda rng, g=g: -g * np.arange(4.0),
            )
        )
    return fixed


def grid_of(jobs: int, slots: int, rng: np.random.Generator) -> "tuple[float, float]":
    """The full grid's worker time and wall time on the same slots and job durations: a freed slot takes the next job."""
    ends = np.zeros(slots)
    durations = rng.uniform(0.8, 1.2, jobs)
    for duration in durations:
        ends[np.argmin(ends)] += duration
    return float(durations.sum()), float(ends.max())


def measure(scenario: Scenario, races: int, args: argparse.Namespace, rng: np.random.Generator) -> dict:
    kind = LeaderOnlyRace if args.leader_only else Race
    started = time.perf_counter()
    agree = jobs = completed = decided = best_dropped = best_out = 0
    regret = worker = wall = 0.0
    grid_jobs = grid_worker = grid_wall = 0.0
    for _ in range(races):
        mu = scenario.means(rng)
        table = draw_table(mu, args.max_seeds, scenario.sd_seed, scenario.sd_noise, rng)
        race = kind(configs=len(mu), min_seeds=args.min_seeds, max_seeds=args.max_seeds, alpha=args.alpha, futility=args.futility)
        run = run_race(race, table, args.slots, rng)
        grid_winner = int(np.argmax(table.mean(axis=1)))
        agree += race.leader == grid_winner
        jobs += run.started
        completed += run.completed
        worker += run.worker
        wall += run.wall
        grid_jobs += table.size
        grid = grid_of(table.size, args.slots, rng)
        grid_worker += grid[0]
        grid_wall += grid[1]
        decided += len(race.contenders) == 1
        best = set(np.flatnonzero(mu >= mu.max() - 1e-12).tolist())
        best_dropped += any(c in best for look in race.looks for c in look.dropped)
        best_out += any(c in best for look in race.looks for c in look.out_of_reach)
        regret += (mu[grid_winner] - mu[race.leader]) / scenario.sd_noise
    rate = best_dropped / races
    return {
        "name": scenario.name,
        "races": races,
        "agree": agree / races,
        "jobs": jobs / grid_jobs,
        "completed": completed / grid_jobs,
        "worker": worker / grid_worker,
        "wall": wall / grid_wall,
        "decided": decided / races,
        "best_dropped": rate,
        "se": math.sqrt(rate * (1 - rate) / races),
        "best_out": best_out / races,
        "regret": regret / races,
        "seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--races", type=int, default=1000, help="races per scenario with a real difference")
    parser.add_argument("--null-races", type=int, default=2000, help="races per all-equal scenario")
    parser.add_argument("--min-seeds", type=int, default=2)
    parser.add_argument("--max-seeds", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--futility", type=float, default=0.1, help="out of reach below this chance of overtaking (0: off)")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--equal", type=int, nargs="+", default=[3, 4, 6], help="the all-equal scenarios' numbers of configurations")
    parser.add_argument(
        "--gaps", type=float, nargs="+", default=[], help="add a scenario of 4 configurations g, 2g, 3g sds behind the best, per g"
    )
    parser.add_argument("--only", nargs="+", help="scenario names (default: all)")
    parser.add_argument("--leader-only", action="store_true", help="Holm over the leader's comparisons only")
    args = parser.parse_args()

    every = scenarios(args.equal, args.gaps)
    chosen = [s for s in every if not args.only or s.name in args.only]
    if not chosen:
        sys.exit(f"--only: no such scenario; the scenarios are {', '.join(s.name for s in every)}")
    rng = np.random.default_rng(args.seed)
    test = "Holm over the leader's comparisons only (--leader-only)" if args.leader_only else "Holm over every pair"
    print(
        f"{test}; min_seeds {args.min_seeds}, max_seeds {args.max_seeds}, alpha {args.alpha}, futility {args.futility}, "
        f"{args.slots} slots, seed {args.seed}\n"
    )
    for scenario in chosen:
        print(f"- {scenario.name}: {scenario.says}")
    print()
    print(
        "| scenario | races | same winner as the grid | jobs started / grid's | completed / grid's | worker time / grid's | wall / grid's "
        "| one left | best dropped beyond noise (+- se) | best out of reach | regret (sds) | s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    total = time.perf_counter()
    for scenario in chosen:
        m = measure(scenario, args.null_races if scenario.equal else args.races, args, rng)
        print(
            f"| {m['name']} | {m['races']} | {m['agree']:.1%} | {m['jobs']:.1%} | {m['completed']:.1%} | {m['worker']:.1%} | {m['wall']:.1%} "
            f"| {m['decided']:.1%} | {m['best_dropped']:.2%} +- {m['se']:.2%} | {m['best_out']:.1%} | {m['regret']:.3f} | {m['seconds']:.1f} |",
            flush=True,
        )
    print(f"\n{time.perf_counter() - total:.1f} s in all")


if __name__ == "__main__":
    main()
