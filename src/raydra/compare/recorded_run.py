"""Finding and reading run directories, on a disk or in storage: the one place that reads the run record's files back
(their names are raydra.records.layout's).


Reads `.hydra/config.yaml`, `.hydra/overrides.yaml`, `summary.json` and `metrics.csv` and nothing
else. It never imports ray, torch, wandb or hydra, so it answers in well under a second for hundreds
of runs, on any machine the run directories were copied to. matplotlib is imported only to draw.

Runs in storage (`s3://bucket/prefix/runs/...?endpoint_override=...`, any URI raydra.storage reaches)
are read the same way: their record files are downloaded into a scratch directory and read from
there, while every path shown is the URI. pyarrow is imported only when a URI is given.

Problems with one input (a path that holds no run, a corrupt file, a metric no run logged) become
one-line notes for stderr, and the rest of the comparison still goes ahead.
"""

import csv
import glob
import json
import math
import os
import posixpath
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

import yaml

from raydra.config.keys import ABSENT, flatten
from raydra.errors import whole_message
from raydra.records import layout
from raydra.records.envelope import RecordError
from raydra.records.summary import Checkpoints, RunRecord
from raydra.storage import is_uri

# libyaml's loader is ~10x faster than the pure-Python one, which matters at hundreds of configs.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
NO_SUMMARY = "unknown (no summary.json)"
NO_RECORD = RunRecord(status="")
CORRUPT_SUMMARY = "unknown (corrupt summary.json)"
UNREADABLE_STATUS = "unknown (unreadable status in summary.json)"
# What marks a directory as a run's, and the files compare and show read. From storage only these
# are downloaded; the rest of a run there (checkpoints, logs, samples, wandb: up to gigabytes) is
# only listed, to say what exists.
RUN_MARKERS = (layout.SUMMARY, layout.CONFIG)
# The root config key of a run's tags (lightning-hydra-template's `tags`): its own column and filter.
TAGS_KEY = "tags"
RECORD_FILES = (layout.SUMMARY, layout.METRICS, layout.CONFIG, layout.OVERRIDES, layout.HYDRA_RECORD)


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
            recorded = self.record.resolve(recorded, self.dir) if self.record else recorded
            return (recorded, None) if is_uri(recorded) else (str(Path(recorded)), Path(recorded).exists())
        location = self.record.resolve(recorded, self.source) if self.record else recorded
        base = self.source.split("?")[0].rstrip("/") + "/"
        if location.split("?")[0].startswith(base):
            return location, self.has(location.split("?")[0][len(base) :])
        return (location, None) if is_uri(location) else (str(Path(location)), Path(location).exists())


# ---------------------------------------------------------------------------------------------
# Runs in storage


def join_location(location: str, relative: str) -> str:
    """`relative` below a directory or a URI (a URI keeps its query: endpoint_override=...)."""
    if not is_uri(location):
        return os.path.join(location, relative)
    from raydra import storage

    return storage.join(location, *relative.split("/"))


def list_remote(uri: str, want: str = "a run or sweep directory") -> Tuple[Optional[List[str]], str]:
    """(every file below `uri`, relative to it; "") or (None, why not: the end of a sentence
    that names the problem and what to do, for "<uri> ...")."""
    import pyarrow.fs as pafs

    from raydra import storage

    scheme = urlsplit(uri).scheme
    try:
        fs, root = storage.filesystem(uri)
        kind = fs.get_file_info(root).type
        if kind == pafs.FileType.NotFound:
            bucket = root.strip("/").split("/")[0]
            if scheme in ("s3", "gs", "gcs") and (bucket == root.strip("/") or fs.get_file_info(bucket).type == pafs.FileType.NotFound):
                return None, (
                    f"does not exist: there is no bucket {bucket!r} at this endpoint; check the bucket name and "
                    "the URI's endpoint_override (or AWS_ENDPOINT_URL)"
                )
            return None, f"does not exist; pass the storage URI of {want}"
        if kind != pafs.FileType.Directory:
            return None, f"is a file; pass the storage URI of {want}"
        root = root.rstrip("/") + "/"
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    except (OSError, ValueError) as error:  # pyarrow: OSError from the store, ArrowInvalid (a ValueError) for the URI
        return None, (
            f"cannot be read ({whole_message(error)}); check the URI, its endpoint and the credentials "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3://)"
        )
    return sorted(i.path[len(root) :] for i in infos if i.type == pafs.FileType.File and i.path.startswith(root)), ""


