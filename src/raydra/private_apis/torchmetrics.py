"""torchmetrics' private API (raydra.private_apis says why such a module exists)."""

import sys
from typing import Any

# What torchmetrics imports at its own import because it is installed, though only some metrics use
# it (torchmetrics 1.9; Lightning imports torchmetrics whole): transformers for BERTScore, InfoLM and
# CLIPScore, matplotlib for Metric.plot, scipy.signal for an audio library's back-compatibility patch.
# Its flags (lightning_utilities RequirementCache objects, in torchmetrics.utilities.imports) that
# gate those imports, and the package torchmetrics/__init__ asks `package_available` about.
TORCHMETRICS_OPTIONAL_FLAGS = (
    "_TRANSFORMERS_AVAILABLE",
    "_TRANSFORMERS_GREATER_EQUAL_4_4",
    "_TRANSFORMERS_GREATER_EQUAL_4_10",
    "_MATPLOTLIB_AVAILABLE",
    "_SCIPI_AVAILABLE",
)


TORCHMETRICS_IMPORTS_MODULE = "torchmetrics.utilities.imports"


# What those flags keep from being imported (tests/private_apis/test_private_apis.py checks that none is).
TORCHMETRICS_LEAN_LEAVES_OUT = ("transformers", "scipy.signal", "matplotlib")


def torchmetrics_without_optional_integrations() -> bool:
    """Have torchmetrics, when it is first imported in this process, leave out the integrations that
    the flags above gate (torchmetrics' own issue #3457): `import raydra.worker.loop` took 4.3-4.7 s
    and takes 2.9-3.1 s with them left out (transformers 0.48, scipy.signal 0.48, matplotlib 0.21 of
    it in -X importtime, 2026-11-27, this 2-core machine). Only for a process whose
    run builds nothing of the user's (raydra.run.fit decides): those metrics then say they need the
    package, as on a machine without it. False, changing nothing, where torchmetrics is already
    imported.

    No public switch exists: the flags are evaluated as torchmetrics' modules import, so they are set
    the moment torchmetrics.utilities.imports has run, through a finder that wraps that module's
    loader, and torchmetrics/__init__'s own `package_available("scipy")` is answered False while it
    runs."""
    import importlib.abc
    import importlib.machinery

    if "torchmetrics" in sys.modules:
        return False
    import lightning_utilities.core.imports as lu_imports

    real_package_available = lu_imports.package_available

    def package_available(name: str) -> bool:
        # Bound by torchmetrics/__init__ at its import; everyone else gets the real one back below.
        return (
            False
            if name == "scipy" and "torchmetrics" in sys.modules and "torchmetrics.functional" not in sys.modules
            else real_package_available(name)
        )

    class Finder(importlib.abc.MetaPathFinder):
        # It stays in sys.meta_path once it has served, answering None: an import on another thread
        # walks that list as it stands, and a finder removed ahead of its place shifted the list
        # under it, so that it skipped the next finder, PathFinder among them (a Ray Train worker's
        # task unpickled on its main thread while raydra.worker.preload imported torchmetrics failed
        # with "No module named 'ray.train.torch.torch_checkpoint'", seen once in the suite).
        served = False

        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name != TORCHMETRICS_IMPORTS_MODULE or self.served:
                return None
            self.served = True
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader

            class Loader(importlib.abc.Loader):
                def create_module(self, spec: Any) -> Any:
                    return loader.create_module(spec)

                def exec_module(self, module: Any) -> None:
                    loader.exec_module(module)
                    for flag in TORCHMETRICS_OPTIONAL_FLAGS:
                        getattr(module, flag).available = False
                    lu_imports.package_available = real_package_available

            spec.loader = Loader()
            return spec

    lu_imports.package_available = package_available
    sys.meta_path.insert(0, Finder())
    return True
