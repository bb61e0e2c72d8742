"""The seed race's statistics (hydra/sweeper=race): which configurations a race has beaten beyond
noise, which job it wants next, and its verdict. Only numpy and scipy: the race's feed
(raydra.multirun.race) and its simulation (benchmarks/race.py, tests/multirun/test_race_statistics.py) run
this same code.

    Race         the state of one race: the results so far, the looks taken, what it wants run next
    Look         what one look decided: its level, the leader, each contender's comparison with it
    Comparison   one configuration against the leader at a look: difference, CI, adjusted p

**Looks at levels.** The race looks at its results only at levels: level n is taken once every
configuration still in contention has its first n seeds' results (n = min_seeds ... max_seeds), and
uses those n alone, though a configuration may have more by then (a freed slot starts the next
seed before the level is complete). What a look decides is thus a function of the table of results
alone, never of which job happened to end first: a resumed race reaches the verdict the
uninterrupted one would, and the looks are a fixed schedule of at most max_seeds - min_seeds + 1,
over which `alpha` is spent (Bonferroni: alpha / looks at each, so that the chance of any false
drop over all the looks stays within alpha however they are correlated).

**The test at a look.** Seeds are shared: seed value i is the same for every configuration, so the
results form a configurations x seeds table, fit by an additive model (configuration + seed): what a
seed does to every configuration alike (the initialisation, the data order) leaves the comparison,
as pairing does. The residual variance is pooled over the contenders, (k-1)(n-1) degrees of
freedom; each pair's difference of means is tested with Student's t, two-sided. **Holm over every
pair of contenders** (k(k-1)/2 tests), not only over the comparisons with the leader: the leader is
chosen by the same data, and the leader and the last of k equal configurations differ by the range
of k draws, which a test of one pair calls significant more often the more configurations race
(measured, benchmarks/race.py --leader-only, all equal: 4.2% of races at k=3 and 4, 6.0% at 6,
9.1% at 10, against 1.9-3.2% with every pair). A configuration is dropped when a contender better than it
differs from it beyond noise; the race ends when one contender is left (decided) or the level
max_seeds has been looked at (the others undecided against the leader within max_seeds).

**Out of reach.** A test beyond noise at 2 or 3 seeds needs gaps of 5-8 residual sds, so without
more a race keeps nearly every configuration to max_seeds (experiments/race.md: 57-99% of the grid's
jobs). What a race is for, though, is the winner the full grid would name; a configuration that
cannot realistically end max_seeds ahead of the leader need not run there. At each look before the
last, each remaining contender's chance of ending the grid ahead of the leader is its predictive
probability under the same fit (flat prior on the difference, the residual variance's Student t):
the difference of the max_seeds-seed means is the look's difference plus the mean of the seeds not
yet run, so P(overtake) = T_df(-advantage / (se * sqrt(1 - n / max_seeds))). Below `futility` the
configuration leaves as *out of reach*: no difference is claimed for it (alpha is not spent), and
the chance that the grid's winner is lost this way is at most futility per configuration dropped (a
configuration is the grid's winner only if it ends ahead of the leader). futility=0 keeps only drops
beyond noise.
"""

import itertools
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

# A job of the race: (configuration index, seed index).
Cell = Tuple[int, int]


@dataclass(frozen=True)
class Comparison:
    """One configuration against the leader at a look: `advantage` is how much better the leader's
    mean is, in the metric's own units (so never negative), with its two-sided (1 - alpha) CI, not
    widened for the looks; `p` is Holm-adjusted over the look's pairs and scaled by the look's share of alpha, so that it
    is comparable with alpha itself: dropped iff p <= alpha (against the leader or another
    better contender)."""

    config: int
    advantage: float
    ci: Tuple[float, float]
    p: float
    # Its chance of ending max_seeds ahead of the leader (predictive; None at the look at max_seeds).
    overtake: Optional[float] = None


@dataclass(frozen=True)
class Look:
    level: int
    contenders: List[int]
    leader: int
    # Each contender but the leader against it.
    comparisons: Dict[int, Comparison]
    # Beaten beyond noise by a better contender.
    dropped: List[int]
    means: Dict[int, float]
    # Not beaten beyond noise, but with less than `futility` chance of ending max_seeds ahead of the leader.
    out_of_reach: List[int] = field(default_factory=list)


