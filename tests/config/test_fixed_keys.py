"""Every fixed key (the schema's sections: scale, trainer, checkpoint, paths, ray, slurm, failure,
tune, each strategy's, the root's) given a value of the wrong type, or a number that is not finite
(nan, inf, -inf) where it takes a float, is refused in one sentence that names the full key, whether OmegaConf refuses it as Hydra composes (said by the entry) or raydra's
own checks do (schema.validate): nothing wrong reaches the run. Fast: one composition per base
config, each wrong value set as Hydra sets an override."""

import contextlib
import copy
import dataclasses
import math
import typing

import pytest
from helpers import composed
from omegaconf import OmegaConf, open_dict

from raydra.config.checks import problems_of
from raydra.config.schema import STRATEGY_SCHEMAS, RaydraConfig, TuneConfig, register_schemas
from raydra.entry import before_the_run

register_schemas()

# The sections whose keys are checked, each in a config that has it: (prefix, schema, base overrides).
SECTIONS = [
    ("", RaydraConfig, ()),
    *(("strategy", schema, (f"strategy={name}",)) for name, schema in STRATEGY_SCHEMAS.items()),
    ("tune", TuneConfig, ("tune=asha",)),
]
# The groups that are a user's classes' arguments (raydra.config.arguments checks those), and the root keys
# whose schema is picked by a group option (their sections are walked on their own, above).
OPEN = {"model", "data", "logger", "callbacks", "strategy", "tune"}
# Numbers that are not finite: Hydra's grammar reads nan, inf and -inf as floats, and a range check
# lets nan through (every comparison with it is false); refused for every key that takes a float
# (an int key refuses them as it refuses any float, as Hydra composes).
NOT_FINITE = (math.nan, math.inf, -math.inf)
# Wrong values for the keys typed Any in the schema (each takes more than one type, which raydra checks).
ANY_KEYS = {
    "scale.num_workers": ("abc", [1, 2, 3], 1.5, *NOT_FINITE),
    "trainer.fast_dev_run": ("abc", [1, 2, 3], -1, *NOT_FINITE),
    "trainer.max_time": ("abc", [1, 2, 3], 5, {"hours": math.nan}, {"hours": math.inf}),
    "trainer.limit_train_batches": ("abc", [1, 2, 3], -1, *NOT_FINITE),
    "trainer.limit_val_batches": ("abc", [1, 2, 3], 1.5, *NOT_FINITE),
    "trainer.limit_test_batches": ("abc", [1, 2, 3], *NOT_FINITE),
    "trainer.overfit_batches": ("abc", [1, 2, 3], -2, *NOT_FINITE),
    "ray.runtime_env": ("abc", [1, 2, 3]),
    "tune.space": ("abc", [1, 2, 3]),
    "strategy.config": ("abc", [1, 2, 3]),
}


def fixed_keys():
    """(base overrides, full key, annotation) of every fixed key, once: the process-group keys that
    every strategy shares under the first strategy."""
    seen = set()
    for prefix, schema, base in SECTIONS:
        for found in _fields(schema, prefix, base):
            if found[1] not in seen:
                seen.add(found[1])
                yield found


def _fields(schema, prefix, base):
    hints = typing.get_type_hints(schema)
    for field in dataclasses.fields(schema):
        key = f"{prefix}.{field.name}" if prefix else field.name
        if not prefix and field.name in OPEN:
            continue
        annotation = hints[field.name]
        if dataclasses.is_dataclass(annotation):
            yield from _fields(annotation, key, base)
        else:
            yield base, key, annotation


def wrong_values(key, annotation):
    """Values of the wrong type for `annotation`: a string for a number, a list for a scalar, a
    string for a list or a dict."""
    if key in ANY_KEYS or key.split(".")[-1] in ("deepspeed_config",):
        return ANY_KEYS.get(key, ("abc", [1, 2, 3]))
    if annotation is typing.Any:
        # lightning-hydra-template's trainer keys: anything but null is refused, naming raydra's key.
        return ("abc",)
    optional = typing.get_origin(annotation) is typing.Union
    plain = [a for a in typing.get_args(annotation) if a is not type(None)] if optional else [annotation]
    origin = typing.get_origin(plain[0]) or plain[0]
    if origin is dict and typing.get_args(plain[0])[-1] is float:
        return ("abc", *({"memory": number} for number in NOT_FINITE))
    if origin in (list, dict):
        return ("abc",)
    if plain[0] is str:
        return ([1, 2, 3],)
    if plain[0] is float:
        return ("abc", [1, 2, 3], *NOT_FINITE)
    return ("abc", [1, 2, 3])


CASES = [(base, key, value) for base, key, annotation in fixed_keys() for value in wrong_values(key, annotation)]
_bases = {}


def base_config(base):
    if base not in _bases:
        _bases[base] = composed(*base)
    return copy.deepcopy(_bases[base])


def refusal(base, key, value) -> list:
    """What raydra says of `key=value` set as Hydra sets an override on the base config: the
    sentences it adds to what the base config alone is refused for (strategy=deepspeed is refused
    on this CPU machine, whatever its keys)."""
    cfg = base_config(base)
    try:
        # A dict's new key is added as Hydra adds `+scale.resources_per_worker.memory=inf`.
        with open_dict(cfg) if isinstance(value, dict) else contextlib.nullcontext():
            OmegaConf.update(cfg, key, value, merge=True)
    except Exception as error:  # OmegaConf's type check, as Hydra composes
        said = before_the_run(error)
        assert said is not None, f"{key}={value}: no sentence for {type(error).__name__}: {error}"
        return [said]
    return [p for p in problems_of(cfg) if p not in set(problems_of(base_config(base)))]


def test_the_base_configs_are_refused_for_nothing_but_what_this_machine_lacks():
    assert not list(problems_of(base_config(())))
    assert not list(problems_of(base_config(("tune=asha",))))
    assert all("deepspeed" in p for p in problems_of(base_config(("strategy=deepspeed",))))


def test_every_fixed_key_is_walked():
    keys = {key for _, key, _ in CASES}
    assert {"scale.num_workers", "trainer.max_epochs", "checkpoint.monitor", "paths.outputs", "ray.address", "failure.max_failures"} <= keys
    assert {"slurm.nodes", "tune.asha.grace_period", "strategy.stage", "strategy.sharding", "name", "seed", "tags", "resume"} <= keys
    assert set(ANY_KEYS) <= keys and len(keys) > 80


@pytest.mark.parametrize("base, key, value", CASES, ids=[f"{' '.join(base)} {key}={value}".strip() for base, key, value in CASES])
def test_a_wrong_value_for_a_fixed_key_is_refused_in_one_sentence_naming_the_key(base, key, value):
    said = refusal(base, key, value)
    assert len(said) == 1, said
    assert said[0].startswith((f"{key}=", f"{key} ", f"{key}.")), said
    assert "\n" not in said[0] and "Traceback" not in said[0] and said[0].endswith("."), said
