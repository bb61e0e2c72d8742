"""One home each: the fixed groups' defaults live in the schema dataclasses (the YAML options only
select and change), configuration.md's key list names every key raydra reads, testing.md's coverage
map names every test function, and the reference docs stay reference (dated rounds live in
experiments/). Fast, no Ray."""

import ast
import dataclasses
import re
from pathlib import Path

from helpers import REPO
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from raydra.config import schema
from raydra.entry import CONF_DIR

schema.register_schemas()


def _option_files():
    """Every YAML under raydra's config directory but Hydra's own settings (hydra/)."""
    return [path for path in sorted(CONF_DIR.rglob("*.yaml")) if path.relative_to(CONF_DIR).parts[0] != "hydra"]


def _package(path: Path) -> str:
    """The option's Hydra package: `# @package X` in its header, else its group (the root for train.yaml)."""
    for line in path.read_text().splitlines():
        found = re.match(r"#\s*@package\s+(\S+)", line)
        if found:
            return found.group(1)
    return "/".join(path.relative_to(CONF_DIR).parts[:-1]) or "_global_"


def _typed(node) -> bool:
    return isinstance(node, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(node))


def _repeats(body: dict, base: DictConfig, prefix: str = ""):
    """The keys of `body` (an option's own values) that set a field of a schema dataclass in `base`
    to the value `base` already has. Open nodes (model, data, loggers, ray.runtime_env, tune.space)
    are the user's classes' business and are not walked."""
    for key, value in body.items():
        if key not in base or OmegaConf.is_missing(base, key):
            continue
        node = base._get_node(key)
        if isinstance(value, dict) and _typed(node):
            yield from _repeats(value, node, f"{prefix}{key}.")
        elif _typed(base):
            default = OmegaConf.to_container(node) if isinstance(node, DictConfig) else node._value()
            if value == default:
                yield f"{prefix}{key}", value


