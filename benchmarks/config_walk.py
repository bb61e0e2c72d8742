"""How the composed config travels: the raydra modules a run enters from the entry to the worker, and
how often the path climbs back up a layer or returns to a module it has already left.

    python benchmarks/config_walk.py [overrides ...]

Runs the default experiment in local mode (scale.num_workers=0: the same entry, driver, fit and
worker function, in this process) for one epoch under a profiler hook and records every call that
crosses from one raydra module into another, and apart, the calls that carry the config (an
argument that is the composed DictConfig or a node of it, the resolved config or the run's plain
dict, or a raydra dataclass such as the run spec). Counted once per distinct (caller, callee) pair
of functions, in the order the run first makes it:

    modules     distinct raydra modules entered
    names       distinct raydra functions called from another module
    re-entries  calls into a module the path had already entered and left before
    climbs      calls from a lower layer into a higher one (entry > multirun/sweep > driver > fit core
                > worker > shared modules: schema, summary, storage, ...)

A design that resolves once and hands a typed spec down enters each module about once and never climbs.
The layers (entry, multirun/sweep, driver, fit core, worker) are listed with every call from another
layer that enters them.
"""

import dataclasses
import os
import sys
import tempfile
import threading
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "raydra"

LAYERS = [
    ("raydra.entry", "raydra.cli", "raydra.__main__"),
    (
        "raydra.sweep",
        "raydra.multirun.launcher",
        "raydra.multirun.admission",
        "raydra.multirun.scheduling",
        "raydra.multirun.outcome",
        "raydra.multirun.job",
        "raydra.multirun.job_process",
        "raydra.rerun",
    ),
    ("raydra.run.driver",),
    ("raydra.run.fit",),
    ("raydra.worker",),
]


def layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return len(LAYERS)


def module_of(frame) -> str:
    path = Path(frame.f_code.co_filename)
    try:
        rel = path.resolve().relative_to(SRC.parent)
    except ValueError:
        return ""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# Keys that mark a plain dict as the resolved config (root keys) or the run's place (RunSpec.resolved_config's "run").
CONFIG_KEYS = {"trainer", "scale", "model", "data", "checkpoint"}
PLACE_KEYS = {"dir", "id", "storage"}


def carries_config(frame) -> bool:
    from omegaconf import Container

    code = frame.f_code
    for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        value = frame.f_locals.get(name)
        if isinstance(value, Container):
            return True
        if isinstance(value, dict) and (CONFIG_KEYS & value.keys() or PLACE_KEYS <= value.keys()):
            return True
        if dataclasses.is_dataclass(value) and type(value).__module__.startswith("raydra"):
            return True
    return False


def walk(overrides):
    edges, order, names, config_order = {}, [], set(), []
    lock = threading.Lock()

    def hook(frame, event, arg):
        if event != "call":
            return
        callee = module_of(frame)
        if not callee:
            return
        caller_frame = frame.f_back
        while caller_frame is not None and not module_of(caller_frame):
            caller_frame = caller_frame.f_back
        if caller_frame is None:
            return
        caller = module_of(caller_frame)
        if caller == callee:
            return
        key = (caller, caller_frame.f_code.co_qualname, callee, frame.f_code.co_qualname)
        with lock:
            if key not in edges:
                edges[key] = len(order)
                order.append(key)
                names.add((callee, frame.f_code.co_qualname))
                if carries_config(frame):
                    config_order.append(key)

    out = tempfile.mkdtemp(prefix="raydra-walk-")
    sys.argv = [
        "train.py",
        "scale.num_workers=0",
        "trainer.max_epochs=1",
        "logger=csv",
        f"paths.outputs={out}",
        f"hydra.run.dir={out}/run",
        *overrides,
    ]
    from raydra.entry import hydra_main

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        hydra_main()
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return order, names, config_order


def count(order):
    """Modules entered, names called, calls into a module entered before by another call, climbs."""
    entered, reentries, climbs = [], 0, 0
    for caller, _, callee, _ in order:
        if callee in entered:
            reentries += 1
        else:
            entered.append(callee)
        if layer(callee) < layer(caller):
            climbs += 1
    return len(entered), len({(c, n) for _, _, c, n in order}), reentries, climbs


def main() -> None:
    os.environ.setdefault("WANDB_MODE", "offline")
    order, _, config_order = walk(sys.argv[1:])
    print("| calls | modules | names | re-entries | climbs |\n|---|---|---|---|---|")
    for label, calls in (("every cross-module call", order), ("calls carrying the config", config_order)):
        print(f"| {label} | " + " | ".join(str(n) for n in count(calls)) + " |")
    print("\nthe run's layers, as the config's path enters them (calls from another layer):")
    for here, prefixes in enumerate(LAYERS):
        calls = [f"{caller}.{fn} -> {target}" for caller, fn, callee, target in config_order if layer(callee) == here != layer(caller)]
        if calls:
            print(f"  {' / '.join(prefixes)}: {len(calls)}: " + "; ".join(calls))
    print("\nthe config's path (caller -> callee), in the order first taken:")
    for caller, fn, callee, target in config_order:
        print(f"  {caller}.{fn} -> {callee}.{target}" + ("   (climb)" if layer(callee) < layer(caller) else ""))


if __name__ == "__main__":
    main()
