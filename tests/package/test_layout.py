"""The tree shows the architecture, and holds it: few modules at the top of src/raydra, none over 500
lines, imports pointing down the layers, no import cycle at import time. Read with `ast`, nothing
imported. Fast, no Ray."""

import ast
from pathlib import Path

import pytest
from helpers import REPO

SRC = REPO / "src" / "raydra"
MAX_TOP_MODULES = 10
MAX_LINES = 500

# The layers, top first: a module may import its own layer and those below it, never one above.
# Each entry is a module directly under src/raydra (by its stem) or a package (by its folder).
LAYERS = [
    # What a user runs or imports: the commands, raydra.load, the SLURM front end, the test harness.
    {"cli", "__main__", "rerun", "entry", "slurm", "testing", "__init__"},
    # What runs many runs: Tune sweeps and Hydra multiruns.
    {"sweep", "multirun"},
    # One run on the driver: its lifecycle, resolve, the fit, resume, recording.
    {"run"},
    # What runs on each Ray Train worker: the loop, callbacks, strategies, loggers.
    {"worker"},
    # raydra's models.
    {"models"},
    # raydra's data modules.
    {"data"},
    # `raydra compare` and `show`: read run directories, never train (no torch, no Ray).
    {"compare"},
    # Reaching the Ray cluster and starting its nodes; batch systems.
    {"cluster"},
    # The config: schema (the defaults' one home), checks, arguments, the user's project.
    {"config"},
    # What a run leaves: summary.json, sweep.json, jobs.json, checkpoints, their files and sync.
    {"records"},
    # Masking secrets; the one fence around other libraries' private APIs.
    {"redact", "private_apis"},
    # Lightning, imported under one name.
    {"lightning"},
    # The bottom: files local or in storage, and RaydraError.
    {"storage", "errors"},
]

# Modules allowed over MAX_LINES because they are a data table, with why.
DATA_TABLES = {
    "config/schema.py": "the config's declarations, one dataclass per group (29), each key with its default and why: "
    "the one home of the defaults, whose few functions read those declarations; split, the home would scatter"
}

# Temporary exceptions while a module's split is under way on its own branch, each with the branch:
# remove an entry once its split is merged (this test fails on an entry no longer over MAX_LINES).
# The launcher's and compare/runs.py's splits are merged: none today.
SPLITS_UNDER_WAY: dict = {}


