"""Keep secrets out of everything a run writes: summary.json, logged configs, Hydra's records.

A secret is a value stored under a name that names a secret: an environment variable's
(WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY), a config key's (logger.wandb.api_key, password)
or a `name=value` override's. A name is read as words, split at anything but letters and digits
and at case changes (`HF_TOKEN` -> hf token, `apiKey` -> api key), and names a secret when

- its last word is key, token, auth, apikey or authorization (api_key, access_token, http_auth),
  or it ends in access key id (AWS_ACCESS_KEY_ID), or
- any word contains password, passwd, passphrase, secret or credential (PGPASSWORD,
  client_secret, GOOGLE_APPLICATION_CREDENTIALS): letters no ordinary config word holds.

Key and token are different: their letters sit inside ordinary words (model.parts.tokenizer,
keyframes, monkey), a plural names a count or a list (max_tokens, exclude_keys), a first word names
a part (key_dim, token_dropout), and a tokenizer's special tokens (pad_token, eos_token) name
vocabulary entries. Masking those would hide the config and make resume= refuse an unchanged run.

An override is masked by the same rule at any depth of its value: all of it when its own name names
a secret (`+logger.wandb.api_key=...`), else each value under a secret-named key of a dict inside it
(`ray.runtime_env={env_vars: {MY_API_TOKEN: ...}}`), read with Hydra's override grammar and written
back in it, so that the masked override means what it did with *** for each secret. Text that is
no override in that grammar (a log line that goes on after one) has such entries masked as text.
"""

import contextlib
import logging
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Iterator, List, Optional

import yaml

from raydra.storage import replacing

MASK = "***"
# Shorter values (e.g. "1" in SOME_KEY=1) are flags, not secrets, and would mask half the text.
MIN_SECRET_LENGTH = 6
SECRET_LAST_WORDS = {"key", "token", "auth", "apikey", "authorization"}
SECRET_LETTERS = ("password", "passwd", "passphrase", "secret", "credential")
# A tokenizer's special tokens (pad_token: "<pad>") are vocabulary, not credentials.
SPECIAL_TOKENS = {"bos", "eos", "pad", "unk", "sep", "cls", "mask"}
# Word boundaries inside a name: lower->Upper (apiKey), and the end of an acronym (HFToken -> HF Token).
CASE_CHANGE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
# `name=value` in a string: one override (`+logger.wandb.api_key=...`), or an item of a joined list
# of them (Hydra's override_dirname: `+a=1,+logger.wandb.api_key=...,b=2`), or of a printed Python
# list (Hydra's "Error executing job with overrides: ['a=1', '+logger.wandb.api_key=...']"). The
# value runs up to the next item (a comma or space, then another `name=`, each maybe quoted) or the
# end of the line (a closing quote, and the list's bracket after it, left out: a bracket alone is
# the value's own, `hooks=[...]`).
ASSIGNMENT = re.compile(
    r"(?:^|(?<=[,\s'\"\[]))(?P<name>[+~]{0,2}[A-Za-z_][\w.\-/@]*)=(?P<value>.*?)"
    r"(?=['\"]?[,\s]+['\"]?[+~]{0,2}[A-Za-z_][\w.\-/@]*=|(?:['\"]\]?)?$)",
    re.MULTILINE,
)

# `key:` of a dict written in an override's value (`{env_vars: {MY_API_TOKEN: x}}`): only a value
# that has one named like a secret is parsed (Hydra's parser takes about a millisecond an override).
# The grammar quotes no key: what a quoted string holds (up to its close, or the end of a value a
# line cut short) is a string's text.
DICT_KEY = re.compile(r"(?P<key>[^\s{}\[\],:'\"=()]+)\s*:")
QUOTED = re.compile(r"'(?:\\.|[^'\\])*(?:'|$)|\"(?:\\.|[^\"\\])*(?:\"|$)")
# The same, as an entry of a dict in text the grammar cannot read: after `{` or `,`.
DICT_ENTRY = re.compile(r"(?<=[{,])\s*(?P<key>[^\s{}\[\],:'\"=()]+)\s*:\s*")
# A string Hydra's grammar reads back as that string when written bare; others are written quoted.
BARE = re.compile(r"[A-Za-z_][\w\-./]*")
NOT_BARE = {"null", "true", "false", "inf", "nan"}  # words the grammar reads as other types

