"""`raydra rerun RUN_DIR [overrides]`: run a recorded run again from its own record.

The recorded `.hydra/config.yaml` becomes the primary config, on raydra's schema and its `hydra`
settings (run directory, logging, launcher), so every value is the one the run had, not today's
defaults, and the new run lands in a new run directory under `paths.outputs` like any other (Hydra's
own `--experimental-rerun` keeps neither: Hydra #1805). Overrides given here apply on top. The new
run then goes through raydra.entry, train.py's path. Its summary.json records `reproduces: RUN_DIR`
and its overrides.yaml says so in a comment, so `raydra compare OLD NEW` shows whether they agree.
"""

import dataclasses
import shutil
import sys
import tempfile
from pathlib import Path
from typing import List

import yaml

from raydra.entry import CONF_DIR
from raydra.records import layout, trust
from raydra.redact import masked_stderr

PRIMARY = "recorded"


def primary_config(recorded: dict) -> dict:
    """The recorded config as a primary config: schema first, then its values, then raydra's hydra
    settings (found through the search path, as train.yaml's `- hydra: default`)."""
    return {"defaults": ["raydra_schema", "_self_", {"hydra": "default"}], **recorded, "hydra": {"searchpath": [f"file://{CONF_DIR}"]}}


def mark(new_run_dir: Path, reproduces: str) -> None:
    from raydra.records import summary

    if (new_run_dir / layout.SUMMARY).is_file():
        run = summary.read(new_run_dir)
        summary.write(new_run_dir, dataclasses.replace(run, reproduces=reproduces))
    overrides = new_run_dir / layout.OVERRIDES
    if overrides.is_file():
        overrides.write_text(f"# raydra rerun of {reproduces}\n" + overrides.read_text())


# Hydra's flags that print the composed config (or help) and run nothing.
PRINT_ONLY = ("--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i")


def rerun(run_dir: str, overrides: List[str], trusted: bool = False) -> int:
    """Run `run_dir`'s recorded config again with `overrides` on top. A run not made on this
    machine is refused, naming what it would import, unless `trusted` (raydra.records.trust)."""
    source = Path(run_dir).expanduser().resolve()
    config_file = source / layout.CONFIG
    if not config_file.is_file():
        print(f"raydra rerun: {run_dir} has no .hydra/config.yaml; pass the directory of one recorded run.", file=sys.stderr)
        return 1
    if not CONF_DIR.is_dir():
        print(f"raydra rerun: raydra's config directory {CONF_DIR} is missing; reinstall raydra.", file=sys.stderr)
        return 1
    try:
        recorded = yaml.safe_load(config_file.read_text())
    except yaml.YAMLError as error:
        print(
            f"raydra rerun: {config_file} is not readable YAML ({' '.join(str(error).split())[:200]}); it cannot be re-run.",
            file=sys.stderr,
        )
        return 1
    if not isinstance(recorded, dict):
        print(f"raydra rerun: {config_file} holds no config; it cannot be re-run.", file=sys.stderr)
        return 1
    if not trusted and not trust.made_here(source) and not any(o.split("=")[0] in PRINT_ONLY for o in overrides):
        print(f"raydra {trust.refuse_foreign(source, recorded, 'rerun', '--trusted (raydra rerun --trusted RUN_DIR)')}", file=sys.stderr)
        return 1

    import hydra
    from hydra.core.hydra_config import HydraConfig

    from raydra.config.schema import register_schemas
    from raydra.entry import main as run

    register_schemas()
    scratch = Path(tempfile.mkdtemp(prefix="raydra-rerun-"))
    (scratch / f"{PRIMARY}.yaml").write_text(
        f"# The config of {source}, re-run by raydra rerun.\n" + yaml.safe_dump(primary_config(recorded), sort_keys=False)
    )

    @hydra.main(version_base="1.3", config_path=str(scratch), config_name=PRIMARY)
    def app(cfg):
        try:
            return run(cfg)
        finally:
            mark(Path(HydraConfig.get().runtime.output_dir), str(source))

    sys.argv = ["raydra rerun", *overrides]
    try:
        with masked_stderr():  # Hydra's own failure lines quote overrides (raydra.entry.hydra_main)
            app()
    except SystemExit as done:
        return int(done.code or 0) if not isinstance(done.code, str) else 1
    finally:
        # Hydra composed from it, and the new run's .hydra/ holds what it composed: each rerun
        # left one of these in the temp dir.
        shutil.rmtree(scratch, ignore_errors=True)
    return 0