def run_dirs_in(files: List[str]) -> List[str]:
    """The run directories among `files` (relative paths), as runs_below finds them on a disk:
    "" when the top is a run; a sweep's sweep.json makes it no run; hidden folders and a run's
    own subfolders are not searched; natural order."""
    files_set = set(files)
    dirs = set()
    for f in files:
        for marker in RUN_MARKERS:
            if f == marker:
                dirs.add("")
            elif f.endswith("/" + marker):
                dirs.add(f[: -len(marker) - 1])
    dirs = {d for d in dirs if posixpath.join(d, layout.SWEEP) not in files_set}
    if "" in dirs:
        return [""]
    dirs = {d for d in dirs if not any(part.startswith(".") for part in d.split("/"))}
    dirs = {d for d in dirs if not any(d.startswith(other + "/") for other in dirs)}
    return sorted(dirs, key=lambda d: [natural_key(part) for part in d.split("/")])


def remote_run_dirs(arg: str, notes: List[str]) -> Dict[str, List[str]]:
    """{run URI: its files} for the runs at or below storage URI `arg`, from one listing."""
    files, why = list_remote(arg)
    if files is None:
        notes.append(f"{arg} {why}.")
        return {}
    dirs = run_dirs_in(files)
    if not dirs:
        notes.append(
            f"{arg} is not a run or sweep directory (no summary.json or .hydra/config.yaml in it or below); "
            "pass the storage URI of a run or sweep directory."
        )
    found = {}
    for d in dirs:
        prefix = d + "/" if d else ""
        found[join_location(arg, d) if d else arg] = [f[len(prefix) :] for f in files if f.startswith(prefix)]
    return found


_scratch: Optional[str] = None


def scratch_dir() -> str:
    """This process's directory for the record files of runs in storage, removed at exit: a fresh
    download every time, so a run still going on is never shown from a stale copy."""
    global _scratch
    if _scratch is None:
        import atexit

        _scratch = tempfile.mkdtemp(prefix="raydra-compare-")
        atexit.register(shutil.rmtree, _scratch, True)
    return _scratch


def fetch_records(runs: Dict[str, List[str]], notes: List[str]) -> Dict[str, str]:
    """{run URI: local directory holding its RECORD_FILES}, downloaded side by side (a request
    costs a round trip; hundreds of runs one after another would take minutes)."""
    from raydra import storage

    def fetch(uri: str) -> str:
        local = tempfile.mkdtemp(prefix="run-", dir=scratch_dir())
        fs, root = storage.filesystem(uri)
        for relative in RECORD_FILES:
            if relative in runs[uri]:
                target = Path(local, relative)
                target.parent.mkdir(parents=True, exist_ok=True)
                with fs.open_input_stream(posixpath.join(root, relative)) as stream:
                    target.write_bytes(stream.read())
        return local

    fetched = {}
    with ThreadPoolExecutor(max_workers=16) as pool:
        futures = {uri: pool.submit(fetch, uri) for uri in runs}
    for uri, future in futures.items():
        try:
            fetched[uri] = future.result()
        except (OSError, ValueError) as error:
            notes.append(f"{uri} could not be downloaded ({whole_message(error)}); it is left out. Check the storage and run again.")
    return fetched


def load_remote_runs(runs: Dict[str, List[str]], notes: List[str]) -> Dict[str, "RecordedRun"]:
    fetched = fetch_records(runs, notes)
    return {uri: load_run(local, notes, source=uri, listing=runs[uri]) for uri, local in fetched.items()}


