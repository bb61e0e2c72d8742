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

from raydra import run_record
from raydra.entry import CONF_DIR

PRIMARY = "recorded"


def primary_config(recorded: dict) -> dict:
    """The recorded config as a primary config: schema first, then its values, then raydra's hydra
    settings (found through the search path, as train.yaml's `- hydra: default`)."""
    return {"defaults": ["raydra_schema", "_self_", {"hydra": "default"}], **recorded, "hydra": {"searchpath": [f"file://{CONF_DIR}"]}}


def mark(new_run_dir: Path, reproduces: str) -> None:
    from raydra import record

    if (new_run_dir / run_record.SUMMARY).is_file():
        run = record.read(new_run_dir)
        record.write(new_run_dir, dataclasses.replace(run, reproduces=reproduces))
    overrides = new_run_dir / run_record.OVERRIDES
    if overrides.is_file():
        overrides.write_text(f"# raydra rerun of {reproduces}\n" + overrides.read_text())


def rerun(run_dir: str, overrides: List[str]) -> int:
    source = Path(run_dir).expanduser().resolve()
    config_file = source / run_record.CONFIG
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

    import hydra
    from hydra.core.hydra_config import HydraConfig

    from raydra.entry import main as run
    from raydra.schema import register_schemas

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
        app()
    except SystemExit as done:
        return int(done.code or 0) if not isinstance(done.code, str) else 1
    finally:
        # Hydra composed from it, and the new run's .hydra/ holds what it composed: each rerun
        # left one of these in the temp dir.
        shutil.rmtree(scratch, ignore_errors=True)
    return 0
