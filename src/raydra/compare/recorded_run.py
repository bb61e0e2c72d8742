"""A run directory read back into a RecordedRun: the one place that reads the run record's files
(their names are raydra.records.layout's), for compare, show and the HTML report.

Reads `.hydra/config.yaml`, `.hydra/overrides.yaml`, `.hydra/hydra.yaml`'s choices, `summary.json`
and `metrics.csv` and nothing else. It never imports ray, torch, wandb or hydra, so it answers in
well under a second for hundreds of runs, on any machine the run directories were copied to.

A run in storage is read the same way, from the local copy of its record files (raydra.compare.in_storage),
while every path shown is the URI.

Problems with one run (a corrupt file, a metric no run logged) become one-line notes for stderr,
and the rest of the comparison still goes ahead.
"""

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from raydra.compare.in_storage import fetch_records, join_location
from raydra.config.keys import ABSENT, flatten
from raydra.errors import whole_message
from raydra.records import layout
from raydra.records.envelope import RecordError
from raydra.records.summary import RunRecord
from raydra.storage import is_uri

# libyaml's loader is ~10x faster than the pure-Python one, which matters at hundreds of configs.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
NO_SUMMARY = "unknown (no summary.json)"
NO_RECORD = RunRecord(status="")
CORRUPT_SUMMARY = "unknown (corrupt summary.json)"
UNREADABLE_STATUS = "unknown (unreadable status in summary.json)"
# The root config key of a run's tags (lightning-hydra-template's `tags`): its own column and filter.
TAGS_KEY = "tags"


