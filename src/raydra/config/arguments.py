"""The arguments a run's `_target_`s are built with, checked on the driver before Ray starts, against
the signature of the class or function each `_target_` names: every key one of its parameters
(unless it takes **kwargs), every required parameter given (unless `_partial_: true`), and every
value of the type its annotation says. Hydra's instantiate checks none of this, so a mistake such
as `model.optimizer.lr=fast` used to start Ray and fail on every worker.

    check(cfg)       one RaydraError naming every problem, one sentence each, naming the full key
    problems(cfg)    those sentences
    import_target    the object a `_target_` names, or one sentence saying why it cannot be imported

What is checked is what Hydra's instantiate builds on the workers: `model` (less the keys raydra
reads itself) and `data` with every `_target_` nested in them (a `_partial_` optimizer too), each
`callbacks.<name>` and each `logger.<name>` (but raydra's own csv and wandb).

A value is checked with pydantic (installed with Ray) in its lax mode, which coerces as a Hydra
user expects: an int where a float is annotated, "3" where an int is, a list where a tuple is, a
number where a string is. What a config cannot hold is not checked, and not refused: a parameter
without an annotation, a string annotation that does not resolve, an annotation that is only
classes a config value cannot be (a Tensor, an nn.Module, an ndarray: code often converts plain
data into them), a value built by instantiate (a nested `_target_`), an interpolation that cannot
be resolved here (a Hydra resolver outside Hydra's run), and null (data.num_classes of data that
describes itself is filled in later, on the driver). In a Union, those classes are left
out and the rest checked: `lr: Union[float, Tensor]` takes a float from a config.
"""

import collections.abc
import difflib
import enum
import functools
import importlib
import inspect
import pathlib
import types
import typing
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from raydra.errors import RaydraError

# A `_target_` node's keys that are Hydra's, not the callable's.
HYDRA_KEYS = ("_target_", "_recursive_", "_convert_", "_partial_", "_args_")
# Keys of the model group that raydra reads itself and does not pass to the module's constructor:
# fsdp's blocks (the rest are Hydra's).
MODEL_KEYS_FOR_RAYDRA = ("shard_blocks",)
# The loggers raydra builds itself (raydra.worker.loggers): metrics.csv and W&B; any other is a `_target_`.
RAYDRA_LOGGERS = ("csv", "wandb")
# The types a config value is (after OmegaConf's own conversion), which an annotation is checked for.
PLAIN_TYPES = (bool, int, float, str, bytes, type(None), list, tuple, set, frozenset, dict)
# Generic containers whose items are checked too.
CONTAINERS = (
    list,
    tuple,
    set,
    frozenset,
    dict,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
    collections.abc.Set,
    collections.abc.MutableSet,
    collections.abc.Mapping,
    collections.abc.MutableMapping,
    collections.abc.Collection,
    collections.abc.Iterable,
)
UNKNOWN = object()  # an annotation (or a member of one) that a config value is not checked against


def check(cfg: DictConfig, raydras_own: Optional[bool] = None) -> None:
    """Raise one RaydraError naming every problem problems() finds in `cfg`."""
    found = list(problems(cfg, raydras_own))
    if found:
        raise RaydraError(" ".join(found))


def problems(cfg: DictConfig, raydras_own: Optional[bool] = None) -> Iterator[str]:
    """A sentence for each argument of the run's `_target_`s that its callable would refuse.

    `raydras_own`: True for the arguments of the model and data classes only where those are
    raydra's own (raydra.models.*, raydra.data.*: importing them imports Lightning, ~3 s of CPU
    that the driver of a Ray run does not spend, measured to delay its first step by as much), False
    for everything else (the `_target_`s nested in raydra's own, such as the optimizer, included),
    None for all."""
    for key, node, leave_out in _instantiated(cfg):
        own = key in ("model", "data") and str(_value(node, "_target_")).startswith("raydra.")
        if raydras_own is None:
            itself, inside = True, True
        elif raydras_own:
            itself, inside = own, False
        else:
            itself, inside = not own, True
        if itself or inside:
            yield from _node_problems(node, key, leave_out=leave_out, itself=itself, inside=inside)