def _composed(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def test_the_yaml_options_only_select_and_change_never_restate_a_default():
    """A YAML under the config directory that sets a typed group's key to the value it already has
    (the schema's default; for a preset, what its selections already give) is a second home of that
    default, and the two drift apart. Every YAML is walked, options added later included."""
    problems = []
    for path in _option_files():
        relative = path.relative_to(CONF_DIR)
        body = OmegaConf.to_container(OmegaConf.load(path)) or {}
        selections = body.pop("defaults", [])
        package = _package(path)
        if package == "_global_" and relative.parts[0] != "train.yaml":
            # A preset (experiment/): compared with the config its own selections compose to.
            chosen = [
                f"{g.split('override ', 1)[-1].strip('/')}={o}" for entry in selections if isinstance(entry, dict) for g, o in entry.items()
            ]
            base = _composed(*chosen)
        elif package == "_global_":
            base = OmegaConf.structured(schema.RaydraConfig)
        else:
            # A group's option: compared with the schema dataclass its group composes to, fresh.
            group = package.replace("/", ".")
            node = OmegaConf.select(_composed(f"{relative.parts[0]}={Path(*relative.parts[1:]).with_suffix('')}"), group)
            if not _typed(node):
                continue  # an open group (model, data, logger, callbacks): no schema, no default to repeat
            base = OmegaConf.structured(OmegaConf.get_type(node))
        prefix = "" if package == "_global_" else package.replace("/", ".") + "."
        for key, value in _repeats(body, base, prefix):
            problems.append(f"{relative}: {key}: {value!r} is its value without this line")
    assert not problems, "YAML options restating a schema default (drop the line; the schema is its home):\n" + "\n".join(problems)


def test_the_check_names_the_file_and_key_of_a_restated_default():
    base = OmegaConf.structured(schema.ScaleConfig)
    assert list(_repeats({"num_workers": 2, "use_gpu": True, "cpus_per_worker": 1}, base)) == [("num_workers", 2), ("cpus_per_worker", 1)]
    root = OmegaConf.structured(schema.RaydraConfig)
    # Nested typed groups are walked; open ones (ray.runtime_env, model) are not.
    found = list(
        _repeats({"trainer": {"max_epochs": 30, "test": False}, "ray": {"runtime_env": {"env_vars": {"A": "1"}}}, "model": {"lr": 1}}, root)
    )
    assert found == [("trainer.max_epochs", 30)]


# ---------------------------------------------------------------------------------------------
# configuration.md's key list


def _schema_keys(cls, prefix: str = "") -> set:
    keys = set()
    for field in dataclasses.fields(cls):
        if cls is schema.TrainerConfig and field.name in schema.TEMPLATE_TRAINER_KEYS:
            continue  # the template's trainer keys, refused unless null: not keys to set
        nested = field.default_factory if dataclasses.is_dataclass(field.default_factory) else None
        if nested is not None:
            keys |= _schema_keys(nested, f"{prefix}{field.name}.")
        else:
            keys.add(f"{prefix}{field.name}")
    return keys


def _keys_raydra_reads():
    """(keys of the typed schema, keys of raydra's own YAML options): the first closed, the second
    whatever the option files set."""
    groups = {path.name for path in CONF_DIR.iterdir() if path.is_dir()}
    typed = {key for key in _schema_keys(schema.RaydraConfig) if key not in groups}
    for strategy in (schema.DDPConfig, schema.FSDPConfig, schema.DeepSpeedConfig):
        typed |= _schema_keys(strategy, "strategy.")
    typed |= _schema_keys(schema.TuneConfig, "tune.")
    options = set()
    for path in sorted((CONF_DIR / "data").glob("*.yaml")):
        options |= {f"data.{key}" for key in OmegaConf.load(path) if key not in ("defaults", "_target_")}
    # csv and wandb are raydra's own loggers; the others are Lightning's classes by _target_.
    for name in ("csv", "wandb"):
        options |= {f"logger.{name}.{key}" for key in OmegaConf.load(CONF_DIR / "logger" / f"{name}.yaml")[name]}
    return typed, options


def _documented_keys() -> set:
    """The keys in configuration.md's "Every key" table: each row a prefix and its keys."""
    text = (REPO / "docs" / "configuration.md").read_text()
    section = text.split("\n## Every key\n", 1)[1].split("\n## ", 1)[0]
    keys = set()
    for row in section.splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[1].startswith("`"):
            continue
        prefix = re.match(r"`([\w.]+)`", cells[0])  # "`trainer.` (raydra's)": the prefix, then a note
        prefix = prefix.group(1) if prefix else ""
        keys |= {prefix + key for key in re.findall(r"`([\w.]+)`", cells[1])}
    return keys


def test_configuration_md_lists_every_key_of_the_schema_and_of_raydras_options():
    typed, options = _keys_raydra_reads()
    documented = _documented_keys()
    assert not (typed | options) - documented, f"keys that configuration.md's key list lacks: {sorted((typed | options) - documented)}"
    # The schema is closed: a listed key of a typed group that it lacks is stale (renamed or gone).
    closed = ("strategy.", "tune.", *{f"{key.split('.')[0]}." for key in typed if "." in key})
    stale = sorted(key for key in documented - typed if key.startswith(closed) or "." not in key)
    assert not stale, f"configuration.md lists keys the schema does not have: {stale}"


def _test_files() -> list[Path]:
    """Every test file under tests/, at any depth: the files keep their basenames when they move
    into folders, and the docs name them by it."""
    return sorted((REPO / "tests").rglob("test_*.py"))


def test_the_coverage_map_names_every_test_file_and_only_files_that_exist():
    """docs/coverage.md says what each test file covers: a new file is described there, and a file
    moved or gone is not still named (nor in docs/testing.md)."""
    text = (REPO / "docs" / "coverage.md").read_text() + (REPO / "docs" / "testing.md").read_text()
    files = {path.name for path in _test_files()}
    unnamed = sorted(name for name in files if f"`{name}`" not in text and f"`tests/{name}`" not in text)
    assert not unnamed, f"test files docs/coverage.md does not name: {unnamed}"
    named = set(re.findall(r"`(test_\w+\.py)`", text)) | set(re.findall(r"`tests/(\w+\.py)`", text))
    assert named <= files | {path.name for path in (REPO / "tests").rglob("*.py")}, f"named but not in tests/: {named - files}"


def _test_functions() -> dict[str, list[str]]:
    """Each test file's test functions, by the file's basename, read with `ast` (nothing imported,
    so a file that cannot import is still counted): every `def test_*` at module level and in a
    class pytest collects (`Test*`). A method of another class is no test: a LightningModule's
    `test_step` is Lightning's hook."""
    found: dict[str, list[str]] = {}
    for path in _test_files():
        assert path.name not in found, f"two test files named {path.name}: the docs name a file by its basename"
        tree = ast.parse(path.read_text(), filename=str(path))
        bodies = [tree.body] + [node.body for node in tree.body if isinstance(node, ast.ClassDef) and node.name.startswith("Test")]
        functions = (node for body in bodies for node in body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
        found[path.name] = [node.name for node in functions if node.name.startswith("test_")]
    return found


def _coverage_map() -> dict[str, list[str]]:
    """docs/coverage.md: under each `### `test_x.py`` heading, the test functions it names (every
    `test_...` in backticks, in order, repeats kept so that a name listed twice is seen). Its own
    page: it grows with the suite, while testing.md, how to run and extend it, keeps its size."""
    section = (REPO / "docs" / "coverage.md").read_text()
    mapped: dict[str, list[str]] = {}
    for part in re.split(r"^### ", section, flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        file = re.match(r"`(test_\w+\.py)`", heading)
        assert file, f"a coverage map heading that names no test file: ### {heading}"
        assert file.group(1) not in mapped, f"the coverage map has two sections for {file.group(1)}"
        mapped[file.group(1)] = re.findall(r"`(test_\w+)`", body)
    return mapped


def test_the_coverage_map_names_every_test_function_once_under_its_file():
    """Every test function is in the map, once, under its own file's heading, and the map names no
    function or file that is gone: a test added without a line in the map fails here, as does a
    renamed, moved or deleted one still listed."""
    functions, mapped = _test_functions(), _coverage_map()
    problems = [f"{name}: no section in the coverage map" for name in sorted(functions.keys() - mapped.keys())]
    problems += [f"{name}: a section for a file that is not under tests/" for name in sorted(mapped.keys() - functions.keys())]
    for name in sorted(functions.keys() & mapped.keys()):
        listed, defined = mapped[name], set(functions[name])
        problems += [f"{name}: {test} is missing from its section" for test in functions[name] if test not in listed]
        problems += [f"{name}: {test} is listed but not defined there" for test in sorted(set(listed) - defined)]
        problems += [f"{name}: {test} is listed {listed.count(test)} times" for test in sorted(set(listed)) if listed.count(test) > 1]
    assert not problems, "docs/coverage.md is out of date:\n" + "\n".join(problems)


def test_the_readme_and_docs_stay_reference_within_their_sizes_with_dated_rounds_in_experiments():
    """README.md is what a newcomer reads (at most 12,000 characters) and docs/testing.md how to run
    and where each behaviour is tested (at most 40,000); a dated round ("... UTC") belongs on an
    experiments/ page, the lab notebook, not in the reference."""
    readme, testing = (REPO / "README.md").read_text(), (REPO / "docs" / "testing.md").read_text()
    assert len(readme) <= 12_000, f"README.md is {len(readme):,} characters, over 12,000: move detail to docs/ or experiments/"
    assert len(testing) <= 40_000, f"docs/testing.md is {len(testing):,} characters, over 40,000"
    dated = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}"
        for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bUTC\b", line)
    ]
    assert not dated, "dated rounds in the reference docs (move them to an experiments/ page):\n" + "\n".join(dated)
