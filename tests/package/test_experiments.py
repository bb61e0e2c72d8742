"""experiments/: every record is indexed, says what machine it needs and what was measured, and its
commands are ones raydra takes: each `python train.py` line composes (a multirun's line with the
first value of each sweep), each benchmark script exists and takes the flags given. Fast, no Ray."""

import re
import shlex

import pytest
from helpers import REPO
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from raydra.config.checks import validate
from raydra.config.schema import register_schemas
from raydra.entry import CONF_DIR

register_schemas()

EXPERIMENTS = REPO / "experiments"
RECORDS = sorted(path for path in EXPERIMENTS.glob("*.md") if path.name != "README.md")


def commands(record):
    """The command lines of a record's code blocks, a trailing comment removed."""
    blocks = re.findall(r"^```\n(.*?)^```", record.read_text(), flags=re.S | re.M)
    lines = [line.split("   #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith(("python ", "raydra "))]


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def first_of_each_sweep(overrides):
    """A multirun's overrides as one job's: each sweep (a,b,c) at its first value."""
    single = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_sweep_override():
            single.append(f"{override.get_key_element()}={next(override.sweep_string_iterator())}")
        else:
            single.append(override.input_line)
    return single


def test_every_record_is_indexed_and_names_its_machine_and_what_was_measured():
    index = (EXPERIMENTS / "README.md").read_text()
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    assert linked == {record.name for record in RECORDS}
    for record in RECORDS:
        text = record.read_text()
        assert "**Machine**" in text and "## Measured" in text, record.name
        assert commands(record), record.name


@pytest.mark.parametrize("record", RECORDS, ids=[record.stem for record in RECORDS])
def test_every_command_of_a_record_is_one_raydra_takes(record):
    for line in commands(record):
        words = shlex.split(line)
        if words[:2] == ["python", "train.py"]:
            overrides = [word for word in words[2:] if word != "-m"]
            cfg = composed(*(first_of_each_sweep(overrides) if "-m" in words else overrides))
            assert cfg.name, line
        elif words[0] == "python" and words[1].startswith("benchmarks/"):
            script = REPO / words[1]
            assert script.is_file(), line
            source = script.read_text()
            for flag in (word for word in words[2:] if word.startswith("--")):
                assert f'"{flag}"' in source, f"{line}: {script.name} has no {flag}"
        else:
            pytest.fail(f"{record.name}: {line}: not a command this test knows how to check")


def test_seed_001s_search_space_makes_valid_runs():
    from raydra.sweep.space import check_samples, parse_space

    cfg = composed("experiment=vit_digits_tune")
    validate(cfg)
    space = parse_space(cfg)
    check_samples(cfg, space)
    assert set(space) == {"model.hidden_size", "model.mlp_size", "model.optimizer.lr", "data.batch_size"}
    assert (cfg.tune.scheduler, cfg.tune.metric, cfg.tune.mode, cfg.trainer.max_epochs) == ("fifo", "val/loss", "min", 4)
