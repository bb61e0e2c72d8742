"""Everything a Ray Train worker runs (raydra.worker.loop.train_loop and its callbacks)."""

import time
from typing import Any, Dict

# When a worker process started importing the training code (unpickling train_loop imports this
# package first): summary.json's start-up phases count the imports from here (raydra.run.startup).
IMPORTS_STARTED = time.time()


def train_loop(config: Dict[str, Any]) -> Any:
    """The training function raydra hands Ray Train: raydra.worker.loop.train_loop, imported here.
    `config`: {"spec": the run's RunSpec}; returns rank 0's WorkerOutcome.

    Ray pickles it by reference, so the driver (and Ray Train's controller, which unpickles it too)
    import only this package; torch's is all they need, while Lightning, torchmetrics and the model's
    libraries (~3 s of CPU on the 2-core reference machine) are imported by the workers alone.
    """
    from raydra.worker.loop import train_loop as train

    return train(config)