# ---------------------------------------------------------------------------------------------
# Finding and loading runs


def is_run_dir(path: str) -> bool:
    # A tune= sweep directory holds Hydra's record of the invocation too; its sweep.json says it
    # is a sweep, whose runs are below it.
    if os.path.isfile(os.path.join(path, layout.SWEEP)):
        return False
    return any(os.path.isfile(os.path.join(path, marker)) for marker in RUN_MARKERS)


def natural_key(text: str) -> list:
    """Sweep job dirs are 0, 1, ..., 10: order them as numbers, not as strings."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def runs_below(path: str) -> List[str]:
    found: List[str] = []
    try:
        entries = [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    except OSError:
        return found
    for entry in sorted(entries, key=lambda e: natural_key(e.name)):
        # A run dir's own subfolders (checkpoints, wandb, logs) never hold runs: don't walk them.
        if is_run_dir(entry.path):
            found.append(entry.path)
        else:
            found.extend(runs_below(entry.path))
    return found


def find_run_dirs(paths: List[str], notes: List[str], listings: Optional[Dict[str, List[str]]] = None) -> List[str]:
    """Run dirs named by `paths` (run dirs, sweep dirs, globs, storage URIs), in order, each once.
    A run in storage comes back as its URI, with its files put in `listings`."""
    found: Dict[str, str] = {}
    for arg in paths:
        if is_uri(arg):
            for uri, files in remote_run_dirs(arg, notes).items():
                found.setdefault(uri, uri)
                if listings is not None:
                    listings[uri] = files
            continue
        path = os.path.expanduser(arg)
        if any(c in path for c in "*?[") and not os.path.exists(path):
            matches = [m for m in sorted(glob.glob(path, recursive=True), key=natural_key) if os.path.isdir(m)]
            dirs = [d for m in matches for d in ([m] if is_run_dir(m) else runs_below(m))]
            if not dirs:
                notes.append(f"{arg} matches no run or sweep directory; check the pattern.")
        elif not os.path.exists(path):
            notes.append(f"{arg} does not exist; pass a run directory, a sweep directory or a glob.")
            continue
        elif not os.path.isdir(path):
            notes.append(f"{arg} is a file, not a run or sweep directory; pass the directory that holds summary.json.")
            continue
        else:
            dirs = [path] if is_run_dir(path) else runs_below(path)
            if not dirs:
                notes.append(
                    f"{arg} is not a run or sweep directory (no summary.json or .hydra/config.yaml in it or "
                    "below); pass a run directory, a sweep directory or a glob."
                )
        for d in dirs:
            found.setdefault(os.path.realpath(d), d)
    return list(found.values())


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


def config_text(value: Any) -> str:
    """A config value as it would be typed in an override: null, true, 0.001, [1, 2]."""
    if value is None or isinstance(value, (bool, list, dict)):
        return json.dumps(value, default=str)
    return str(value)


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


def parse_filters(filters: List[str]) -> List[Tuple[str, str]]:
    parsed = []
    for item in filters:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--filter {item!r} is not KEY=VALUE; write it like --filter model.name=vit.")
        parsed.append((key.strip(), value.strip()))
    return parsed


def matches(run: RecordedRun, filters: List[Tuple[str, str]]) -> bool:
    for key, wanted in filters:
        if key in run.flat or key in run.choices:
            value = run.value(key)
            # str() as asked, and also the form the table shows (true, null), so what you see filters.
            if wanted not in (str(value), config_text(value)):
                return False
        elif key == "status":
            if wanted != run.status:
                return False
        else:
            return False
    return True


@dataclass(frozen=True)
class TagFilter:
    """--tag and --exclude-tag. A run is kept when it has, for each entry of `required`, at least one
    of that entry's tags (repeated --tag: all of them; --tag a,b: either), and none of `excluded`."""

    required: Tuple[Tuple[str, ...], ...] = ()
    excluded: Tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.required or self.excluded)

    def matches(self, run: RecordedRun) -> bool:
        tags = set(run.tags)
        return all(tags.intersection(anyof) for anyof in self.required) and not tags.intersection(self.excluded)

    def describe(self) -> List[str]:
        """The conditions in words, as the note naming them reads: `tag a or b`, `no tag wip`."""
        return [f"tag {' or '.join(anyof)}" for anyof in self.required] + [f"no tag {tag}" for tag in self.excluded]


