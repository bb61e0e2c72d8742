"""`raydra compare --cost` and `raydra show`'s ledger: what runs cost, read from summary.json's
`ledger`, and what a sweep or multirun spent, from sweep.json's and jobs.json's (raydra.records.ledger).

    Target / parse_target   --target METRIC>=VALUE (also <=, >, <)
    Prices / parse_prices   --price-per-hour, --price-per-gpu-hour, --price-per-cpu-hour and the
                            environment's RAYDRA_PRICE_PER_HOUR (the default of --price-per-hour)
    CostView / cost_view    each run's figures, the columns they add to the table, a seed group's
                            sums, and the lines that say what the columns mean

(cost_text: a sweep's or multirun's own figures after the table, and `raydra show`'s ledger.)

A run's hours are its ledger's allocated worker-seconds (workers x wall, GPU-seconds where it used
GPUs) in hours; its goodput is productive / allocated; a bucket's share is its seconds over the
allocated. A run whose record has no ledger (written before raydra kept one) has blank figures.

Hours to a target are an attribution, not a measurement: metrics.csv has no clock. The run's
start-up (its ledger's `startup` bucket) is counted whole, and the rest of its allocated seconds in
proportion to the epochs it had trained when the metric first reached the target over the epochs it
trained in all: hours = (startup + (allocated - startup) x reached / trained) / 3600. An epoch's
value is the mean of what it logged of the metric (one value, for a validation metric); `reached`
counts that epoch (metrics.csv's epochs start at 0); `trained` is summary.json's epochs_completed,
else 1 + the last epoch metrics.csv logged anything but a test/ metric at. A run that never reached
the target is "not reached", with all its hours.

Nothing but the standard library and compare's own readers: no torch, Ray or Hydra.
"""

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from raydra.compare.recorded_run import RecordedRun, read_curves
from raydra.records import layout
from raydra.records.ledger import BUCKETS, Ledger, Restart, hours

PRICE_ENV = "RAYDRA_PRICE_PER_HOUR"
NOT_REACHED = "not reached"
OPERATORS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b}
TARGET_EXAMPLE = "write it like --target 'val/acc>=0.9' (or <=, >, <)"


# -- the figures' types: numbers in exports, words in the table -----------------------------------


class Figure(float):
    """A cost figure: a float in csv and json, its own text in the table, markdown and HTML."""

    def text(self) -> str:
        return f"{self:.4g}"


class Hours(Figure):
    def text(self) -> str:
        return hours(self * 3600)


class Share(Figure):
    def text(self) -> str:
        return "<1%" if 0 < self < 0.005 else f"{self:.0%}"


class Money(Figure):
    def text(self) -> str:
        return f"{self:,.2f}" if self >= 1 or self == 0 else f"{self:.2g}"


# -- what was asked -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    metric: str
    op: str
    value: float

    @property
    def text(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"

    def met(self, value: float) -> bool:
        return OPERATORS[self.op](value, self.value)


def parse_target(text: str) -> Target:
    """--target METRIC>=VALUE (or <=, >, <). Raises ValueError, in one sentence, for anything else."""
    found = re.fullmatch(r"\s*(.+?)\s*(>=|<=|>|<)\s*(.*?)\s*", text)
    if not found or not found.group(1):
        raise ValueError(f"--target {text!r} is not METRIC>=VALUE; {TARGET_EXAMPLE}.")
    metric, op, value = found.groups()
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"--target {text!r} compares {metric} with {value!r}, which is not a number; {TARGET_EXAMPLE}.")
    return Target(metric, op, number)


@dataclass(frozen=True)
class Prices:
    """What an hour costs: one price for every run, or one for GPU-hours and one for CPU worker-hours
    (a run's ledger `gpu` picks which; where that one is not given, the one price)."""

    per_hour: Optional[float] = None
    gpu: Optional[float] = None
    cpu: Optional[float] = None
    # Where the one price came from: the flag, or the environment.
    source: str = "--price-per-hour"

    def __bool__(self) -> bool:
        return any(p is not None for p in (self.per_hour, self.gpu, self.cpu))

    def of(self, gpu: Optional[bool]) -> Optional[float]:
        specific = self.gpu if gpu else self.cpu
        return specific if specific is not None else self.per_hour

    def words(self) -> str:
        said = [f"{self.gpu:g} per GPU-hour (--price-per-gpu-hour)"] if self.gpu is not None else []
        said += [f"{self.cpu:g} per CPU worker-hour (--price-per-cpu-hour)"] if self.cpu is not None else []
        if self.per_hour is not None:
            said.append(f"{self.per_hour:g} per {'other ' if said else ''}hour ({self.source})")
        return ", ".join(said)


