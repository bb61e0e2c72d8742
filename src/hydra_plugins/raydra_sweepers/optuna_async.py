"""raydra's asynchronous Optuna sweeper for `python train.py -m` (and any Hydra app):
`hydra/sweeper=optuna_async`. Hydra's own Optuna sweeper asks for a batch of trials and waits for the
batch's slowest job; this one asks for the next trial the moment a job ends, prunes a job within an
epoch of its pruner's decision, and keeps its study in the sweep directory, so that
`hydra.launcher.resume=true` continues it. The search space is Hydra's override grammar, as for
Hydra's Optuna sweeper:

    python train.py -m hydra/sweeper=optuna_async hydra/sweeper/pruner=median hydra.sweeper.n_trials=12 \
        'model.optimizer.lr=tag(log,interval(1e-4,1e-2))' 'trainer.max_epochs=range(2,8)' scale.num_workers=1

The study is raydra.multirun.optuna_sweeper's; this module, which Hydra imports at every start,
imports only Hydra at its top and holds the settings' one home.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class OptunaAsyncSweeperConf:
    """hydra.sweeper.* for hydra/sweeper=optuna_async: the one home of these settings and their defaults."""

    # The sampler and pruner are config groups of their own (hydra/sweeper/sampler=random), as in
    # Hydra's Optuna sweeper; no pruner by default.
    defaults: List[Any] = field(default_factory=lambda: ["_self_", {"sampler": "tpe"}, {"pruner": None}])
    _target_: str = "hydra_plugins.raydra_sweepers.optuna_async.OptunaAsyncSweeper"
    # How many trials the study runs in all; a resumed sweep counts the ones it ran before.
    n_trials: int = 20
    # minimize or maximize the jobs' return value (a raydra run's best checkpoint.monitor); null: as
    # checkpoint.mode says for raydra's runs, minimize for another app's (Hydra's Optuna sweeper's default).
    direction: Optional[str] = None
    # Optuna's sampler by _target_ (hydra/sweeper/sampler=tpe|random|qmc, or any sampler's class).
    # constant_liar: a running trial counts as a poor result for the next one's choice, so that jobs
    # running side by side do not all sample the same region (Optuna's advice for parallel trials).
    sampler: Any = None
    # Optuna's pruner by _target_ (hydra/sweeper/pruner=median|successive_halving|hyperband|wilcoxon);
    # null: no trial is pruned. It watches each job's checkpoint.monitor as metrics.csv logs it per epoch.
    pruner: Any = None
    # The search space in Hydra's override grammar, beside (and overridden by) the command line's:
    # {model.optimizer.lr: "tag(log,interval(1e-4,1e-2))", data.batch_size: "32,64,128"}.
    params: Optional[Dict[str, str]] = None
    # The share of ended trials that may fail before no further trial is asked for; 0.0: the first
    # failure ends the sweep once the running jobs end (Hydra's Optuna sweeper's default).
    max_failure_rate: float = 0.0
    # With a launcher other than raydra's, which has only Hydra's batch API: trials per batch.
    n_jobs: int = 2


def _optuna(target: str, **settings: Any) -> Dict[str, Any]:
    return {"_target_": f"optuna.{target}", **settings}


ConfigStore.instance().store(group="hydra/sweeper", name="optuna_async", node=OptunaAsyncSweeperConf, provider="raydra")
for _name, _node in {
    "tpe": _optuna("samplers.TPESampler", seed=None, constant_liar=True),
    "random": _optuna("samplers.RandomSampler", seed=None),
    "qmc": _optuna("samplers.QMCSampler", seed=None),
}.items():
    ConfigStore.instance().store(group="hydra/sweeper/sampler", name=_name, node=_node, provider="raydra")
for _name, _node in {
    # A trial whose metric at an epoch is worse than the median of the others' at that epoch.
    "median": _optuna("pruners.MedianPruner", n_startup_trials=4, n_warmup_steps=1),
    "successive_halving": _optuna("pruners.SuccessiveHalvingPruner", min_resource=1, reduction_factor=3),
    "hyperband": _optuna("pruners.HyperbandPruner", min_resource=1, reduction_factor=3),
    "wilcoxon": _optuna("pruners.WilcoxonPruner", p_threshold=0.1),
}.items():
    ConfigStore.instance().store(group="hydra/sweeper/pruner", name=_name, node=_node, provider="raydra")


class OptunaAsyncSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.sweeper: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        from raydra.multirun.optuna_sweeper import OptunaSweep

        launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context, task_function=task_function)
        self.sweeper = OptunaSweep(self.settings, launcher, config)

    def sweep(self, arguments: List[str]) -> None:
        self.sweeper.sweep(arguments)
