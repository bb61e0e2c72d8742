"""The seed race behind hydra/sweeper=race (its settings: hydra_plugins.raydra_sweepers.race): a
multirun that spends seeds only where they decide something. The sweep's configurations are those
of Hydra's basic sweeper (`model.optimizer.lr=1e-4,3e-4,1e-3` and its cartesian products); each
starts with min_seeds seeds, more are asked for only while a configuration is in contention with
the leader, and a configuration beaten beyond noise is dropped, one with less than `futility` chance
of ending max_seeds ahead of the leader leaves as out of reach (the statistics:
raydra.multirun.racing). Seeds are shared: seed index i is the same `seed` value for every
configuration.

A feed for raydra's launcher (raydra.multirun.feed): a job is asked for the moment a slot frees,
and a running job whose configuration was dropped (or whose race has its verdict) is stopped at its
next epoch's end and ends `pruned`. race.json (raydra.records.race), beside jobs.json, is rewritten
as each job is asked for and as each ends; `hydra.launcher.resume=true` reads it, asks again for the
jobs it had asked for under their numbers (the completed ones are kept, the others continue from
their last checkpoints) and races on: the looks depend on the results alone, so the verdict is the
one the race would have reached uninterrupted.

With a launcher other than raydra's (Hydra's batch API only), jobs run in batches of
hydra.sweeper.n_jobs, without stopping any; the race says so.
"""

import dataclasses
import itertools
import logging
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from omegaconf import DictConfig, OmegaConf

from raydra.errors import RaydraError
from raydra.multirun.feed import FedJob, JobEnd, number_of, resuming, run_feed
from raydra.multirun.optuna_sweeper import check_keys
from raydra.multirun.outcome import console
from raydra.multirun.racing import Cell, Race
from raydra.records import race as race_record
from raydra.records.envelope import Status
from raydra.records.layout import RACE_RECORD

log = logging.getLogger("raydra")