def parse_tag_filters(tags: Sequence[str] = (), exclude: Sequence[str] = ()) -> TagFilter:
    """--tag TAG[,TAG] (repeatable) and --exclude-tag TAG[,TAG] (repeatable) as a TagFilter."""

    def split(option: str, item: str) -> Tuple[str, ...]:
        parts = tuple(dict.fromkeys(part.strip() for part in item.split(",")))
        if not all(parts):
            raise ValueError(f"{option} {item!r} holds an empty tag; write it like {option} baseline or {option} baseline,ablation.")
        return parts

    required = tuple(dict.fromkeys(split("--tag", item) for item in tags))
    excluded = tuple(dict.fromkeys(tag for item in exclude for tag in split("--exclude-tag", item)))
    return TagFilter(required, excluded)


def tag_list(runs: List[RecordedRun]) -> str:
    """Every tag the runs have, for a note: what to filter by instead."""
    tags = sorted({tag for run in runs for tag in run.tags})
    return "their tags are " + ", ".join(tags) if tags else "none of them has tags (the config's top-level `tags`, e.g. tags=[baseline])"


def collect(
    paths: List[str], filters: List[str], notes: List[str], tags: Sequence[str] = (), exclude_tags: Sequence[str] = ()
) -> List[RecordedRun]:
    """Discover, load and filter the runs `paths` name (config --filter KEY=VALUE, --tag and
    --exclude-tag); label each relative to what they share. Raises ValueError for a malformed filter."""
    wanted = parse_filters(filters)
    tagged = parse_tag_filters(tags, exclude_tags)
    listings: Dict[str, List[str]] = {}
    dirs = find_run_dirs(paths, notes, listings)
    remote = load_remote_runs({d: listings[d] for d in dirs if d in listings}, notes) if listings else {}
    runs = [remote[d] if d in listings else load_run(d, notes) for d in dirs if d in remote or d not in listings]
    for key, _ in wanted:
        if key != "status" and runs and not any(key in r.flat or key in r.choices for r in runs):
            notes.append(f"no run has config key {key!r}, so --filter {key}=... matches nothing; check its spelling.")
    shown = [r for r in runs if matches(r, wanted) and tagged.matches(r)]
    if runs and not shown and (wanted or tagged):
        conditions = " and ".join(tagged.describe() + [f"{k}={v}" for k, v in wanted])
        notes.append(f"none of the {len(runs)} runs matches {conditions}" + (f"; {tag_list(runs)}." if tagged else "."))
    elif shown:
        # A misspelt alternative (--tag baselin,ablation) still shows runs: say that it found none.
        missing = [tag for anyof in tagged.required for tag in anyof if not any(tag in r.tags for r in runs)]
        for tag in dict.fromkeys(missing):
            notes.append(f"no run is tagged {tag!r}, so --tag {tag} matches nothing; {tag_list(runs)}.")
    set_labels(shown)
    return shown


def label_path(run: RecordedRun) -> str:
    """The path labels are cut from: a URI as /bucket/path, so runs in storage share prefixes like files."""
    if run.listing is None:
        return os.path.abspath(run.dir)
    split = urlsplit(run.source)
    return "/" + posixpath.normpath(split.netloc + "/" + split.path.strip("/"))


def set_labels(runs: List[RecordedRun]) -> None:
    dirs = [label_path(r) for r in runs]
    common = os.path.commonpath(dirs) if len(dirs) > 1 else None
    for run, d in zip(runs, dirs, strict=True):
        run.label = os.path.relpath(d, common) if common and d != common else os.path.basename(d)


