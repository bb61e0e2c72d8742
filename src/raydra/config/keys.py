"""A config's dotted keys (`model.optimizer.lr`): a nested config flattened to them, and ABSENT,
the value of a key a config does not have. Used where configs are compared key by key (resume=
against the run's record, `raydra compare` across runs) and where a key is looked up by its
dotted name (a sweep's search space). Imports nothing: `raydra compare` stays light."""

from typing import Any, Dict


class _Absent:
    """A config key a config does not have: shown as `absent`, never confused with null or blank."""

    def __repr__(self) -> str:
        return "absent"


ABSENT = _Absent()


def flatten(data: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Nested config -> {"model.optimizer.lr": 0.01, ...}; lists and empty dicts stay values, as
    typed on a command line."""
    flat: Dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat
