"""The asynchronous Optuna sweep behind hydra/sweeper=optuna_async (its settings:
hydra_plugins.raydra_sweepers.optuna_async). A feed for raydra's launcher (raydra.multirun.feed): a
trial is asked of the study the moment a slot frees, each running job's checkpoint.monitor is
reported to the study at each epoch's end, and a job the study's pruner stops ends `pruned`.

The study lives in the sweep directory (Optuna's journal file, optuna_study.journal), a trial's
number is its job's number (its directory, hydra.job.num), and so `hydra.launcher.resume=true`
continues a sweep stopped by Ctrl-C or a killed driver: trials that ended stay ended (never run
again), trials that were running continue their runs from their last checkpoints, and the study asks
for new ones until it has n_trials.

With a launcher other than raydra's, which has only Hydra's batch API, trials run in batches of
hydra.sweeper.n_jobs (Hydra's Optuna sweeper's behaviour), without pruning; the sweep says so.
"""

import logging
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from raydra.errors import RaydraError
from raydra.multirun.feed import FedJob, JobEnd, number_of, resuming, run_feed
from raydra.multirun.outcome import console
from raydra.records.envelope import Status
from raydra.records.layout import OPTUNA_RESULTS, OPTUNA_STUDY

log = logging.getLogger("raydra")

# Hydra's prefixes for adding or forcing a key: the key itself is what the config must have.
ADD_PREFIXES = ("++", "+")