@dataclass
class RecordedRun:
    """One run as its record reads back (summary.json, .hydra/, metrics.csv): what compare, show
    and the HTML report put side by side."""

    dir: Path
    config: Optional[dict] = None
    overrides: List[str] = field(default_factory=list)
    # summary.json, read (None: there is none, or it is corrupt).
    record: Optional[RunRecord] = None
    status: str = NO_SUMMARY
    error: Optional[str] = None
    label: str = ""
    flat: dict = field(default_factory=dict)
    curves: Optional[dict] = None  # metrics.csv as {metric: [(step, epoch, value)]}, read on first use
    # The run as named: its directory, or its storage URI, in which case `dir` is a local copy of its
    # record files and `listing` holds every file below the URI (relative to it).
    source: str = ""
    listing: Optional[frozenset] = None
    # Hydra's config group choices ({"model": "vit", "logger": "[csv, wandb]"}), from .hydra/hydra.yaml.
    choices: dict = field(default_factory=dict)
    # The config's top-level `tags`, as summary.json records them (the config's, for older runs).
    tags: List[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.source = self.source or str(self.dir)

    @property
    def recorded(self) -> RunRecord:
        """The run's record, or one with every field unset where it has none that reads."""
        return self.record or NO_RECORD

    def value(self, key: str) -> Any:
        """A table column's value: a config group's choice, or a dotted config key (ABSENT if not set)."""
        if key in self.choices:
            return self.choices[key]
        return self.flat.get(key, ABSENT)

    def where(self, relative: str = "") -> str:
        """A file of the run as shown to a person: below its directory or its URI."""
        if self.listing is None:
            return str(self.dir / relative) if relative else str(self.dir)
        return join_location(self.source, relative) if relative else self.source

    def has(self, relative: str) -> bool:
        if self.listing is None:
            return (self.dir / relative).exists()
        return relative in self.listing or any(f.startswith(relative.rstrip("/") + "/") for f in self.listing)

    def locate(self, recorded: str) -> Tuple[str, Optional[bool]]:
        """Where a path summary.json names is now, and whether it is there (None: in storage beyond
        this run, not checked, as that would cost a request per file)."""
        if self.listing is None:
            recorded = self.record.whole_path(recorded, self.dir) if self.record else recorded
            return (recorded, None) if is_uri(recorded) else (str(Path(recorded)), Path(recorded).exists())
        location = self.record.whole_path(recorded, self.source) if self.record else recorded
        base = self.source.split("?")[0].rstrip("/") + "/"
        if location.split("?")[0].startswith(base):
            return location, self.has(location.split("?")[0][len(base) :])
        return (location, None) if is_uri(location) else (str(Path(location)), Path(location).exists())


def read_yaml(path: Path, kind: type, notes: List[str], shown: Optional[str] = None) -> Any:
    """`shown`: how notes name the file (its URI, for a run in storage)."""
    shown = shown or str(path)
    if not path.is_file():
        return None
    try:
        data = yaml.load(path.read_text(), Loader=YAML_LOADER)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        notes.append(f"{shown} is not readable YAML ({whole_message(error)}); the run is shown without it.")
        return None
    if data is None:  # an empty file: no overrides, or an empty config
        return kind()
    if not isinstance(data, kind):
        notes.append(f"{shown} holds a {type(data).__name__}, not a {kind.__name__}; the run is shown without it.")
        return None
    return data


def load_run(run_dir: str, notes: List[str], source: Optional[str] = None, listing: Optional[List[str]] = None) -> RecordedRun:
    """A run from its directory; for a run in storage, `run_dir` is the local copy of its record
    files, `source` its URI and `listing` every file below that URI."""
    run = RecordedRun(Path(run_dir), source=source or "", listing=None if listing is None else frozenset(listing))
    run.config = read_yaml(run.dir / layout.CONFIG, dict, notes, run.where(layout.CONFIG))
    run.flat = flatten(run.config) if run.config is not None else {}
    overrides = read_yaml(run.dir / layout.OVERRIDES, list, notes, run.where(layout.OVERRIDES))
    run.choices = read_choices(run.dir / layout.HYDRA_RECORD)
    path = run.dir / layout.SUMMARY
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            run.record = RunRecord.from_dict(data)
        except (OSError, ValueError, RecordError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            notes.append(
                f"{run.where(layout.SUMMARY)} is corrupt ({whole_message(error)}); the run is listed as unknown. Rewrite or delete it."
            )
            run.status = CORRUPT_SUMMARY
        else:
            # As written: a status that is missing or no string reads as the record's default,
            # running, which this run may never have been.
            status = data.get("status")
            run.status = status if isinstance(status, str) and status else UNREADABLE_STATUS
            run.error = run.record.error or None
            if run.record.problems:
                notes.append(f"{run.where(layout.SUMMARY)}: {'; '.join(run.record.problems)}; those fields are left blank.")
    if overrides is None:
        overrides = run.record.overrides if run.record else []
    run.overrides = [str(o) for o in overrides]
    run.tags = read_tags(run)
    return run


def read_tags(run: RecordedRun) -> List[str]:
    """summary.json's `tags`, else the recorded config's (runs from before summary.json had them):
    a list of strings, a single string as one tag, anything else as none."""
    for recorded in (run.record.tags if run.record and run.record.tags else None, (run.config or {}).get(TAGS_KEY)):
        if isinstance(recorded, str):
            return [recorded]
        if isinstance(recorded, list):
            return list(dict.fromkeys(str(tag) for tag in recorded if tag is not None))
    return []


def read_choices(path: Path) -> dict:
    """The config groups a run chose (hydra.runtime.choices), Hydra's own groups left out. Only that
    block of hydra.yaml is parsed: the whole file is 10x the config and this runs per run. A missing
    or unreadable file means no choices: the keys the groups set still show one by one."""
    try:
        lines = path.read_text().splitlines()
        start = lines.index("    choices:") + 1
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    end = start
    while end < len(lines) and lines[end].startswith("      "):
        end += 1
    try:
        block = yaml.load("\n".join(line[6:] for line in lines[start:end]), Loader=YAML_LOADER) or {}
    except yaml.YAMLError:
        return {}
    if not isinstance(block, dict):
        return {}
    # A list of options (logger=[csv,wandb]) shows as typed; null (no choice) is a choice too.
    return {
        str(k): "[" + ", ".join(map(str, v)) + "]" if isinstance(v, list) else v for k, v in block.items() if not str(k).startswith("hydra")
    }


def load_remote_runs(runs: Dict[str, List[str]], notes: List[str]) -> Dict[str, "RecordedRun"]:
    fetched = fetch_records(runs, notes)
    return {uri: load_run(local, notes, source=uri, listing=runs[uri]) for uri, local in fetched.items()}


def number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if isinstance(value, float) and math.isnan(value) else value


def read_curves(run: RecordedRun, notes: List[str]) -> Dict[str, List[Tuple[Optional[float], Optional[float], float]]]:
    """metrics.csv (Lightning's CSVLogger: one sparse row per log call) as {metric: [(step, epoch, value)]}."""
    if run.curves is not None:
        return run.curves
    run.curves = {}
    path = run.dir / layout.METRICS
    if not path.is_file():
        return run.curves
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            step_at = header.index("step") if "step" in header else None
            epoch_at = header.index("epoch") if "epoch" in header else None
            columns = [(i, run.curves.setdefault(name, [])) for i, name in enumerate(header) if name not in ("step", "epoch")]
            for row in reader:
                step = to_float(row[step_at]) if step_at is not None and step_at < len(row) else None
                epoch = to_float(row[epoch_at]) if epoch_at is not None and epoch_at < len(row) else None
                for i, points in columns:
                    value = to_float(row[i]) if i < len(row) else None
                    if value is not None:
                        points.append((step, epoch, value))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        notes.append(f"{run.where(layout.METRICS)} is not readable CSV ({whole_message(error)}); its curves are left out.")
    return run.curves


def to_float(text: str) -> Optional[float]:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def config_source(run: RecordedRun) -> str:
    """The config as Hydra wrote it (comments and key order kept), not re-dumped."""
    try:
        return (run.dir / layout.CONFIG).read_text()
    except (OSError, UnicodeDecodeError):
        return ""