def _instantiated(cfg: DictConfig) -> Iterator[Tuple[str, Any, Sequence[str]]]:
    """(key, node, keys raydra reads itself) of every `_target_` node the workers instantiate."""
    model = cfg.get("model")
    if _is_dict(model) and model.get("_target_"):
        yield "model", model, MODEL_KEYS_FOR_RAYDRA
    data = cfg.get("data")
    # Under data.loader=ray_data the workers get raydra's own module, built from the data config by raydra.
    if _is_dict(data) and data.get("_target_") and data.get("loader") != "ray_data":
        yield "data", data, ()
    for group in ("callbacks", "logger"):
        node = cfg.get(group)
        if not _is_dict(node):
            continue  # project.entries says what is wrong with it
        for name in node:
            entry = node[name]
            if _is_dict(entry) and entry.get("_target_") and not (group == "logger" and name in RAYDRA_LOGGERS):
                yield f"{group}.{name}", entry, ()


def import_target(target: str, key: str) -> Any:
    """The class or function `target` (a dotted path) names; one sentence naming `key` when its
    module cannot be imported or does not define it."""
    module_name, _, name = target.rpartition(".")
    top = target.split(".")[0]
    try:
        module = importlib.import_module(module_name) if module_name else None
    except ModuleNotFoundError as error:
        if error.name and (error.name == top or module_name.startswith(error.name + ".") or error.name == module_name):
            raise RaydraError(
                f"{key}._target_={target}: there is no module {error.name} on the import path; run from your project's "
                f"directory (the one holding {top}/), or install your package."
            ) from None
        raise RaydraError(f"{key}._target_={target}: importing {module_name} failed ({error}); install what it imports.") from None
    except Exception as error:
        raise RaydraError(f"{key}._target_={target}: importing {module_name} raised {type(error).__name__}: {error}.") from None
    if module is None or not hasattr(module, name):
        raise RaydraError(f"{key}._target_={target}: {module_name or target} defines no {name}; check the spelling of the class.")
    return getattr(module, name)


def _node_problems(
    node: Any, key: str, leave_out: Sequence[str] = (), partial: bool = False, itself: bool = True, inside: bool = True
) -> Iterator[str]:
    """The problems of one `_target_` node at `key` (`itself`), then of the `_target_` nodes inside
    it (`inside`). `partial`: built later with more arguments (inside a `_recursive_: false` node)."""
    target = _value(node, "_target_")
    if not isinstance(target, str):
        return
    partial = partial or _value(node, "_partial_") is True
    names = [k for k in node.keys() if k not in HYDRA_KEYS and k not in leave_out]
    if itself:
        signature = _signature(import_target(target, key))
        positional = _value(node, "_args_")
        positional = positional if OmegaConf.is_list(positional) else []
        if signature is not None:
            yield from _signature_problems(signature, target, key, node, names, positional, partial)
    if not inside:
        return
    recursive = _value(node, "_recursive_") is not False
    for name in names:
        for path, child in _nested_targets(node._get_node(name), f"{key}.{name}"):
            yield from _node_problems(child, path, partial=partial or not recursive)


