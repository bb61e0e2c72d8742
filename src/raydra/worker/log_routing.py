"""Where a worker's logging goes (route_logs): into its log file, logs/worker_<rank>.log, with secrets
masked (raydra.redact), set up as the worker starts and undone as it ends."""

import logging
import warnings
from pathlib import Path
from typing import Callable

from raydra.redact import SecretsFilter


def route_logs(path: Path, verbose: bool, local: bool) -> Callable[[], None]:
    """Everything Lightning, torch and W&B say goes to the worker's log file; the console only
    gets warnings unless the run is verbose. In local mode the process is the driver's, whose own
    console and driver.log stay as they are: the file is added, and removed by the returned function."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    handler.addFilter(SecretsFilter())
    loggers = [
        logging.getLogger(name)
        for name in ("raydra", "lightning", "lightning.pytorch", "pytorch_lightning", "lightning_fabric", "torch", "wandb", "ray.train")
    ]

    before = {logger.name: (logger.level, logger.propagate) for logger in loggers}

    def unroute() -> None:
        for logger in loggers:
            logger.removeHandler(handler)
            logger.setLevel(before[logger.name][0])
            logger.propagate = before[logger.name][1]
        handler.close()

    for logger in loggers:
        logger.addHandler(handler)
        if local:
            # raydra's own lines reach the console as the driver's do; the libraries' go to the file
            # only, at the levels they chose (torch's INFO would reach the console through its own handler).
            logger.propagate = logger.name == "raydra" or verbose
            continue
        logger.setLevel(logging.INFO)
        if not verbose:
            for existing in logger.handlers:
                if existing is not handler:
                    existing.setLevel(logging.WARNING)
            logger.propagate = False
    if not verbose:
        # Lightning's tips about workers, logging intervals and sync_dist are advice for scripts,
        # not for a framework that already chose those settings.
        warnings.filterwarnings("ignore", module=r"(lightning|pytorch_lightning|lightning_fabric)\..*")
        logging.captureWarnings(True)
    return unroute
