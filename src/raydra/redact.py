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
"""

import contextlib
import logging
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Iterator, List

import yaml

from raydra.run_record import HYDRA_DIR

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
# end of the line (a closing quote and bracket left out).
ASSIGNMENT = re.compile(
    r"(?:^|(?<=[,\s'\"\[]))(?P<name>[+~]{0,2}[A-Za-z_][\w.\-/@]*)=(?P<value>.*?)"
    r"(?=['\"]?[,\s]+['\"]?[+~]{0,2}[A-Za-z_][\w.\-/@]*=|['\"]?\]?$)",
    re.MULTILINE,
)

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
    if match["value"] and names_a_secret(match["name"]):
        return f"{match['name']}={MASK}"
    return match[0]


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


def redact_hydra_records(run_dir: Path) -> None:
    """Hydra writes .hydra/{config,overrides,hydra}.yaml before raydra runs; mask secrets there too."""
    secrets = secret_values()
    for path in Path(run_dir, HYDRA_DIR).glob("*.yaml"):
        text = path.read_text()
        data = yaml.safe_load(text)
        cleaned = redact(data, secrets)
        if cleaned != data:
            path.write_text(yaml.safe_dump(cleaned, sort_keys=False))