def _signature_problems(
    signature: inspect.Signature, target: str, key: str, node: Any, names: List[str], positional: list, partial: bool
) -> Iterator[str]:
    parameters = signature.parameters
    kinds = inspect.Parameter
    takes_any_key = any(p.kind == kinds.VAR_KEYWORD for p in parameters.values())
    by_name = [n for n, p in parameters.items() if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]
    takes = f"{target}({', '.join(by_name)})"
    for name in names:
        if name not in by_name and not takes_any_key:
            close = difflib.get_close_matches(str(name), by_name, n=1)
            hint = f"did you mean {key}.{close[0]}? " if close else ""
            yield f"{key}.{name} is not an argument of {takes}; {hint}fix the key, or drop it with ~{key}.{name}."
    filled = [n for n, p in parameters.items() if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)][: len(positional)]
    if not partial:
        for name, parameter in parameters.items():
            required = parameter.default is kinds.empty and parameter.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
            if required and name not in names and name not in filled:
                yield f"{key}.{name} is missing, and {takes} requires it; add it with +{key}.{name}=<value>."
    for index, name in enumerate(filled):
        yield from _value_problem(parameters[name], target, f"{key}._args_[{index}]", positional, index)
    for name in names:
        if name in parameters and parameters[name].kind != kinds.POSITIONAL_ONLY:
            yield from _value_problem(parameters[name], target, f"{key}.{name}", node, name)


def _value_problem(parameter: inspect.Parameter, target: str, key: str, node: Any, name: Any) -> Iterator[str]:
    expected = checkable(parameter.annotation)
    if expected is UNKNOWN:
        return
    value = _plain_value(node, name)
    # null is left alone: a value raydra fills in before the workers build (data.num_classes of data
    # that describes itself, and the model's ${data.num_classes}), or one a module fills itself.
    if value is UNKNOWN or value is None:
        return
    if _fits(expected, value):
        return
    example = ""
    if parameter.default not in (inspect.Parameter.empty, None, (), []) and _is_plain(parameter.default):
        if _fits(expected, parameter.default):
            example = f", e.g. {key}={shown(parameter.default)}"
    what = phrase(expected)
    yield f"{key}={shown(value)} is not {what} ({target} takes {parameter.name}: {_annotation_text(parameter.annotation)}); give it {what}{example}."


def _signature(callable_: Any) -> Optional[inspect.Signature]:
    """The signature with its annotations evaluated (a module with `from __future__ import
    annotations` holds strings); unevaluated where a name cannot be found; None without one."""
    try:
        return inspect.signature(callable_, eval_str=True)
    except (TypeError, ValueError):
        return None
    except Exception:  # a string annotation naming what only type checkers import
        try:
            return inspect.signature(callable_)
        except (TypeError, ValueError):
            return None


def _nested_targets(node: Any, key: str) -> Iterator[Tuple[str, Any]]:
    """The `_target_` nodes at or inside `node` that instantiate builds on its way down: a dict
    with a `_target_` is one (and holds its own); the items of other dicts and lists are looked into."""
    if OmegaConf.is_dict(node):
        if "_target_" in node:
            yield key, node
            return
        for name in node.keys():
            yield from _nested_targets(node._get_node(name), f"{key}.{name}")
    elif OmegaConf.is_list(node):
        for index in range(len(node)):
            yield from _nested_targets(node._get_node(index), f"{key}[{index}]")


def _value(node: Any, name: str) -> Any:
    """node[name] resolved, or None when it cannot be here."""
    try:
        return node[name]
    except Exception:
        return None


def _plain_value(node: Any, name: Any) -> Any:
    """node[name] as the plain value the callable receives, or UNKNOWN: not resolvable here
    (a missing value, a Hydra resolver outside Hydra's run), or built by instantiate."""
    try:
        value = node[name]
        if OmegaConf.is_config(value):
            if any(True for _ in _nested_targets(value, "")):
                return UNKNOWN
            value = OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
    except Exception:
        return UNKNOWN
    return value


