"""Start importing the training code the moment a Ray Train worker process starts.

Ray Train creates its worker processes seconds before it hands them the training function: it
still starts its dataset manager, sets up the group and its process group. Imported only when the
function arrives, torch, Lightning and the model's libraries (~4 s on 2 cores) came after all of
that; imported from here they come alongside it.

Ray runs `start` in each worker process before the process takes any task (its worker process
setup hook, set by raydra.run.fit through `private_apis.worker_setup_hook_env`). It returns at once:
the imports run in a daemon thread, and whoever needs a module later imports it as usual, waiting
for this thread if it is halfway. An import that fails here fails there too, with its own error.
"""

import contextlib
import importlib
import os
import threading
import time

from raydra.private_apis.ray_train import ray_train_worker_imported
from raydra.private_apis.torchmetrics import torchmetrics_without_optional_integrations

# Comma-separated modules and objects (dotted paths, as a `_target_` names them) to import, set by
# raydra.run.fit beside the hook.
OBJECTS_ENV = "RAYDRA_PRELOAD"
# "1": the run builds nothing of the user's, only raydra's and its libraries' (project.KNOWN_PACKAGES),
# so torchmetrics is imported without its optional integrations
# (private_apis.torchmetrics_without_optional_integrations: ~1.4 s of ~4.4 s of a worker's imports,
# measured on 2 cores).
LEAN_ENV = "RAYDRA_LEAN_IMPORTS"


def start() -> None:
    names = [name for name in os.environ.get(OBJECTS_ENV, "").split(",") if name]
    if os.environ.get(LEAN_ENV) == "1":
        torchmetrics_without_optional_integrations()
    # What the worker's first task unpickles (the run spec: raydra.config.schema, Hydra's ConfigStore),
    # here, before the process takes a task: Hydra's package imports itself in a cycle, and the
    # task's unpickling on the main thread while this thread was halfway through Hydra failed with
    # "cannot import name 'ConfigStore' from partially initialized module" (seen once, an elastic
    # run's new worker). ~0.4 s; torch and Lightning, the long part, stay in the thread.
    importlib.import_module("raydra.config.spec")
    from hydra.utils import get_object

    def preload() -> None:
        # Ray's own imports first (see ray_train_worker_imported); they take well under a second.
        deadline = time.monotonic() + 120
        while not ray_train_worker_imported() and time.monotonic() < deadline:
            time.sleep(0.02)
        for name in names:
            with contextlib.suppress(Exception):
                # As Hydra's instantiate finds a `_target_`: a lazily exported function
                # (transformers.get_cosine_schedule_with_warmup) imports its module only when asked for.
                get_object(name)

    threading.Thread(target=preload, name="raydra-preload", daemon=True).start()