@dataclass
class Race:
    """One race's state. `configs` configurations, seeds 0 .. max_seeds-1 each; `maximize` says
    which way is better. Feed it results (`record`), ask it what to run (`wanted`)."""

    configs: int
    min_seeds: int = 2
    max_seeds: int = 5
    alpha: float = 0.05
    futility: float = 0.1
    maximize: bool = True
    results: Dict[Cell, float] = field(default_factory=dict)
    looks: List[Look] = field(default_factory=list)
    contenders: List[int] = field(default_factory=list)
    # Where the race was stopped without a verdict of its own (a job that failed: its seed's
    # result is missing, and no later level can be taken without it).
    stopped: Optional[str] = None

    def __post_init__(self) -> None:
        if not self.contenders:
            self.contenders = list(range(self.configs))

    # -- what it wants -------------------------------------------------------------------------

    @property
    def level(self) -> int:
        """The next level to look at."""
        return self.looks[-1].level + 1 if self.looks else self.min_seeds

    @property
    def done(self) -> bool:
        return self.stopped is not None or len(self.contenders) <= 1 or self.level > self.max_seeds

    @property
    def decided(self) -> bool:
        """Done, and the winner beat every other beyond noise: none out of reach or undecided."""
        return self.stopped is None and len(self.contenders) == 1 and not any(look.out_of_reach for look in self.looks)

    def wanted(self, taken: "set[Cell]") -> List[Cell]:
        """The jobs worth running now that are not in `taken` (asked for already), most useful
        first: the seeds the next level needs, then, so that no slot waits for a level to
        complete, the following seeds of the contenders least likely to be dropped (the leader,
        then the closest to it, by the results so far)."""
        if self.done:
            return []
        order = self._by_closeness()
        cells = [(c, i) for i in range(self.level) for c in order]
        cells += [(c, i) for i in range(self.level, self.max_seeds) for c in order]
        return [cell for cell in cells if cell not in taken and cell not in self.results]

    def _by_closeness(self) -> List[int]:
        """The contenders by their mean over every result they have so far (not only the last
        look's: the order only decides which job runs first), best first; those without any last."""
        sign = 1.0 if self.maximize else -1.0

        def mean(c: int) -> float:
            values = [value for (config, _), value in self.results.items() if config == c]
            return -sign * sum(values) / len(values) if values else math.inf

        return sorted(self.contenders, key=mean)

    # -- what it is told -----------------------------------------------------------------------

    def record(self, cell: Cell, value: float) -> List[Look]:
        """A job's result; returns the looks it made possible (none, or one level after another)."""
        self.results[cell] = float(value)
        taken = []
        while not self.done and all((c, i) in self.results for c in self.contenders for i in range(self.level)):
            taken.append(self._look())
        return taken

    def _look(self) -> Look:
        level, k = self.level, len(self.contenders)
        table = [[self.results[(c, i)] for i in range(level)] for c in self.contenders]
        look_alpha = self.alpha_at(level)
        means, se, df = _additive_fit(table)
        sign = 1.0 if self.maximize else -1.0
        order = sorted(range(k), key=lambda j: -sign * means[j])
        leader = order[0]
        # Every pair's two-sided p, Holm-adjusted over the k(k-1)/2 pairs.
        pairs = list(itertools.combinations(range(k), 2))
        raw = {pair: _two_sided_p(means[pair[0]] - means[pair[1]], se, df) for pair in pairs}
        adjusted = _holm(raw)
        beaten = set()
        for (a, b), p in adjusted.items():
            if p <= look_alpha:
                beaten.add(b if sign * (means[a] - means[b]) > 0 else a)
        t_crit = _t_quantile(1 - self.alpha / 2, df) if df > 0 else math.inf
        comparisons = {}
        out_of_reach = []
        for j in order[1:]:
            advantage = sign * (means[leader] - means[j])
            # Its chance to end max_seeds ahead: what the seeds still to run add to the difference
            # exceeds its advantage (the docstring's predictive; none at the last look).
            overtake = _beyond(advantage, se * math.sqrt(1 - level / self.max_seeds), df) if level < self.max_seeds else None
            comparisons[self.contenders[j]] = Comparison(
                config=self.contenders[j],
                advantage=advantage,
                ci=(advantage - t_crit * se, advantage + t_crit * se),
                p=min(1.0, adjusted[(min(leader, j), max(leader, j))] * self.alpha / look_alpha),
                overtake=overtake,
            )
            if j not in beaten and overtake is not None and overtake < self.futility:
                out_of_reach.append(self.contenders[j])
        look = Look(
            level=level,
            contenders=list(self.contenders),
            leader=self.contenders[leader],
            comparisons=comparisons,
            dropped=[self.contenders[j] for j in sorted(beaten)],
            means={self.contenders[j]: means[j] for j in range(k)},
            out_of_reach=sorted(out_of_reach),
        )
        self.looks.append(look)
        self.contenders = [c for c in self.contenders if c not in look.dropped and c not in look.out_of_reach]
        return look

    def alpha_at(self, level: int) -> float:
        """The share of alpha spent at the look at `level`: half at the first (where a drop saves
        the most jobs: max_seeds - min_seeds of them), the rest evenly over the others."""
        later = self.max_seeds - self.min_seeds
        if later == 0:
            return self.alpha
        return self.alpha / 2 if level == self.min_seeds else self.alpha / 2 / later

    # -- the verdict ---------------------------------------------------------------------------

    @property
    def leader(self) -> Optional[int]:
        """The winner once done (the best mean of the last look, or the one contender left)."""
        if len(self.contenders) == 1:
            return self.contenders[0]
        return self.looks[-1].leader if self.looks else None

    def outcome_of(self, config: int) -> Tuple[str, Optional[Look]]:
        """("winner" | "dropped" | "out of reach" | "undecided" | "racing", the look that decided it or
        the last one it was in)."""
        last = None
        for look in self.looks:
            if config in look.contenders:
                last = look
            if config in look.dropped:
                return "dropped", look
            if config in look.out_of_reach:
                return "out of reach", look
        if self.done and config == self.leader:
            return "winner", last
        return ("undecided" if self.done else "racing"), last

    def seeds_of(self, config: int) -> List[int]:
        return sorted(i for c, i in self.results if c == config)


