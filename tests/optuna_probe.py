"""An Optuna pruner that prunes the trials a test names at the epoch it names, whatever their
metric: a user's own pruner (hydra.sweeper.pruner._target_) that makes the moment of a decision
certain, so that a test can check what raydra's launcher does with it (the job stops within an
epoch, its record says pruned) on a machine whose timing decides which trial ends first."""

from typing import Any, Sequence

import optuna


class PruneTrials(optuna.pruners.BasePruner):
    def __init__(self, trials: Sequence[int], at_epoch: int = 0) -> None:
        self.trials, self.at_epoch = set(trials), at_epoch

    def prune(self, study: Any, trial: Any) -> bool:
        return trial.number in self.trials and (trial.last_step or 0) >= self.at_epoch
