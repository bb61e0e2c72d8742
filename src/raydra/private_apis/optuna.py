"""Optuna's private API (raydra.private_apis says why such a module exists)."""

from typing import Any


def running_trial(study: Any, number: int) -> Any:
    """The Trial to report to and prune (Trial.report, Trial.should_prune) for the study's running
    trial `number`, which an earlier process asked for: a resumed sweep continues the trials its
    killed driver left running. Study.ask makes a Trial only for a new trial, and Study.tell takes
    a trial's number, but nothing public makes one for a trial already asked for: Optuna's Trial
    takes the storage's trial id, which only FrozenTrial's private _trial_id holds."""
    from optuna.trial import Trial

    return Trial(study, study.trials[number]._trial_id)
