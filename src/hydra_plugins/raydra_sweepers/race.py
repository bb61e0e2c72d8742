"""raydra's seed race for `python train.py -m` (and any Hydra app): `hydra/sweeper=race`. The
configurations are the command's sweeps, as Hydra's basic sweeper expands them; each starts with
min_seeds seeds, and more are run only for configurations still in contention with the leader,
until one is left or max_seeds is reached (a configuration leaves when beaten beyond noise, or as
out of reach when its chance of ending max_seeds ahead of the leader falls below futility). The verdict (winner, each other configuration's
difference, CI and adjusted p, the seeds each got) closes the multirun, goes to race.json and shows
in `raydra compare <sweep dir>`:

    python train.py -m hydra/sweeper=race 'model.optimizer.lr=1e-4,3e-4,1e-3,3e-3' \
        hydra.sweeper.metric=val/acc hydra.sweeper.mode=max scale.num_workers=1

The race is raydra.multirun.race's (its statistics: raydra.multirun.racing); this module, which
Hydra imports at every start, imports only Hydra at its top and holds the settings' one home.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class RaceSweeperConf:
    """hydra.sweeper.* for hydra/sweeper=race: the one home of these settings and their defaults."""

    _target_: str = "hydra_plugins.raydra_sweepers.race.RaceSweeper"
    # The metric the configurations are compared on and which way is better (min or max); null: a
    # raydra run's checkpoint.monitor and checkpoint.mode. Another metric becomes the jobs'
    # checkpoint.monitor, so that each job returns its best value of it.
    metric: Optional[str] = None
    mode: Optional[str] = None
    # Seeds every configuration gets before the first look, and the most any gets.
    min_seeds: int = 2
    max_seeds: int = 5
    # The chance, over the whole race, of declaring a difference between configurations that are in
    # truth equal (raydra.multirun.racing spends it over the looks and the pairs).
    alpha: float = 0.05
    # A configuration not beaten beyond noise, but with less than this chance of ending max_seeds
    # ahead of the leader (predictive, from the results so far), leaves the race as out of reach:
    # no difference is claimed, and the grid's winner is lost this way at most this often per
    # configuration so dropped. 0: drop only beyond noise. 0.1 races at about half the grid's
    # jobs where an lr grid's gaps are a few noise sds (experiments/race.md).
    futility: float = 0.1
    # The config key each job's seed goes to; its composed value is the first seed (seed=42: 42, 43, ...).
    seed_name: str = "seed"
    # The configurations in Hydra's override grammar, beside (and overridden by) the command line's:
    # {model.optimizer.lr: "1e-4,3e-4,1e-3"}.
    params: Optional[Dict[str, str]] = None
    # With a launcher other than raydra's, which has only Hydra's batch API: jobs per batch.
    n_jobs: int = 2


ConfigStore.instance().store(group="hydra/sweeper", name="race", node=RaceSweeperConf, provider="raydra")


class RaceSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.race: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        from raydra.multirun.race import SeedRace

        launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context, task_function=task_function)
        self.race = SeedRace(self.settings, launcher, config)

    def sweep(self, arguments: List[str]) -> None:
        self.race.sweep(arguments)
