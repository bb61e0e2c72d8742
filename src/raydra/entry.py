"""What `train.py` calls with the composed config: a Tune sweep when `tune` is set, else one run.

The only place that reads Hydra's runtime state and turns errors into exit codes: everything
below it (raydra.driver, raydra.sweep, raydra.fit) takes plain arguments and raises.
"""

import logging
from pathlib import Path
from typing import Optional

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from raydra.errors import RaydraError

log = logging.getLogger("raydra")


def main(cfg: DictConfig) -> Optional[float]:
    """Run what `cfg` describes; returns the monitored metric (the best run's or best trial's), the
    value Hydra's sweeper plugins optimise."""
    hydra = HydraConfig.get()
    output_dir = Path(hydra.runtime.output_dir).resolve()
    overrides = list(hydra.overrides.task)
    try:
        if cfg.get("tune") is not None:
            from raydra.sweep import run_sweep

            # The primary config's directory, so best_config.yaml can find the groups it composes from.
            config_dir = next((s["path"] for s in hydra.runtime.config_sources if s["provider"] == "main" and s["schema"] == "file"), None)
            return run_sweep(cfg, output_dir, overrides, config_dir)["best"]["metric"]
        from raydra.driver import run

        return run(cfg, output_dir, overrides)["metrics"]["best"].get(cfg.checkpoint.monitor)
    except RaydraError:
        # Already recorded and logged as one sentence where it happened; no traceback for it.
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        # Recorded as interrupted, with how to continue, already; 130 is the shell's code for Ctrl-C.
        raise SystemExit(130) from None