def _price(text: str, given: str, how: str) -> float:
    """`text` as a price; `given`: how it was given, for the sentence that refuses it."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{given} is not a price; {how}.")
    return value


def parse_prices(per_hour: Optional[str], gpu: Optional[str], cpu: Optional[str], environ: Mapping[str, str]) -> Prices:
    """The prices the flags give, --price-per-hour's default from RAYDRA_PRICE_PER_HOUR. Raises
    ValueError, in one sentence naming the flag or the variable, for one that is no price."""
    source = "--price-per-hour"
    if per_hour is None and environ.get(PRICE_ENV, "").strip():
        per_hour, source = environ[PRICE_ENV].strip(), PRICE_ENV
    found = {}
    for flag, text in (("--price-per-hour", per_hour), ("--price-per-gpu-hour", gpu), ("--price-per-cpu-hour", cpu)):
        if text is not None:
            if flag == "--price-per-hour" and source == PRICE_ENV:
                found[flag] = _price(text, f"{PRICE_ENV}={text!r}", f"set it like {PRICE_ENV}=2.5 (what an hour costs), or unset it")
            else:
                found[flag] = _price(text, f"{flag} {text!r}", f"write it like {flag} 2.5 (what an hour costs, in any currency)")
    return Prices(found.get("--price-per-hour"), found.get("--price-per-gpu-hour"), found.get("--price-per-cpu-hour"), source)


@dataclass(frozen=True)
class CostOptions:
    target: Optional[Target] = None
    prices: Prices = field(default_factory=Prices)


def cost_options(
    cost: bool, target: Optional[str], per_hour: Optional[str], gpu: Optional[str], cpu: Optional[str], environ: Mapping[str, str]
) -> Optional[CostOptions]:
    """What --cost asks for, or None when the cost is not asked: --cost, --target and a --price-*
    flag ask for it; RAYDRA_PRICE_PER_HOUR alone does not. Raises ValueError for a malformed one."""
    if not (cost or target is not None or any(p is not None for p in (per_hour, gpu, cpu))):
        return None
    return CostOptions(parse_target(target) if target is not None else None, parse_prices(per_hour, gpu, cpu, environ))


# -- one run's figures ----------------------------------------------------------------------------


def finite(value: Any) -> Optional[float]:
    """A recorded figure as a number, or None where it is none (a damaged record's)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def sound_ledger(run: RecordedRun, notes: List[str]) -> Optional[Ledger]:
    """The run's ledger as compare and show count it: a figure that is not a number (a damaged or
    hand-edited summary.json) reads as unset, and a line names the run's record."""
    ledger = run.recorded.ledger
    if ledger is None:
        return None
    buckets = ledger.buckets if isinstance(ledger.buckets, dict) else {}
    kept = {str(b): float(v) for b, v in buckets.items() if finite(v) is not None and v >= 0}
    restarts = [r for r in ledger.restarts if isinstance(r, Restart)] if isinstance(ledger.restarts, list) else []
    restarts = [dataclasses.replace(r, lost_s=finite(r.lost_s), restart_s=finite(r.restart_s)) for r in restarts]
    sound = dataclasses.replace(
        ledger, allocated_s=finite(ledger.allocated_s), wall_s=finite(ledger.wall_s), buckets=kept, restarts=restarts
    )
    damaged = [b for b in buckets if str(b) not in kept] + [k for k in ("allocated_s", "wall_s") if getattr(ledger, k) != getattr(sound, k)]
    if damaged:
        named = ", ".join(map(str, damaged))
        notes.append(
            f"{run.where(layout.SUMMARY)}: the ledger's {named} {'is' if len(damaged) == 1 else 'are'} no number of seconds; left blank."
        )
    return sound


@dataclass
class RunFigures:
    ledger: Optional[Ledger] = None
    hours: Optional[float] = None
    money: Optional[float] = None
    # The target: epochs trained until it was reached (None: not reached, or the metric not logged),
    # whether it was (None: the run logged no value of the metric), and the hours attributed to it.
    epochs: Optional[int] = None
    reached: Optional[bool] = None
    target_hours: Optional[float] = None


def epoch_values(run: RecordedRun, metric: str, notes: List[str]) -> List[Tuple[int, float]]:
    """(epoch, the mean of the metric's values logged in it), by epoch."""
    by_epoch: Dict[int, List[float]] = {}
    for _, epoch, value in read_curves(run, notes).get(metric, []):
        if epoch is not None:
            by_epoch.setdefault(int(epoch), []).append(value)
    return sorted((epoch, sum(values) / len(values)) for epoch, values in by_epoch.items())


def epochs_trained(run: RecordedRun, notes: List[str]) -> Optional[int]:
    """summary.json's epochs_completed; else 1 + the last epoch metrics.csv logged anything but a
    test/ metric at (the test after training logs at the epoch after the last)."""
    done = run.recorded.epochs_completed
    if isinstance(done, int) and not isinstance(done, bool) and done > 0:
        return done
    epochs = [
        e for metric, points in read_curves(run, notes).items() if not metric.startswith("test/") for _, e, _ in points if e is not None
    ]
    return int(max(epochs)) + 1 if epochs else None


def run_figures(run: RecordedRun, options: CostOptions, notes: List[str]) -> RunFigures:
    ledger = sound_ledger(run, notes)
    allocated = ledger.allocated_s if ledger is not None else None
    figures = RunFigures(ledger=ledger, hours=allocated / 3600 if allocated is not None else None)
    price = options.prices.of(ledger.gpu) if ledger is not None else None
    if price is None and ledger is not None:
        price = ledger.price_per_hour  # the run's own ledger.price_per_*, where no flag gives one
    if figures.hours is not None and price is not None:
        figures.money = figures.hours * price
    target = options.target
    if target is None:
        return figures
    values = epoch_values(run, target.metric, notes)
    if not values:
        return figures
    first = next((epoch for epoch, value in values if target.met(value)), None)
    figures.reached = first is not None
    if first is None:
        figures.target_hours = figures.hours
        return figures
    figures.epochs = first + 1
    trained = epochs_trained(run, notes)
    if allocated is not None and trained:
        startup = min(max(0.0, ledger.buckets.get("startup", 0.0)), allocated)
        figures.target_hours = (startup + (allocated - startup) * min(1.0, figures.epochs / trained)) / 3600
    return figures


# -- the columns ----------------------------------------------------------------------------------


@dataclass
class CostView:
    """The cost columns of a comparison: which, and each run's figures (by the run's id)."""

    options: CostOptions
    figures: Dict[int, RunFigures]
    unit: str
    # The buckets shown: every one but productive (the goodput) with seconds in some shown run.
    buckets: List[str]
    mixed: bool = False
    # A money column: a --price-* flag, or a price some run recorded (ledger.price_per_*).
    priced: bool = False
    # The sweep and multirun directories' own figures (group_blocks), once read.
    blocks: List[str] = field(default_factory=list)

    @property
    def target_columns(self) -> List[str]:
        t = self.options.target
        return [f"{t.text} epochs", f"{t.text} {self.unit}"] if t else []

    def columns(self) -> List[str]:
        return [
            self.unit,
            *(["hours on"] if self.mixed else []),
            "goodput",
            *(f"% {b}" for b in self.buckets),
            *(["cost"] if self.priced else []),
            *self.target_columns,
        ]

    def cells(self, run: RecordedRun) -> Dict[str, Any]:
        f = self.figures.get(id(run), RunFigures())
        ledger = f.ledger
        cells: Dict[str, Any] = {self.unit: figure(Hours, f.hours), "goodput": figure(Share, ledger.goodput if ledger else None)}
        if self.mixed:
            cells["hours on"] = None if ledger is None else "GPU" if ledger.gpu else "CPU"
        for b in self.buckets:
            allocated = ledger.allocated_s if ledger else None
            cells[f"% {b}"] = figure(Share, ledger.buckets.get(b, 0.0) / allocated) if allocated else None
        if self.priced:
            cells["cost"] = figure(Money, f.money)
        if self.options.target:
            epochs, hours_ = self.target_columns
            cells[epochs] = f.epochs if f.reached else NOT_REACHED if f.reached is False else None
            cells[hours_] = figure(Hours, f.target_hours)
        return cells

    def add_columns(self, rows: Sequence[Tuple[RecordedRun, Dict[str, Any]]]) -> List[str]:
        """Each row's cost cells added; the columns, to put after the table's."""
        for run, row in rows:
            row.update(self.cells(run))
        return self.columns()

    def group_columns(self) -> List[str]:
        t = self.options.target
        reached = [f"{t.text} {self.unit}", f"{t.text} reached"] if t else []
        return [self.unit, "goodput", *(["cost"] if self.priced else []), *reached]

    def add_group_columns(self, grouped: Any, notes: List[str]) -> None:
        """A seed group's (raydra.compare.groups.Grouped) sums: its runs' hours summed, goodput
        weighted by their hours (their productive seconds over their allocated), their cost summed,
        and the mean hours to the target over the seeds that reached it, with how many did."""
        for group, row in zip(grouped.groups, grouped.rows, strict=True):
            figures = [self.figures.get(id(run), RunFigures()) for run in group.runs]
            costed = [f for f in figures if f.hours is not None]
            if costed and len(costed) < len(figures):
                notes.append(
                    f"group {group.label}: {len(figures) - len(costed)} of its {len(figures)} runs "
                    f"{'has' if len(figures) - len(costed) == 1 else 'have'} no ledger "
                    "(recorded before raydra kept one); its hours are the others' sum."
                )
            allocated = sum(f.ledger.allocated_s for f in costed)
            productive = [f.ledger.buckets.get("productive") for f in costed]
            cells: Dict[str, Any] = {
                self.unit: figure(Hours, sum(f.hours for f in costed) if costed else None),
                "goodput": figure(Share, sum(productive) / allocated if costed and allocated and None not in productive else None),
            }
            if self.priced:
                money = [f.money for f in costed]
                cells["cost"] = figure(Money, sum(money) if costed and None not in money else None)
            t = self.options.target
            if t:
                reached = [f for f in figures if f.reached]
                times = [f.target_hours for f in reached if f.target_hours is not None]
                cells[f"{t.text} {self.unit}"] = figure(Hours, sum(times) / len(times) if times else None)
                cells[f"{t.text} reached"] = f"{len(reached)}/{len(figures)}"
            row.update(cells)
            row["_raw"].update({c: None if v is None else v if isinstance(v, str) else float(v) for c, v in cells.items()})
            if t:
                row["_raw"][f"{t.text} reached"] = {"reached": len(reached), "runs": len(figures)}
        grouped.columns.extend(self.group_columns())

    def legend(self, grouped: bool = False) -> List[str]:
        """What the columns mean, a line each: printed after the table, and in the HTML report."""
        what = {"GPU-h": "GPU-hours", "worker-h": "worker-hours"}.get(self.unit, "GPU- or worker-hours, as `hours on` says")
        lines = [
            f"{self.unit}: {what}, workers x wall time (summary.json's ledger); blank: a record from before raydra kept a ledger",
            "goodput: productive / allocated" + ("" if grouped else "; % BUCKET: that bucket's share of the allocated seconds"),
        ]
        if grouped:
            lines[0] += "; a group: its runs' sum"
            lines[1] += ", a group's weighted by its runs' hours"
        if self.options.prices:
            lines.append(f"cost: hours x {self.options.prices.words()}")
        elif self.priced:
            lines.append("cost: hours x the price each run recorded (ledger.price_per_*)")
        t = self.options.target
        if t and not grouped:
            lines.append(f"{t.text} epochs: the epochs trained when {t.metric} (an epoch's mean) first met it; {NOT_REACHED}: it never did")
        if t:
            lines.append(
                f"{t.text} {self.unit}: start-up, plus the rest x the epochs until {t.metric} met it / the epochs trained "
                f"(an attribution, not a measurement); {NOT_REACHED}: all its hours"
                + ("; a group: the mean over its runs that reached it" if grouped else "")
            )
        if t and grouped:
            lines.append(f"{t.text} reached: how many of the group's runs reached it")
        return lines


def figure(kind: type, value: Optional[float]) -> Optional[Figure]:
    return None if value is None or not math.isfinite(value) else kind(value)


def cost_view(runs: Sequence[RecordedRun], options: CostOptions, notes: List[str]) -> CostView:
    figures = {id(run): run_figures(run, options, notes) for run in runs}
    ledgers = [f.ledger for f in figures.values() if f.ledger is not None]
    gpus = {bool(ledger.gpu) for ledger in ledgers}
    unit = "hours" if len(gpus) > 1 else "GPU-h" if gpus == {True} else "worker-h"
    shown = [b for b in BUCKETS if b != "productive" and any(ledger.buckets.get(b, 0.0) > 0 for ledger in ledgers)]
    target = options.target
    if target and runs and not any(f.reached is not None for f in figures.values()):
        notes.append(f"no run logged {target.metric!r} by epoch in metrics.csv, so --target {target.text} is blank for every run.")
    priced = bool(options.prices) or any(ledger.price_per_hour is not None for ledger in ledgers)
    return CostView(options, figures, unit, shown, mixed=len(gpus) > 1, priced=priced)