def _modules(src: Path) -> dict:
    """Every module under `src` (a package's folder) by its dotted name: a package by its folder's."""
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _layer(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    for number, layer in enumerate(LAYERS):
        if key in layer:
            return number
    raise AssertionError(f"{module} is in no layer: add src/raydra/{key} to LAYERS in {Path(__file__).name}")


def _imported(module: str, node, modules: dict) -> list:
    """The modules of src that an import statement of `module` names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in modules]
    base = node.module or ""
    if node.level:
        package = module.split(".") if modules[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    if base not in modules:
        return []
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def _imports(module: str, modules: dict, top_level_only: bool):
    """(line, imported module) for each import of src in `module`: everywhere, or only those outside
    functions (those that run as it is imported, and those under `if TYPE_CHECKING:`, which tie the
    modules together as much)."""
    tree = ast.parse(modules[module].read_text())
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from ((node.lineno, target) for target in _imported(module, node, modules))
        else:
            stack.extend(ast.iter_child_nodes(node))


def upward_imports(src: Path) -> list:
    """Each import, at the top or inside a function, of a module in a layer above the importer's."""
    modules = _modules(src)
    layer = {m: _layer(m) for m in modules}  # every module placed, imports or none
    return sorted(
        f"{modules[m].relative_to(src.parent)}:{line} imports {target}, a layer above it"
        for m in modules
        for line, target in _imports(m, modules, top_level_only=False)
        if layer[target] < layer[m]
    )


def import_cycles(src: Path) -> list:
    """Each group of modules that import one another, in a circle, as they are imported (Tarjan's
    strongly connected components). Importing a.b.c imports a and a.b too, unless the importer is inside them."""
    modules = _modules(src)
    edges = {}
    for m in modules:
        edges[m] = set()
        for _, target in _imports(m, modules, top_level_only=True):
            parts = target.split(".")
            for end in range(1, len(parts) + 1):
                step = ".".join(parts[:end])
                if step in modules and step != m and not m.startswith(step + "."):
                    edges[m].add(step)
    index, low, stack, cycles = {}, {}, [], []

    def visit(m):
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in sorted(edges[m]):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            group = stack[stack.index(m) :]
            del stack[stack.index(m) :]
            if len(group) > 1:
                cycles.append(sorted(group))

    for m in sorted(modules):
        if m not in index:
            visit(m)
    return sorted(cycles)


def long_modules(src: Path) -> dict:
    """Modules over MAX_LINES, by their path under src, with their line counts."""
    lengths = {str(p.relative_to(src)): len(p.read_text().splitlines()) for p in sorted(src.rglob("*.py"))}
    return {path: lines for path, lines in lengths.items() if lines > MAX_LINES}


def test_at_most_10_modules_at_the_top():
    top = sorted(path.name for path in SRC.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, (
        f"{len(top)} modules directly under src/raydra, over {MAX_TOP_MODULES}: {top}; move one into its package"
    )


def test_no_module_over_500_lines():
    long = long_modules(SRC)
    over = [f"src/raydra/{path}: {lines} lines" for path, lines in long.items() if path not in DATA_TABLES and path not in SPLITS_UNDER_WAY]
    assert not over, f"modules over {MAX_LINES} lines (split at a seam; a data table goes in DATA_TABLES with why):\n" + "\n".join(over)
    done = sorted(set(SPLITS_UNDER_WAY) - set(long))
    assert not done, f"no longer over {MAX_LINES} lines: remove {done} from SPLITS_UNDER_WAY"


def test_imports_point_down_the_layers():
    upward = upward_imports(SRC)
    assert not upward, "imports pointing up the layers (move the code down, or hand the value down):\n" + "\n".join(upward)


def test_no_import_cycle():
    cycles = import_cycles(SRC)
    assert not cycles, "modules importing one another at import time (import one inside the function that needs it):\n" + "\n".join(
        " <-> ".join(group) for group in cycles
    )


def test_test_files_mirror_the_packages():
    """tests/ mirrors src/raydra: a test file sits in tests/<package>/, tests/package/ (the top-level
    modules and the package whole) or tests/system/ (tests that need real outside parts throughout)."""
    folders = {path.name for path in SRC.iterdir() if (path / "__init__.py").is_file()} | {"package", "system"}
    tests = REPO / "tests"
    misplaced = sorted(
        str(path.relative_to(tests)) for path in tests.rglob("test_*.py") if path.parent.parent != tests or path.parent.name not in folders
    )
    assert not misplaced, f"test files outside tests/<package>/, tests/package/ and tests/system/: {misplaced}"


def test_the_checks_see_what_they_look_for(tmp_path):
    """The checks above on a made-up package: an empty answer must mean a clean tree, not a blind check."""
    src = tmp_path / "raydra"
    for name, text in {
        "__init__.py": "",
        "errors.py": "from raydra.run import driver\n",  # the bottom importing a layer far above
        "run/__init__.py": "",
        "run/driver.py": "from . import fit\n\ndef later():\n    from raydra.cli import main\n",  # up, inside a function
        "run/fit.py": "from raydra.run.driver import later\n",  # driver <-> fit at import time
        "run/late.py": "def f():\n    from raydra.run import fit\n",  # inside a function: no cycle
        # Parts that name their driver's type under TYPE_CHECKING while it imports them: a cycle of the
        # design, though Python never runs it (what the multirun's parts did until state.py).
        "run/part.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from raydra.run.whole import Whole\n",
        "run/whole.py": "from raydra.run import part\n",
    }.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    (src / "cli.py").write_text("import raydra.run.late\n")
    assert upward_imports(src) == [
        "raydra/errors.py:1 imports raydra.run.driver, a layer above it",
        "raydra/run/driver.py:4 imports raydra.cli, a layer above it",
    ]
    assert sorted(import_cycles(src)) == [["raydra.run.driver", "raydra.run.fit"], ["raydra.run.part", "raydra.run.whole"]]
    (src / "plugins.py").write_text("")
    with pytest.raises(AssertionError, match="raydra.plugins is in no layer"):
        upward_imports(src)
    (src / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_modules(src) == {"big.py": MAX_LINES + 1}
