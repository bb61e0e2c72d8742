"""The Lightning strategy a worker trains with, built from the `strategy` group.

Only Ray's strategies: Lightning's own `ddp` would start its own processes and rendezvous, and
Ray's `prepare_trainer` rejects it.
"""

from typing import Any, Dict

from ray.train.lightning import RayDDPStrategy


def build_strategy(settings: Dict[str, Any]) -> Any:
    name = settings["name"]
    if name == "ddp":
        return RayDDPStrategy(
            find_unused_parameters=settings["find_unused_parameters"],
            gradient_as_bucket_view=settings["gradient_as_bucket_view"],
            static_graph=settings["static_graph"],
        )
    raise ValueError(f"strategy.name={name} has no builder")


def torch_config(settings: Dict[str, Any]) -> Any:
    """Ray's TorchConfig: the process group backend and timeout are Ray's to set, not Lightning's."""
    from ray.train.torch import TorchConfig

    return TorchConfig(backend=settings.get("backend"), timeout_s=settings.get("timeout_s", 1800))