def space_of(arguments: List[str]) -> Tuple[Dict[str, Any], List[str]]:
    """The search space in Hydra's override grammar: each sweep (a choice `a,b`, `range(...)`,
    `interval(...)`, `tag(log, interval(...))`) as an Optuna distribution by key, and the other
    overrides as they are, for every job. The same reading as Hydra's Optuna sweeper's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    space: Dict[str, Any] = {}
    fixed: List[str] = []
    for override in OverridesParser.create().parse_overrides(arguments):
        if override.is_sweep_override():
            space[override.get_key_element()] = _distribution(override)
        else:
            assert override.input_line is not None
            fixed.append(override.input_line)
    return space, fixed


def _distribution(override: Any) -> Any:
    from hydra.core.override_parser.types import Transformer
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    value = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    if override.is_range_sweep():
        if any(isinstance(v, float) for v in (value.start, value.stop, value.step)):
            # Hydra's range excludes its stop; Optuna's distributions include their high.
            return FloatDistribution(float(value.start), float(value.stop) - float(value.step), step=float(value.step))
        return IntDistribution(int(value.start), int(value.stop) - int(value.step), step=int(value.step))
    if override.is_interval_sweep():
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log_scale)
        return FloatDistribution(float(value.start), float(value.end), log=log_scale)
    raise RaydraError(
        f"{override.input_line}: a sweep of this kind is not a search space Optuna can sample; use a choice, range() or interval()."
    )


def check_keys(config: DictConfig, space: Dict[str, Any]) -> None:
    """Each key of the space names a key of the composed config, or a config group (model=vit,sd_tiny)."""
    choices = OmegaConf.select(config, "hydra.runtime.choices") or {}
    for key in space:
        bare = key[2:] if key.startswith("++") else key[1:] if key.startswith("+") else key
        if key.startswith(ADD_PREFIXES) or bare in choices:
            continue
        if OmegaConf.select(config, bare, default=_MISSING) is _MISSING:
            raise RaydraError(
                f"the sweep's space names {bare}, which the composed config does not have; check its spelling, "
                f"or add it to every job with +{bare}=..."
            )


_MISSING = object()


class OptunaSweep:
    """One sweep: Hydra's Sweeper calls (setup's values, then sweep), and the feed raydra's launcher draws from."""

    def __init__(self, settings: Dict[str, Any], launcher: Any, config: DictConfig) -> None:
        """`settings`: hydra.sweeper.* (its sampler and pruner instantiated); `launcher`: the
        multirun's Hydra launcher, set up; `config`: the composed config."""
        self.settings, self.config, self.launcher = settings, config, launcher
        self.sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        self.raydra_runs = OmegaConf.select(config, "checkpoint.monitor") is not None
        # The metric the pruner watches and the jobs return: a raydra run's checkpoint.monitor.
        self.watched: Optional[str] = str(config.checkpoint.monitor) if self.raydra_runs else None
        self.study: Any = None
        self.trials: Dict[int, Any] = {}  # a running trial by number (its job's)
        self.told: Dict[int, set] = {}  # the epochs reported for each running trial
        self.continuing: List[FedJob] = []  # a resumed study's trials that were running: asked for first
        self.fixed: List[str] = []
        self.space: Dict[str, Any] = {}
        self.stopped_asking: Optional[str] = None

    # -- Hydra's Sweeper ----------------------------------------------------------------------

    def sweep(self, arguments: List[str]) -> None:
        import optuna

        settings = self.settings
        params = [f"{key}={value}" for key, value in (settings.get("params") or {}).items()]
        self.space, self.fixed = space_of(params + list(arguments))
        if not self.space:
            raise RaydraError(
                "hydra/sweeper=optuna_async has no space to search: give a key a choice, range() or interval(), "
                "e.g. 'model.optimizer.lr=tag(log,interval(1e-4,1e-2))'."
            )
        check_keys(self.config, self.space)
        n_trials = settings.get("n_trials")
        if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
            raise RaydraError(f"hydra.sweeper.n_trials={n_trials} must be a whole number of at least 1.")
        rate = settings.get("max_failure_rate")
        if not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise RaydraError(f"hydra.sweeper.max_failure_rate={rate} must be a share between 0 and 1.")
        pruner = settings.get("pruner")
        if pruner is not None and not self.raydra_runs:
            raise RaydraError(
                "hydra.sweeper.pruner needs jobs that log their metric per epoch to metrics.csv, as raydra's runs do; "
                "this app's jobs report only their return value: leave the pruner out (hydra.sweeper.pruner=null)."
            )
        # No pruner asked for is none: Optuna's own default would be its MedianPruner.
        pruner = pruner if pruner is not None else optuna.pruners.NopPruner()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # TPESampler's constant_liar, the default sampler's, is marked experimental since Optuna 2.8.
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        # Every refusal before the journal is made: a refused sweep leaves no study behind.
        direction = self._direction()
        self.study = self._study(optuna, settings.get("sampler"), pruner, direction)
        try:
            run_feed(self, self.launcher, self.settings["n_jobs"], "optuna")
        finally:
            self._report()

    def _study(self, optuna: Any, sampler: Any, pruner: Any, direction: str) -> Any:
        """The sweep's study in its directory: a new one, or (hydra.launcher.resume=true) the one it
        holds, whose running trials continue."""
        from raydra.private_apis.optuna import running_trial

        path = self.sweep_dir / OPTUNA_STUDY
        resume = resuming(self.config, path, "an Optuna study")
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
        shown = {key: str(distribution) for key, distribution in sorted(self.space.items())}
        if resume:
            study = optuna.load_study(study_name=self.sweep_dir.name, storage=storage, sampler=sampler, pruner=pruner)
            if study.user_attrs.get("space") != shown or study.user_attrs.get("fixed") != self.fixed:
                raise RaydraError(
                    f"hydra.launcher.resume=true: the study in {self.sweep_dir} searched {study.user_attrs.get('space')} with "
                    f"{study.user_attrs.get('fixed')}, not what this command gives; resume with the command that started it."
                )
            for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                self.trials[frozen.number] = running_trial(study, frozen.number)
                self.told[frozen.number] = set(frozen.intermediate_values)
                self.continuing.append(self._job(frozen.number, frozen.params))
            return study
        study = optuna.create_study(
            study_name=self.sweep_dir.name, storage=storage, sampler=sampler, pruner=pruner, direction=self._direction()
        )
        study.set_user_attr("space", shown)
        study.set_user_attr("fixed", self.fixed)
        return study

    def _direction(self) -> str:
        direction = self.settings.get("direction")
        if direction is None:
            mode = OmegaConf.select(self.config, "checkpoint.mode")
            return "maximize" if mode == "max" else "minimize"
        if direction not in ("minimize", "maximize"):
            raise RaydraError(f"hydra.sweeper.direction={direction} must be minimize or maximize (or null: as checkpoint.mode says).")
        if self.raydra_runs and direction != ("maximize" if self.config.checkpoint.mode == "max" else "minimize"):
            raise RaydraError(
                f"hydra.sweeper.direction={direction} works against checkpoint.mode={self.config.checkpoint.mode}, which picks each "
                "job's best value the sweep reads; set one to match the other, or leave the direction null."
            )
        return direction

    def _job(self, number: int, params: Dict[str, Any]) -> FedJob:
        sampled = [f"{key}={value}" for key, value in params.items()]
        return FedJob(num=number, overrides=sampled + self.fixed, shown=sampled)

    # -- the feed (raydra.multirun.feed.JobFeed) ------------------------------------------------

    def next_job(self) -> Optional[FedJob]:
        if self.continuing:
            return self.continuing.pop(0)
        if self.stopped_asking or len(self.study.trials) >= self.settings["n_trials"]:
            return None
        trial = self.study.ask(self.space)
        self.trials[trial.number] = trial
        self.told[trial.number] = set()
        return self._job(trial.number, trial.params)

    def epoch_ended(self, num: int, epoch: int, value: float) -> Optional[str]:
        trial = self.trials.get(num)
        if trial is None or epoch in self.told[num]:
            return None
        self.told[num].add(epoch)
        trial.report(value, step=epoch)
        if not trial.should_prune():
            return None
        return f"Optuna's {type(self.study.pruner).__name__} at epoch {epoch}: {self.watched} {value:.4g}"

    def job_ended(self, end: JobEnd) -> None:
        from optuna.trial import TrialState

        if end.num not in self.trials or end.status == Status.INTERRUPTED:
            return  # interrupted: the trial stays running, and a resumed sweep continues it
        self.trials.pop(end.num)
        if end.status == Status.PRUNED:
            self.study.tell(end.num, state=TrialState.PRUNED)
        elif end.status in (Status.COMPLETED, Status.KEPT) and number_of(end.value) is not None:
            self.study.tell(end.num, number_of(end.value))
        else:
            if end.error:
                why = end.error
            elif self.watched and end.status == Status.COMPLETED:
                why = f"its run logged no {self.watched} (checkpoint.monitor, the sweep's objective); set checkpoint.monitor to a metric the model logs"
            else:
                why = f"it returned {end.value!r}, not a number"
            self.study.tell(end.num, state=TrialState.FAIL)
            self.study.set_user_attr(f"failed_{end.num}", why[:300])
            ended = [t for t in self.study.trials if t.state.is_finished()]
            failed = sum(t.state == TrialState.FAIL for t in ended)
            if failed / max(1, len(ended)) > self.settings["max_failure_rate"] and not self.stopped_asking:
                self.stopped_asking = (
                    f"trial #{end.num} failed ({why[:200]}), {failed} of {len(ended)} ended trials, over "
                    f"hydra.sweeper.max_failure_rate={self.settings['max_failure_rate']}: no further trial is asked for"
                )
                log.info(f"optuna: {self.stopped_asking}")

    # -- the end --------------------------------------------------------------------------------

    def _report(self) -> None:
        """optimization_results.yaml, as Hydra's Optuna sweeper writes it, and the closing line."""
        if self.study is None:
            return
        with console(self.sweep_dir):
            self._say_results()

    def _say_results(self) -> None:
        from optuna.trial import TrialState

        trials = self.study.trials
        counts = {state: sum(t.state == state for t in trials) for state in TrialState}
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        said = ", ".join(f"{n} {state.name.lower()}" for state, n in counts.items() if n)
        if not done:
            log.info(f"optuna: {len(trials)} trials ({said or 'none ran'}); none completed")
            return
        best = self.study.best_trial
        OmegaConf.save(
            OmegaConf.create({"name": "optuna_async", "best_params": best.params, "best_value": best.value}),
            self.sweep_dir / OPTUNA_RESULTS,
        )
        params = " ".join(f"{key}={value}" for key, value in best.params.items())
        log.info(
            f"optuna: {len(trials)} trials ({said}); best {self.watched or 'value'} {best.value:.4g} by trial #{best.number} ({params})"
            f"\n  study  {self.sweep_dir / OPTUNA_STUDY}"
        )
