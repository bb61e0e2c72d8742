"""Keep secrets out of everything a run writes: summary.json, logged configs, Hydra's records.

A secret is the value of any environment variable whose name contains KEY, TOKEN, SECRET or
PASSWORD (WANDB_API_KEY, HF_TOKEN, ...), and any config value stored under a key with such a name.
"""

import os
import re
from pathlib import Path
from typing import Any, List

import yaml

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
MASK = "***"
# Shorter values (e.g. "1" in SOME_KEY=1) are flags, not secrets, and would mask half the text.
MIN_SECRET_LENGTH = 6


def secret_values() -> List[str]:
    values = {v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


def redact(value: Any, secrets: List[str] = None) -> Any:
    """A copy of `value` (dicts, lists, strings) with secrets masked."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, dict):
        return {
            k: MASK if isinstance(k, str) and SECRET_NAME.search(k) and v not in (None, "") else redact(v, secrets)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v, secrets) for v in value)
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, MASK)
        # An override like `logger.wandb.api_key=abc` names its secret in the same string.
        key, sep, rest = value.partition("=")
        if sep and SECRET_NAME.search(key) and rest:
            value = f"{key}={MASK}"
    return value


def redact_hydra_records(run_dir: Path) -> None:
    """Hydra writes .hydra/{config,overrides,hydra}.yaml before raydra runs; mask secrets there too."""
    secrets = secret_values()
    for path in Path(run_dir, ".hydra").glob("*.yaml"):
        text = path.read_text()
        data = yaml.safe_load(text)
        cleaned = redact(data, secrets)
        if cleaned != data:
            path.write_text(yaml.safe_dump(cleaned, sort_keys=False))
