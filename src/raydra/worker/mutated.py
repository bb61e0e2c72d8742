"""A trial's hyperparameters put back after Lightning restored a checkpoint (tune.scheduler=pbt).

When PBT continues a poor trial from a better trial's checkpoint, the trial is built from its new,
perturbed config, and then Lightning's restore loads the copied optimizer and LR scheduler state over
it: the optimizer's param groups and the scheduler's base_lrs come back with the copied trial's
values, so the perturbation is silently lost (ray-project/ray#36660). This callback, run after the
restore, sets them to the trial's config again.

Keys follow lightning-hydra-template's convention, as raydra's models do: `model.optimizer.<name>`
is the optimizer's constructor argument <name>, so a param group key; every `model.<path>` is the
module's hyperparameter at <path>, which the module was built with already (Lightning's fit restores
no hyperparameters) and is set again in case the module restores its own.
"""

import functools
import logging
from collections.abc import MutableMapping
from typing import Any, List, Mapping

from raydra.lightning import pl

OPTIMIZER_PREFIX = "model.optimizer."


class MutatedHyperparameters(pl.Callback):
    """`values`: {dotted config key: the trial's value}, e.g. {"model.optimizer.lr": 0.0012}.

    Setting them is idempotent: a checkpoint saved after they were applied restores them as they
    are, so every restore of a PBT trial applies them, its own checkpoints' too."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = dict(values)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # After Lightning's restore of optimizers and schedulers; a run that started afresh was built with these values.
        if trainer.ckpt_path is None:
            return
        apply(self.values, trainer.optimizers, [config.scheduler for config in trainer.lr_scheduler_configs], pl_module)
        logging.getLogger("raydra").info(f"put the trial's values back after restoring {trainer.ckpt_path}: {self.values}")


def apply(values: Mapping[str, Any], optimizers: Any, schedulers: Any, module: Any) -> None:
    """`values` into the optimizers' param groups, the schedulers' base learning rates and the module's hparams."""
    for key, value in values.items():
        if key.startswith(OPTIMIZER_PREFIX):
            _into_optimizers(key.removeprefix(OPTIMIZER_PREFIX), value, optimizers, schedulers)
        if key.startswith("model."):
            _into_hparams(module.hparams, key.removeprefix("model.").split("."), value)


def _into_optimizers(name: str, value: Any, optimizers: Any, schedulers: Any) -> None:
    for optimizer in optimizers:
        for index, group in enumerate(optimizer.param_groups):
            if name != "lr":
                if name in group:
                    group[name] = tuple(value) if isinstance(group[name], tuple) else value
                continue
            # The scheduled rate where the schedule stands (warm-up, cosine) is its base rate times a
            # factor of the step: the new base times the same factor. Without a scheduler the rate is the base.
            base = group.get("initial_lr", group["lr"])
            group["lr"] = group["lr"] * value / base if base else value
            if "initial_lr" in group:
                group["initial_lr"] = value
            for scheduler in schedulers:
                if getattr(scheduler, "optimizer", None) is optimizer and hasattr(scheduler, "base_lrs"):
                    scheduler.base_lrs[index] = value


def _into_hparams(node: Any, path: List[str], value: Any) -> None:
    """Set `value` at `path` under `node`: a mapping's key, or a partial's keyword (an optimizer Hydra built with _partial_)."""
    *parents, last = path
    for part in parents:
        if isinstance(node, functools.partial):
            node = node.keywords
        if not isinstance(node, Mapping) or part not in node:
            return
        node = node[part]
    if isinstance(node, functools.partial):
        node = node.keywords
    if isinstance(node, MutableMapping) and last in node:
        node[last] = value