# ---------------------------------------------------------------------------------------------
# Metrics


def dig(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


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


def status_text(run: RecordedRun) -> str:
    """The status with its reason: "failed: CUDA out of memory", "interrupted by the user"; and
    what the watchdog found on the way: "completed (hung 1x, restarted; straggler: rank 3)"."""
    if not run.error or run.status == "completed":
        return run.status + watchdog_note(run.recorded)
    error = " ".join(str(run.error).split())
    return error if error.lower().startswith(run.status.lower()) else f"{run.status}: {error}"


def watchdog_note(recorded: RunRecord) -> str:
    """The hangs a run restarted from and the stragglers named in it, in a few words (or nothing)."""
    said = []
    restarted = [h for h in recorded.hangs if h.outcome == "restarted"]
    if restarted:
        said.append(f"hung {len(restarted)}x, restarted")
    if recorded.stragglers:
        said.append("straggler: " + ", ".join(f"rank {s.rank}" for s in recorded.stragglers))
    return f" ({'; '.join(said)})" if said else ""


def watchdog_lines(recorded: RunRecord) -> List[str]:
    """`raydra show`'s account of each hang (where, which rank, how long, what came of it) and straggler."""
    lines = []
    for number, hang in enumerate(recorded.hangs, 1):
        ranks = ", ".join(f"rank {r.rank} on {r.node} (pid {r.pid}, still {number_text(r.still_s)} s)" for r in hang.stopped)
        lines.append(
            f"  hang {number}  {hang.at}: {hang.where}, waited {number_text(hang.waited_s)} s of a {number_text(hang.deadline_s)} s deadline"
        )
        lines.append(f"          stopped: {ranks or 'no rank named'}; {hang.outcome or '?'}; stacks in {hang.diagnostics}")
    for s in recorded.stragglers:
        lines.append(
            f"  straggler rank {s.rank} on {s.node}: {number_text(s.lag_s)} s late to each step of {number_text(s.step_time_s)} s "
            f"(at worst {number_text((s.share or 0) * 100)}%), steps {s.first_step}-{s.last_step}"
        )
    return lines


def number_text(value: Any) -> str:
    """A recorded number as a person reads it ("?" for one that is missing or not a number)."""
    found = number(value)
    return "?" if found is None else f"{found:.3g}"


def run_files(run: RecordedRun) -> List[Tuple[str, str, Optional[bool]]]:
    """(what, location, exists) for the files a person looks for; paths summary.json names are kept
    even when gone (the run dir was moved), others only when present. exists is None for a URI
    outside the run's own listing: not checked."""
    checkpoints = run.record.checkpoints if run.record else Checkpoints()
    named = [(f"{which} checkpoint", getattr(checkpoints, which)) for which in ("best", "last")]
    files = [(what, *run.locate(p)) for what, p in named if p]
    recorded_dir = checkpoints.dir
    if isinstance(recorded_dir, str) and recorded_dir:
        location, exists = run.locate(recorded_dir)
        if exists is not False:
            files.append(("checkpoints", location, exists))
    elif run.has(layout.CHECKPOINTS):
        files.append(("checkpoints", run.where(layout.CHECKPOINTS), True))
    own = [
        ("metrics.csv", layout.METRICS),
        ("samples", layout.SAMPLES),
        ("wandb", layout.WANDB),
        ("driver log", layout.DRIVER_LOG),
        ("logs", layout.LOGS),
        ("diagnostics", layout.DIAGNOSTICS),
        ("config", layout.CONFIG),
        ("summary", layout.SUMMARY),
    ]
    return files + [(what, run.where(relative), True) for what, relative in own if run.has(relative)]


def config_source(run: RecordedRun) -> str:
    """The config as Hydra wrote it (comments and key order kept), not re-dumped."""
    try:
        return (run.dir / layout.CONFIG).read_text()
    except (OSError, UnicodeDecodeError):
        return ""