def checkable(annotation: Any) -> Any:
    """`annotation` reduced to what a config value can be checked against, or UNKNOWN."""
    if annotation is inspect.Parameter.empty or annotation is Any or isinstance(annotation, (str, typing.ForwardRef, typing.TypeVar)):
        return UNKNOWN
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return checkable(args[0])
    if origin is typing.Literal:
        return annotation
    if origin in (typing.Union, types.UnionType):
        members = [checkable(member) for member in args]
        if any(member is Any for member in members):
            return UNKNOWN
        kept = [member for member in members if member is not UNKNOWN]
        return typing.Union[tuple(kept)] if kept else UNKNOWN
    if origin in CONTAINERS:
        if not args:
            return origin
        inner = tuple(a if a is Ellipsis else (Any if checkable(a) is UNKNOWN else checkable(a)) for a in args)
        generic: Any = origin  # subscripted at run time, with arguments known only then
        return generic[inner[0] if len(inner) == 1 else inner]
    if origin is not None:
        return UNKNOWN  # Callable[...], Type[...], a user's generic class
    if isinstance(annotation, type):
        if annotation in PLAIN_TYPES or issubclass(annotation, (enum.Enum, pathlib.PurePath)):
            return annotation
        if annotation in CONTAINERS:
            return annotation
    if annotation is None:
        return type(None)
    return UNKNOWN


def _fits(expected: Any, value: Any) -> bool:
    from pydantic import ValidationError

    adapter = _adapter(expected)
    if adapter is None:
        return True
    try:
        adapter.validate_python(value)
    except ValidationError:
        return False
    return True


def _adapter(expected: Any) -> Any:
    try:
        return _cached_adapter(expected)
    except TypeError:  # unhashable (a Literal of a list): built each time
        return _new_adapter(expected)


@functools.lru_cache(maxsize=None)
def _cached_adapter(expected: Any) -> Any:
    return _new_adapter(expected)


def _new_adapter(expected: Any) -> Any:
    from pydantic import ConfigDict, TypeAdapter

    try:
        # Lax mode, numbers taken for strings: what OmegaConf's own typed fields accept.
        return TypeAdapter(expected, config=ConfigDict(coerce_numbers_to_str=True))
    except Exception:  # a type pydantic cannot build a check for: not checked
        return None


def phrase(expected: Any, article: bool = True) -> str:
    """What `expected` asks for, in words: "a float", "a list of integers", "one of 'min' or 'max'"."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin in (typing.Union, types.UnionType) or expected is bool:
        # Each alternative once, null last: "an integer or null", "true, false or null".
        words = []
        for member in sorted(args or (bool,), key=lambda m: m is type(None)):
            words += ["true", "false"] if member is bool else [phrase(member, article)]
        return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]
    if origin is typing.Literal:
        return "one of " + ", ".join(shown(v) for v in args)
    if origin in CONTAINERS or expected in CONTAINERS:
        kind = "dict" if (origin or expected) in (dict, collections.abc.Mapping, collections.abc.MutableMapping) else "list"
        items = args[-1:] if kind == "dict" else args
        if origin in (tuple,) and args and Ellipsis not in args and len(args) > 1:
            return f"a list of {len(args)} ({', '.join(phrase(a, False) for a in args)})"
        items = [a for a in items if a is not Ellipsis and a is not Any]
        return f"a {kind}" + (f" of {_plural(phrase(items[0], False))}" if items else "")
    if isinstance(expected, type) and issubclass(expected, enum.Enum):
        return "one of " + ", ".join(shown(m.value) for m in expected)
    words = {int: "integer", float: "float", str: "string", bytes: "bytes", type(None): "null"}
    noun = words.get(expected) or ("path" if isinstance(expected, type) and issubclass(expected, pathlib.PurePath) else str(expected))
    if not article or expected in (type(None), bytes):
        return noun
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _plural(noun: str) -> str:
    return noun if " or " in noun or noun.endswith("s") or noun == "null" else f"{noun}s"


def _annotation_text(annotation: Any) -> str:
    """The annotation as its source would read it: `float | Tensor`, `Sequence[int]`, `str | None`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_annotation_text(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is not None:
        name = getattr(annotation, "_name", None) or getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_annotation_text(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    if annotation is Ellipsis:
        return "..."
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _is_plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    return isinstance(value, (bool, int, float, str))


def shown(value: Any) -> str:
    """A value as it is typed on the command line: [1,2], null, true, 'min' for a Literal's string."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(shown(v) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
    return str(value)


def _is_dict(node: Any) -> bool:
    return OmegaConf.is_dict(node)
