"""LightningModules raydra ships, one per file; `model=<name>` picks one by its `_target_`."""

from typing import Any, Callable


def partial_of(spec: Any) -> Callable[..., Any]:
    """An optimizer's or scheduler's constructor with its settings bound: the partial Hydra builds
    from a `_partial_: true` node (how raydra builds the model now, as lightning-hydra-template's
    modules expect), or that node itself, as plain data (what a checkpoint written before keeps in
    its hyperparameters, and what `model._recursive_: false` hands over)."""
    if callable(spec):
        return spec
    from hydra.utils import instantiate

    return instantiate(spec)