def configurations_of(arguments: List[str], seed_name: str) -> Tuple[List[List[str]], List[str]]:
    """The configurations a command sweeps, as Hydra's basic sweeper expands them (each sweep a
    list of values; several: their cartesian product, in the command's order), and the overrides
    every job shares."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    swept: List[List[str]] = []
    fixed: List[str] = []
    for override in OverridesParser.create().parse_overrides(arguments):
        key = override.get_key_element()
        bare = key.lstrip("+~")
        if bare == seed_name:
            if override.is_sweep_override():
                raise RaydraError(
                    f"{override.input_line}: the race chooses each job's {seed_name} itself (the same values for every configuration); "
                    f"leave {seed_name} out of the sweep, or give one value, {seed_name}=<n>, to start its seeds from."
                )
            continue  # one value: the composed config's, where the race's seeds start
        if override.is_sweep_override():
            if override.is_interval_sweep():
                raise RaydraError(
                    f"{override.input_line}: a race compares a list of configurations, not an interval; give the values, "
                    f"e.g. {key}=1e-4,3e-4,1e-3 (or search the interval with hydra/sweeper=optuna_async)."
                )
            swept.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            assert override.input_line is not None
            fixed.append(override.input_line)
    return [list(combination) for combination in itertools.product(*swept)] if swept else [], fixed


class SeedRace:
    """One race: Hydra's Sweeper calls (setup's values, then sweep), and the feed raydra's launcher draws from."""

    def __init__(self, settings: Dict[str, Any], launcher: Any, config: DictConfig) -> None:
        """`settings`: hydra.sweeper.*; `launcher`: the multirun's Hydra launcher, set up; `config`: the composed config."""
        self.settings, self.config, self.launcher = settings, config, launcher
        self.sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        self.raydra_runs = OmegaConf.select(config, "checkpoint.monitor") is not None
        self.metric: str = ""
        self.watched: Optional[str] = None
        self.race: Optional[Race] = None
        self.record: Optional[race_record.RaceRecord] = None
        self.configs: List[List[str]] = []
        self.fixed: List[str] = []
        self.seeds: List[int] = []
        self.jobs: Dict[int, race_record.RaceJob] = {}  # by job number
        self.replaying: List[int] = []  # a resumed race's jobs, asked for again first
        self.started = time.time()

    # -- Hydra's Sweeper ----------------------------------------------------------------------

    def sweep(self, arguments: List[str]) -> None:
        settings = self.settings
        seed_name = str(settings["seed_name"])
        params = [f"{key}={value}" for key, value in (settings.get("params") or {}).items()]
        self.configs, self.fixed = configurations_of(params + list(arguments), seed_name)
        self._check(seed_name)
        self.metric, mode = self._metric_and_mode()
        # A raydra run's jobs rank their checkpoints by the race's metric and return its best: the value raced.
        if self.raydra_runs and (self.metric, mode) != (self.config.checkpoint.monitor, self.config.checkpoint.mode):
            self.fixed += [f"checkpoint.monitor={self.metric}", f"checkpoint.mode={mode}"]
        self.watched = self.metric if self.raydra_runs else None
        first = OmegaConf.select(self.config, seed_name)
        first = first if isinstance(first, int) and not isinstance(first, bool) else 0
        self.seeds = [first + i for i in range(settings["max_seeds"])]
        self.race = Race(
            configs=len(self.configs),
            min_seeds=settings["min_seeds"],
            max_seeds=settings["max_seeds"],
            alpha=settings["alpha"],
            futility=settings["futility"],
            maximize=mode == "max",
        )
        self._begin(mode, seed_name)
        try:
            run_feed(self, self.launcher, self.settings["n_jobs"], "race")
        finally:
            self._report()

    def _check(self, seed_name: str) -> None:
        settings = self.settings
        if len(self.configs) < 2:
            raise RaydraError(
                "hydra/sweeper=race compares configurations, and this command sweeps "
                f"{'none' if not self.configs else 'only one'}; give a key two values or more, e.g. 'model.optimizer.lr=1e-4,1e-3'."
            )
        check_keys(self.config, {override.split("=", 1)[0]: None for override in self.configs[0]})
        if OmegaConf.select(self.config, seed_name, default=None) is None:
            raise RaydraError(
                f"hydra.sweeper.seed_name={seed_name} is not a key of the composed config; name the key your app seeds itself from."
            )
        for key in ("min_seeds", "max_seeds"):
            value = settings.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise RaydraError(f"hydra.sweeper.{key}={value} must be a whole number of at least 2 (one seed says nothing of the noise).")
        if settings["min_seeds"] > settings["max_seeds"]:
            raise RaydraError(
                f"hydra.sweeper.min_seeds={settings['min_seeds']} is more than hydra.sweeper.max_seeds={settings['max_seeds']}; "
                "raise max_seeds or lower min_seeds."
            )
        alpha = settings.get("alpha")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise RaydraError(f"hydra.sweeper.alpha={alpha} must be a probability between 0 and 1, e.g. 0.05.")
        futility = settings.get("futility")
        if isinstance(futility, bool) or not isinstance(futility, (int, float)) or not 0 <= futility < 1:
            raise RaydraError(
                f"hydra.sweeper.futility={futility} must be a probability from 0 (drop only beyond noise) to below 1, e.g. 0.1."
            )

    def _metric_and_mode(self) -> Tuple[str, str]:
        settings = self.settings
        metric, mode = settings.get("metric"), settings.get("mode")
        if self.raydra_runs:
            metric = metric if metric is not None else str(self.config.checkpoint.monitor)
            mode = mode if mode is not None else str(self.config.checkpoint.mode)
            _check_logged(self.config, metric)
        elif mode is None:
            raise RaydraError(
                "hydra.sweeper.mode must be min or max for this app's jobs, whose return value the race compares; "
                "e.g. hydra.sweeper.mode=min for a loss."
            )
        if mode not in ("min", "max"):
            raise RaydraError(f"hydra.sweeper.mode={mode} must be min or max.")
        return str(metric if metric is not None else "value"), str(mode)

    def _begin(self, mode: str, seed_name: str) -> None:
        """race.json: a new one, or (hydra.launcher.resume=true) the one the sweep directory holds, whose jobs are asked for again."""
        assert self.race is not None
        settings = self.settings
        path = self.sweep_dir / RACE_RECORD
        resume = resuming(self.config, path, "a race")
        fields = dict(
            metric=self.metric,
            mode=mode,
            min_seeds=settings["min_seeds"],
            max_seeds=settings["max_seeds"],
            alpha=float(settings["alpha"]),
            futility=float(settings["futility"]),
            seed_name=seed_name,
            seeds=self.seeds,
            fixed=self.fixed,
            configurations=[race_record.Configuration(overrides=overrides) for overrides in self.configs],
            grid_jobs=len(self.configs) * settings["max_seeds"],
        )
        if resume:
            before = race_record.read(self.sweep_dir)
            asked = {
                key: getattr(before, key)
                for key in ("metric", "mode", "min_seeds", "max_seeds", "alpha", "futility", "seed_name", "seeds", "fixed")
            }
            if asked["futility"] is None:  # a race.json from before out-of-reach drops: it raced without them
                asked["futility"] = 0.0
            given = {key: fields[key] for key in asked}
            if asked != given or [c.overrides for c in before.configurations] != self.configs:
                raise RaydraError(
                    f"hydra.launcher.resume=true: the race in {self.sweep_dir} ran {[c.overrides for c in before.configurations]} "
                    f"with {asked}, not what this command gives; resume with the command that started it."
                )
            self.jobs = {int(num): job for num, job in before.jobs.items() if num.isdigit()}
            # Asked for again in their order, but for those stopped because their configuration was dropped.
            self.replaying = [num for num, job in sorted(self.jobs.items()) if job.status != Status.PRUNED]
            self.record = before.resumed_from_here()
        else:
            self.sweep_dir.mkdir(parents=True, exist_ok=True)
            self.record = race_record.RaceRecord.started(**fields)
        self._write()

    # -- the feed (raydra.multirun.feed.JobFeed) ------------------------------------------------

    def next_job(self) -> Optional[FedJob]:
        assert self.race is not None
        while self.replaying:
            num = self.replaying.pop(0)
            job = self.jobs[num]
            if job.config in self.race.contenders and not self.race.done:
                return self._fed(num, job)
            if job.status != Status.COMPLETED:
                # Its configuration was dropped (or the race decided) by the results replayed before it.
                self.jobs[num] = dataclasses.replace(job, status=Status.PRUNED)
        if self.race.done:
            return None
        taken: Set[Cell] = {(job.config, job.seed) for job in self.jobs.values() if job.status != Status.PRUNED}
        wanted = self.race.wanted(taken)
        if not wanted:
            return None
        config, seed = wanted[0]
        num = max(self.jobs, default=-1) + 1
        self.jobs[num] = race_record.RaceJob(config=config, seed=seed, status=Status.RUNNING)
        self._write()
        return self._fed(num, self.jobs[num])

    def _fed(self, num: int, job: race_record.RaceJob) -> FedJob:
        seed = f"{self.settings['seed_name']}={self.seeds[job.seed]}"
        return FedJob(num=num, overrides=[*self.configs[job.config], seed, *self.fixed], shown=[*self.configs[job.config], seed])

    def epoch_ended(self, num: int, epoch: int, value: float) -> Optional[str]:
        """A running job whose result the race no longer needs is stopped."""
        assert self.race is not None
        job = self.jobs.get(num)
        if job is None or self.race.stopped is not None:
            return None  # stopped by a failed job: the running ones end, and a resumed race uses them
        if self.race.done:
            return f"the race has its verdict (winner: {' '.join(self.configs[self.race.leader or 0])})"
        if job.config not in self.race.contenders:
            standing, look = self.race.outcome_of(job.config)
            how = "as out of reach of the leader" if standing == "out of reach" else "beaten beyond noise"
            return f"the race dropped {' '.join(self.configs[job.config])} at {look.level if look else '?'} seeds, {how}"
        return None

    def job_ended(self, end: JobEnd) -> None:
        assert self.race is not None
        job = self.jobs.get(end.num)
        if job is None or end.status == Status.INTERRUPTED:
            return  # interrupted: asked for again (and continued) when the race is resumed
        value = number_of(end.value)
        if end.status in (Status.COMPLETED, Status.KEPT) and value is not None:
            self.jobs[end.num] = dataclasses.replace(job, status=Status.COMPLETED, value=value)
            if job.config in self.race.contenders and not self.race.done:
                for look in self.race.record((job.config, job.seed), value):
                    self._say_look(look)
        elif end.status == Status.PRUNED:
            self.jobs[end.num] = dataclasses.replace(job, status=Status.PRUNED)
        else:
            self.jobs[end.num] = dataclasses.replace(job, status=Status.FAILED)
            if job.config in self.race.contenders and not self.race.done and self.race.stopped is None:
                why = end.error or (
                    f"its run logged no {self.metric}; set hydra.sweeper.metric to a metric the model logs"
                    if end.status == Status.COMPLETED
                    else f"it returned {end.value!r}, not a number"
                )
                self.race.stopped = (
                    f"job #{end.num} ({' '.join(self._fed(end.num, job).shown or [])}) failed ({why[:300]}): the race asks for no "
                    "further job; fix the cause and continue it with hydra.launcher.resume=true"
                )
                log.info(f"race: {self.race.stopped}")
        self._write()

    def _say_look(self, look: Any) -> None:
        name = lambda c: " ".join(self.configs[c])  # noqa: E731
        dropped = "; ".join(
            [
                f"{name(c)} dropped ({self.metric} {look.means[c]:.4g}, p {look.comparisons[c].p:.2g})"
                if c in look.comparisons
                else name(c)
                for c in look.dropped
            ]
            + [
                f"{name(c)} out of reach ({self.metric} {look.means[c]:.4g}, chance to overtake {look.comparisons[c].overtake:.1%})"
                for c in look.out_of_reach
            ]
        )
        log.info(
            f"race: at {look.level} seeds each, {name(look.leader)} leads ({self.metric} {look.means[look.leader]:.4g})"
            f"{'; ' + dropped if dropped else '; none dropped'}"
        )

    # -- race.json and the verdict --------------------------------------------------------------

    def _write(self) -> None:
        """race.json as the race stands now."""
        assert self.race is not None and self.record is not None
        race = self.race
        configurations = []
        for c, overrides in enumerate(self.configs):
            results = {str(self.seeds[i]): race.results[(c, i)] for i in race.seeds_of(c)}
            standing, look = race.outcome_of(c)
            against = None
            if look is not None and c in look.comparisons:
                comparison = look.comparisons[c]
                against = race_record.Comparison(
                    leader=look.leader,
                    advantage=comparison.advantage,
                    ci=list(comparison.ci),
                    p=comparison.p,
                    seeds=look.level,
                    overtake=comparison.overtake,
                )
            mean = sum(results.values()) / len(results) if results else None
            configurations.append(
                race_record.Configuration(overrides=overrides, standing=standing, results=results, mean=mean, against_leader=against)
            )
        self.record = dataclasses.replace(
            self.record,
            configurations=configurations,
            jobs={str(num): job for num, job in sorted(self.jobs.items())},
            looks=[
                race_record.Look(
                    level=look.level, contenders=look.contenders, leader=look.leader, dropped=look.dropped, out_of_reach=look.out_of_reach
                )
                for look in race.looks
            ],
            winner=race.leader if race.done and race.stopped is None else None,
            decided=race.decided,
            stopped=race.stopped,
            jobs_started=len(self.jobs),
        )
        race_record.write(self.sweep_dir, self.record)

    def _report(self) -> None:
        """race.json as the race ended, its verdict on the console."""
        if self.race is None or self.record is None:
            return
        from raydra.compare.race_text import race_lines

        self._write()
        worker_s, grid_worker_s = self._worker_seconds()
        if self.race.stopped is not None:
            ended = self.record.failed(self.race.stopped, self.started)
        elif self.race.done:
            ended = self.record.completed(self.started)
        else:  # the launcher stopped (Ctrl-C, a time limit): its jobs and this record continue on resume
            ended = self.record.interrupted(
                "the race stopped before its verdict; continue it with hydra.launcher.resume=true", self.started
            )
        self.record = dataclasses.replace(ended, worker_s=worker_s, grid_worker_s=grid_worker_s)
        race_record.write(self.sweep_dir, self.record)
        with console(self.sweep_dir):
            log.info("\n".join(race_lines(self.record, str(self.sweep_dir))))

    def _worker_seconds(self) -> Tuple[Optional[float], Optional[float]]:
        """What the race's runs used (worker-seconds, their ledgers') and what the full grid would
        have: each configuration's mean per completed job, times max_seeds (None until every
        configuration has a completed job)."""
        from raydra.records import summary
        from raydra.records.envelope import RecordError
        from raydra.records.ledger import run_cost

        per_job: Dict[int, List[float]] = {}
        total = None
        for num, job in self.jobs.items():
            try:
                seconds = run_cost(str(num), summary.read(self.sweep_dir / str(num))).allocated_s
            except (OSError, RecordError):
                continue  # another app's job, or one that never started
            total = (total or 0.0) + seconds
            if job.status == Status.COMPLETED:
                per_job.setdefault(job.config, []).append(seconds)
        if len(per_job) < len(self.configs):
            return total, None
        return total, sum(sum(v) / len(v) for v in per_job.values()) * self.settings["max_seeds"]


def _check_logged(config: DictConfig, metric: str) -> None:
    """For raydra's own models, whose metrics are known before anything runs: `metric` is one they log."""
    from raydra.config.project import OWN_MODEL_METRICS

    model = OmegaConf.select(config, "model")
    target = str(model.get("_target_") or "") if isinstance(model, DictConfig) else ""
    logged = OWN_MODEL_METRICS.get(target)
    if logged is not None and metric not in logged:
        raise RaydraError(
            f"hydra.sweeper.metric={metric} is not a metric {target.rsplit('.', 1)[-1]} logs ({', '.join(logged)}); "
            "race on one of those, e.g. hydra.sweeper.metric=val/acc hydra.sweeper.mode=max."
        )