# A storage URI's credentials: query options (`s3://b/p?access_key=...&secret_key=...`, pyarrow's
# names) and user info (`s3://ACCESS:SECRET@bucket/p`).
QUERY_OPTION = re.compile(r"(?<=[?&])(?P<name>[A-Za-z_][\w\-]*)=(?P<value>[^&\s#'\"]*)")
USER_INFO = re.compile(r"(?<=://)[^/@\s:]+:[^/@\s]+@")


def words(name: str) -> List[str]:
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", CASE_CHANGE.sub("_", name)) if w]


def names_a_secret(name: str) -> bool:
    """Whether a value stored under `name` (an environment variable, a config key, an override) is a secret."""
    parts = words(name)
    if not parts:
        return False
    if any(letters in part for part in parts for letters in SECRET_LETTERS):
        return True
    if parts[-3:] == ["access", "key", "id"]:
        return True
    if parts[-1] == "token" and len(parts) > 1 and parts[-2] in SPECIAL_TOKENS:
        return False
    return parts[-1] in SECRET_LAST_WORDS


def secret_values() -> List[str]:
    values = {v for k, v in os.environ.items() if names_a_secret(k) and len(v) >= MIN_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


def redact(value: Any, secrets: List[str] = None) -> Any:
    """A copy of `value` (dicts, lists, strings) with secrets masked."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, dict):
        return {k: MASK if _masked(k, v) else redact(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v, secrets) for v in value)
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, MASK)
        # A URI's credentials, before the override rule reads `?secret_key=...` as part of a value.
        value = QUERY_OPTION.sub(lambda m: f"{m['name']}={MASK}" if names_a_secret(m["name"]) and m["value"] else m[0], value)
        value = USER_INFO.sub(f"{MASK}@", value)
        # An override like `logger.wandb.api_key=abc` names its secret in the same string.
        value = ASSIGNMENT.sub(_mask_assignment, value)
    return value


def _masked(key: Any, value: Any) -> bool:
    # true/false says whether a secret is used, never what it is (use_auth_token: true).
    return isinstance(key, str) and names_a_secret(key) and value not in (None, "") and not isinstance(value, bool)


def _mask_assignment(match: re.Match) -> str:
    name, value = match["name"], match["value"]
    if not value:
        return match[0]
    if names_a_secret(name):
        return f"{name}={MASK}"
    if any(names_a_secret(key) for key in DICT_KEY.findall(QUOTED.sub("''", value))):
        return f"{name}={_mask_inside(name, value)}"
    return match[0]


def _mask_inside(name: str, value: str) -> str:
    """An override's value with the values under secret-named keys inside it masked."""
    override = _parsed(f"{name}={value}")
    if override is None:
        return _mask_entries(value)
    from hydra.core.override_parser.types import ChoiceSweep

    parsed = override.value()
    if isinstance(parsed, ChoiceSweep):
        # A sweep over dicts (`a={token: x},{token: y}`): each choice masked, the sweep kept.
        choices = [_masked_element(_plain(choice)) for choice in parsed.list]
        if choices == [_plain(choice) for choice in parsed.list]:
            return value
        return _sweep_text(parsed, choices)
    masked = _masked_element(parsed)
    # Range and interval sweeps hold numbers, a glob names options: nothing in them is masked.
    return value if masked == parsed else _text(masked)


def _parsed(override: str) -> Any:
    """`override` read by Hydra's own grammar, or None where it is no override in it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_override(override)
    except HydraException:
        return None


def _plain(value: Any) -> Any:
    """A parsed element with its quoted strings as plain strings (what Override.value() gives an element)."""
    from hydra.core.override_parser.types import QuotedString

    if isinstance(value, QuotedString):
        return value.text
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _masked_element(value: Any) -> Any:
    """The config rule, on a value given in an override: a value under a secret-named key is ***."""
    if isinstance(value, dict):
        return {k: MASK if _masked(k, v) else _masked_element(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked_element(v) for v in value]
    return value


def _text(value: Any) -> str:
    """`value` written in Hydra's override grammar, compact as Hydra's sweepers write a job's
    overrides; it reads back as the same value (a string that would read as another type, or that
    holds quotes or characters the grammar keeps for itself, is quoted)."""
    from hydra.core.override_parser.types import Quote, QuotedString, Transformer

    if isinstance(value, dict):
        return "{" + ",".join(f"{Transformer.str(k)}:{_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    if isinstance(value, str) and value != MASK and not (BARE.fullmatch(value) and value.lower() not in NOT_BARE):
        return QuotedString(text=value, quote=Quote.double).with_quotes()
    return Transformer.str(value)


def _sweep_text(sweep: Any, choices: List[Any]) -> str:
    """A choice sweep over `choices`, in the form it was given (`a,b` or `choice(a,b)`), shuffled and tagged as it was."""
    text = ",".join(_text(choice) for choice in choices)
    if not sweep.simple_form:
        text = f"choice({text})"
    if sweep.shuffle:
        text = f"shuffle({text})"
    if sweep.tags:
        text = f"tag({','.join(_text(tag) for tag in sorted(sweep.tags))},{text})"
    return text


def _mask_entries(text: str) -> str:
    """`key: value` entries of dicts in `text` that the grammar cannot read (an override's value
    and the words after it on a line), each value under a secret-named key masked: a quoted string,
    a bracketed dict or list, or what runs up to the next `,`, `}` or `]`."""
    masked, done = [], 0
    for entry in DICT_ENTRY.finditer(text):
        if entry.start() < done or not names_a_secret(entry["key"]):
            continue
        end = _value_end(text, entry.end())
        held = text[entry.end() : end].strip()
        if held and held.lower() not in ("null", "true", "false", "''", '""'):
            masked.append(text[done : entry.end()] + MASK)
            done = end
    return "".join(masked) + text[done:]


def _value_end(text: str, start: int) -> int:
    """Where the value that begins at `start` in `text` ends."""
    closing = {"{": "}", "[": "]"}
    depth, quote, i = 0, None, start
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = None
                if depth == 0:
                    return i + 1
        elif char in "'\"":
            quote = char
        elif char in closing:
            depth += 1
        elif char in "}]" and depth > 0:
            depth -= 1
            if depth == 0:
                return i + 1
        elif char in ",}]\n" and depth == 0:
            return i
        i += 1
    return len(text)


def stands_for_a_secret(override: str) -> bool:
    """Whether `override` holds *** where a secret goes (`api_key=***`, `{env_vars: {HF_TOKEN: ***}}`):
    copied from a record, which holds the mask in place of each secret, it would pass *** as one."""
    # A word in the mask's place is masked by the rule exactly where a secret would be.
    placeholder = "raydraMaskedSecret"
    override = override.replace(MASK, placeholder)
    return redact(override, []).count(placeholder) < override.count(placeholder)


class SecretsFilter(logging.Filter):
    """Masks secrets in every record a handler writes (the console, driver.log, a worker's log): an
    error can quote what it was given, a storage URI with its `?secret_key=` or an override with a key.
    Set on handlers, not loggers, so that records propagated from any logger pass through it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            # What Formatter.formatException would write, masked; the formatter then uses it as it is.
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
        return True


class _MaskedStream:
    """A text stream whose writes pass through redact; everything else is the stream's own."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(redact(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def masked_stderr() -> Iterator[None]:
    """sys.stderr masked while the block runs: what Hydra prints of a failure (the override it
    could not apply, the overrides of a job that raised) goes there, past any logging handler."""
    before = sys.stderr
    sys.stderr = _MaskedStream(before)
    try:
        yield
    finally:
        sys.stderr = before


def redact_yaml_files(directory: Path) -> None:
    """Every YAML file in `directory` masked: Hydra writes a run's .hydra/{config,overrides,hydra}.yaml
    before raydra runs."""
    secrets = secret_values()
    for path in Path(directory).glob("*.yaml"):
        redact_yaml(path, secrets)


def redact_yaml(path: Path, secrets: Optional[List[str]] = None) -> None:
    """A YAML record Hydra wrote (.hydra/*.yaml, a multirun's multirun.yaml), rewritten masked if it
    holds a secret; left as it is otherwise, or where there is none."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return
    data = yaml.safe_load(text)
    cleaned = redact(data, secret_values() if secrets is None else secrets)
    if cleaned != data:
        # Whole or not at all: the jobs of another launcher may read it as it is rewritten.
        with replacing(Path(path)) as tmp:
            Path(tmp).write_text(yaml.safe_dump(cleaned, sort_keys=False))