def _additive_fit(table: List[List[float]]) -> Tuple[List[float], float, int]:
    """Means of each row (configuration) of a complete k x n table, the standard error of a
    difference of two of them under configuration + seed effects, and its degrees of freedom."""
    import numpy as np

    x = np.asarray(table, dtype=float)
    k, n = x.shape
    residual = x - x.mean(axis=1, keepdims=True) - x.mean(axis=0, keepdims=True) + x.mean()
    df = (k - 1) * (n - 1)
    variance = float((residual**2).sum()) / df if df > 0 else math.inf
    return [float(m) for m in x.mean(axis=1)], math.sqrt(variance * 2 / n), df


def _two_sided_p(diff: float, se: float, df: int) -> float:
    return min(1.0, 2 * _beyond(abs(diff), se, df))


def _beyond(distance: float, scale: float, df: int) -> float:
    """P(scale * T > distance), T Student's t on `df` degrees of freedom: 1 where nothing is known
    of the noise (no df, an infinite scale), a step where there is none."""
    # Student's t CDF itself (scipy.stats.t.sf gives the same p for ~50x the time: 85% of a
    # simulated race's, benchmarks/race.py).
    from scipy.special import stdtr

    if df <= 0 or not math.isfinite(scale):
        return 1.0
    if scale == 0.0:
        return 0.0 if distance > 0 else 1.0
    return float(stdtr(df, -distance / scale))


def _t_quantile(q: float, df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(q, df))


def _holm(raw: Dict[Tuple[int, int], float]) -> Dict[Tuple[int, int], float]:
    """Holm's step-down adjusted p-values (monotone, at most 1)."""
    m = len(raw)
    adjusted: Dict[Tuple[int, int], float] = {}
    running = 0.0
    for rank, (pair, p) in enumerate(sorted(raw.items(), key=lambda item: item[1])):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[pair] = running
    return adjusted
