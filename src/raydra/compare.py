"""`raydra compare` and `raydra show`: runs and sweeps side by side, from their run directories alone.

Reads `.hydra/config.yaml`, `.hydra/overrides.yaml`, `summary.json` and `metrics.csv` and nothing
else. It never imports ray, torch, wandb or hydra, so it answers in well under a second for hundreds
of runs, on any machine the run directories were copied to. matplotlib is imported only to draw.

Runs in storage (`s3://bucket/prefix/runs/...?endpoint_override=...`, any URI raydra.storage reaches)
are read the same way: their record files are downloaded into a scratch directory and read from
there, while every path shown is the URI. pyarrow is imported only when a URI is given.

Problems with one input (a path that holds no run, a corrupt file, a metric no run logged) become
one-line notes for stderr, and the rest of the comparison still goes ahead.
"""

import base64
import csv
import glob
import html
import io
import json
import math
import os
import posixpath
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

import yaml

from raydra.storage import is_uri

# libyaml's loader is ~10x faster than the pure-Python one, which matters at hundreds of configs.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
NO_SUMMARY = "unknown (no summary.json)"
CORRUPT_SUMMARY = "unknown (corrupt summary.json)"
FIXED_COLUMNS = ("status", "wall_s", "samples/s")
MAX_CELL = 48
MAX_LEGEND = 20
# What marks a directory as a run's, and the files compare and show read. From storage only these
# are downloaded; the rest of a run there (checkpoints, logs, samples, wandb: up to gigabytes) is
# only listed, to say what exists.
RUN_MARKERS = ("summary.json", ".hydra/config.yaml")
RECORD_FILES = ("summary.json", "metrics.csv", ".hydra/config.yaml", ".hydra/overrides.yaml")


@dataclass
class Run:
    dir: Path
    config: Optional[dict] = None
    overrides: List[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    status: str = NO_SUMMARY
    error: Optional[str] = None
    label: str = ""
    flat: dict = field(default_factory=dict)
    curves: Optional[dict] = None  # metrics.csv as {metric: [(step, epoch, value)]}, read on first use
    # The run as named: its directory, or its storage URI, in which case `dir` is a local copy of its
    # record files and `listing` holds every file below the URI (relative to it).
    source: str = ""
    listing: Optional[frozenset] = None

    def __post_init__(self) -> None:
        self.source = self.source or str(self.dir)

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
            return (recorded, None) if is_uri(recorded) else (str(Path(recorded)), Path(recorded).exists())
        location = relocated(recorded, self.summary.get("run_dir"), self.source)
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


def relocated(recorded: str, recorded_run_dir: Any, run_location: str) -> str:
    """Where a file that summary.json names lies once its run is at `run_location`: a run copied to
    storage keeps a summary.json naming files on the disk it was written on (summary["run_dir"]);
    the same files are below the copy. URIs and paths outside that run dir stay as recorded."""
    if is_uri(recorded) or not isinstance(recorded_run_dir, str) or not recorded_run_dir:
        return recorded
    base = recorded_run_dir.rstrip("/") + "/"
    return join_location(run_location, recorded[len(base) :]) if recorded.startswith(base) else recorded


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
            f"cannot be read ({one_line(error)}); check the URI, its endpoint and the credentials "
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
    dirs = {d for d in dirs if posixpath.join(d, "sweep.json") not in files_set}
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
            notes.append(f"{uri} could not be downloaded ({one_line(error)}); it is left out. Check the storage and run again.")
    return fetched


def load_remote_runs(runs: Dict[str, List[str]], notes: List[str]) -> Dict[str, "Run"]:
    fetched = fetch_records(runs, notes)
    return {uri: load_run(local, notes, source=uri, listing=runs[uri]) for uri, local in fetched.items()}


# ---------------------------------------------------------------------------------------------
# Finding and loading runs


def is_run_dir(path: str) -> bool:
    # A tune= sweep directory holds Hydra's record of the invocation too; its sweep.json says it
    # is a sweep, whose runs are below it.
    if os.path.isfile(os.path.join(path, "sweep.json")):
        return False
    return os.path.isfile(os.path.join(path, "summary.json")) or os.path.isfile(os.path.join(path, ".hydra", "config.yaml"))


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


def one_line(error: Exception) -> str:
    return " ".join(str(error).split())[:200]


def read_yaml(path: Path, kind: type, notes: List[str], shown: Optional[str] = None) -> Any:
    """`shown`: how notes name the file (its URI, for a run in storage)."""
    shown = shown or str(path)
    if not path.is_file():
        return None
    try:
        data = yaml.load(path.read_text(), Loader=YAML_LOADER)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        notes.append(f"{shown} is not readable YAML ({one_line(error)}); the run is shown without it.")
        return None
    if data is None:  # an empty file: no overrides, or an empty config
        return kind()
    if not isinstance(data, kind):
        notes.append(f"{shown} holds a {type(data).__name__}, not a {kind.__name__}; the run is shown without it.")
        return None
    return data


def load_run(run_dir: str, notes: List[str], source: Optional[str] = None, listing: Optional[List[str]] = None) -> Run:
    """A run from its directory; for a run in storage, `run_dir` is the local copy of its record
    files, `source` its URI and `listing` every file below that URI."""
    run = Run(Path(run_dir), source=source or "", listing=None if listing is None else frozenset(listing))
    run.config = read_yaml(run.dir / ".hydra" / "config.yaml", dict, notes, run.where(".hydra/config.yaml"))
    run.flat = flatten(run.config) if run.config is not None else {}
    overrides = read_yaml(run.dir / ".hydra" / "overrides.yaml", list, notes, run.where(".hydra/overrides.yaml"))
    path = run.dir / "summary.json"
    if path.is_file():
        try:
            summary = json.loads(path.read_text())
            if not isinstance(summary, dict):
                raise ValueError(f"it holds a JSON {type(summary).__name__}, not an object")
        except (OSError, ValueError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            notes.append(f"{run.where('summary.json')} is corrupt ({one_line(error)}); the run is listed as unknown. Rewrite or delete it.")
            run.status = CORRUPT_SUMMARY
        else:
            run.summary = summary
            run.status = str(summary.get("status") or "unknown")
            run.error = summary.get("error") or None
    if overrides is None:
        overrides = run.summary.get("overrides") if isinstance(run.summary.get("overrides"), list) else []
    run.overrides = [str(o) for o in overrides]
    return run


def flatten(data: dict, prefix: str = "") -> dict:
    """Nested config -> {"model.optimizer.lr": 0.01, ...}; lists stay values, as typed on a command line."""
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def parse_filters(filters: List[str]) -> List[Tuple[str, str]]:
    parsed = []
    for item in filters:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--filter {item!r} is not KEY=VALUE; write it like --filter model.name=vit.")
        parsed.append((key.strip(), value.strip()))
    return parsed


def matches(run: Run, filters: List[Tuple[str, str]]) -> bool:
    for key, wanted in filters:
        if key in run.flat:
            value = run.flat[key]
            # str() as asked, and also the form the table shows (true, null), so what you see filters.
            if wanted not in (str(value), config_text(value)):
                return False
        elif key == "status":
            if wanted != run.status:
                return False
        else:
            return False
    return True


def collect(paths: List[str], filters: List[str], notes: List[str]) -> List[Run]:
    """Discover, load and filter the runs `paths` name; label each relative to what they share."""
    wanted = parse_filters(filters)
    listings: Dict[str, List[str]] = {}
    dirs = find_run_dirs(paths, notes, listings)
    remote = load_remote_runs({d: listings[d] for d in dirs if d in listings}, notes) if listings else {}
    runs = [remote[d] if d in listings else load_run(d, notes) for d in dirs if d in remote or d not in listings]
    for key, _ in wanted:
        if key != "status" and runs and not any(key in r.flat for r in runs):
            notes.append(f"no run has config key {key!r}, so --filter {key}=... matches nothing; check its spelling.")
    shown = [r for r in runs if matches(r, wanted)]
    if runs and not shown and wanted:
        notes.append(f"none of the {len(runs)} runs matches " + " and ".join(f"{k}={v}" for k, v in wanted) + ".")
    set_labels(shown)
    return shown


def label_path(run: Run) -> str:
    """The path labels are cut from: a URI as /bucket/path, so runs in storage share prefixes like files."""
    if run.listing is None:
        return os.path.abspath(run.dir)
    split = urlsplit(run.source)
    return "/" + posixpath.normpath(split.netloc + "/" + split.path.strip("/"))


def set_labels(runs: List[Run]) -> None:
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


def read_curves(run: Run, notes: List[str]) -> Dict[str, List[Tuple[Optional[float], Optional[float], float]]]:
    """metrics.csv (Lightning's CSVLogger: one sparse row per log call) as {metric: [(step, epoch, value)]}."""
    if run.curves is not None:
        return run.curves
    run.curves = {}
    path = run.dir / "metrics.csv"
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
        notes.append(f"{run.where('metrics.csv')} is not readable CSV ({one_line(error)}); its curves are left out.")
    return run.curves


def to_float(text: str) -> Optional[float]:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def metric_mode(metric: str, runs: List[Run]) -> str:
    """max or min: the monitor mode of a run that monitored this metric, else a guess from its name."""
    for run in runs:
        mode = dig(run.summary, "monitor", "mode")
        if dig(run.summary, "monitor", "metric") == metric and mode in ("max", "min"):
            return mode
    return "min" if re.search(r"loss|err|perplexity|time", metric) else "max"


def metric_values(run: Run, metric: str, mode: str, notes: List[str]) -> Tuple[Optional[float], Optional[float]]:
    """(final, best) from summary.json; from metrics.csv when the summary lacks the metric (a run that
    is still running, failed, or predates the summary)."""
    final = number(dig(run.summary, "metrics", "final", metric))
    best = number(dig(run.summary, "metrics", "best", metric))
    if final is None and best is None:
        values = [p[2] for p in read_curves(run, notes).get(metric, [])]
        if values:
            final, best = values[-1], (max if mode == "max" else min)(values)
    return final, best


def choose_metrics(runs: List[Run], asked: Optional[List[str]], notes: List[str]) -> List[str]:
    if not asked:
        monitors = [dig(r.summary, "monitor", "metric") for r in runs]
        chosen = list(dict.fromkeys(m for m in monitors if isinstance(m, str) and m))
        if not chosen and runs:
            notes.append("no run's summary.json names a monitor metric; choose metrics with --metric NAME.")
        return chosen
    chosen = []
    for metric in dict.fromkeys(asked):
        in_summary = any(dig(r.summary, "metrics", part, metric) is not None for r in runs for part in ("final", "best"))
        if in_summary or any(metric in read_curves(r, notes) for r in runs):
            chosen.append(metric)
        else:
            known = ", ".join(known_metrics(runs, notes)) or "none"
            notes.append(f"no run has metric {metric!r} in summary.json or metrics.csv (known: {known}); its columns are left out.")
    return chosen


def known_metrics(runs: List[Run], notes: List[str]) -> List[str]:
    names = {}
    for run in runs:
        for part in ("final", "best"):
            names.update(dict.fromkeys(k for k in (dig(run.summary, "metrics", part) or {}) if k not in ("epoch", "step")))
        names.update(dict.fromkeys(read_curves(run, notes)))
    return sorted(names)


# ---------------------------------------------------------------------------------------------
# The table


def differing_keys(runs: List[Run]) -> List[str]:
    """Config keys whose value is not the same in every run that has a config; a key some lack differs."""
    flats = [r.flat for r in runs if r.config is not None]
    if len(flats) < 2:
        return []
    keys = dict.fromkeys(k for flat in flats for k in flat)
    missing = object()
    # Compare canonical text, so 1 and true and 1.0 differ as they do in YAML.
    canon = lambda v: missing if v is missing else json.dumps(v, sort_keys=True, default=str)  # noqa: E731
    return [k for k in keys if len({canon(flat.get(k, missing)) for flat in flats}) > 1]


def status_text(run: Run) -> str:
    """The status with its reason: "failed: CUDA out of memory", "interrupted by the user"."""
    if not run.error or run.status == "completed":
        return run.status
    error = " ".join(str(run.error).split())
    return error if error.lower().startswith(run.status.lower()) else f"{run.status}: {error}"


def table_columns(keys: List[str], metrics: List[str]) -> List[str]:
    return ["run", *keys, *(f"{part} {m}" for m in metrics for part in ("final", "best")), *FIXED_COLUMNS]


def build_table(
    runs: List[Run], metrics: List[str], keys: List[str], notes: List[str], sort: bool = False, descending: Optional[bool] = None
) -> List[Tuple[Run, Dict[str, Any]]]:
    """One (run, {column: raw value}) per run, in discovery order or sorted by the first metric."""
    rows = []
    modes = {m: metric_mode(m, runs) for m in metrics}
    for run in runs:
        row: Dict[str, Any] = {"run": run.label}
        row.update((k, run.flat.get(k)) for k in keys)
        for metric in metrics:
            row[f"final {metric}"], row[f"best {metric}"] = metric_values(run, metric, modes[metric], notes)
        row["status"] = status_text(run)
        row["wall_s"] = number(run.summary.get("wall_time_s"))
        row["samples/s"] = number(dig(run.summary, "throughput", "samples_per_s"))
        rows.append((run, row))
    if (sort or descending is not None) and metrics:
        metric = metrics[0]
        reverse = descending if descending is not None else modes[metric] == "max"
        value = lambda row: row[f"best {metric}"] if row[f"best {metric}"] is not None else row[f"final {metric}"]  # noqa: E731
        # Runs without the value go last whichever way the rest is sorted.
        ranked = sorted((r for r in rows if value(r[1]) is not None), key=lambda r: value(r[1]), reverse=reverse)
        rows = ranked + [r for r in rows if value(r[1]) is None]
    elif sort or descending is not None:
        notes.append("--sort needs a metric and none was found; the runs are left in directory order.")
    return rows


def config_text(value: Any) -> str:
    """A config value as it would be typed in an override: null, true, 0.001, [1, 2]."""
    if value is None or isinstance(value, (bool, list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def cell_text(column: str, value: Any, keys: List[str]) -> str:
    if value is None:
        return ""
    if column in keys:
        return config_text(value)
    if isinstance(value, float):
        return f"{value:.1f}" if column in ("wall_s", "samples/s") else f"{value:.4g}"
    return str(value)


def export_text(column: str, value: Any, keys: List[str]) -> str:
    """Exports keep every digit, so they parse back to the same numbers."""
    if value is None:
        return ""
    return config_text(value) if column in keys else repr(value) if isinstance(value, float) else str(value)


def clip(text: str, width: int = MAX_CELL, keep_end: bool = True) -> str:
    """Shorten from the middle: run names and paths differ at their ends."""
    if len(text) <= width:
        return text
    if not keep_end:
        return text[: width - 3] + "..."
    head = (width - 3) // 2
    return text[:head] + "..." + text[len(text) - (width - 3 - head) :]


def is_numeric(column: str, rows: List[Tuple[Run, dict]]) -> bool:
    values = [row[column] for _, row in rows if row[column] is not None]
    return bool(values) and all(number(v) is not None for v in values)


def render_table(columns: List[str], rows: List[Tuple[Run, dict]], keys: List[str]) -> str:
    # A failure reason reads from its start; names and paths differ at their ends.
    shorten = lambda c, text: clip(text, 64, keep_end=False) if c == "status" else clip(text)  # noqa: E731
    cells = [[shorten(c, cell_text(c, row[c], keys)) for c in columns] for _, row in rows]
    widths = [max([len(c)] + [len(line[i]) for line in cells]) for i, c in enumerate(columns)]
    right = [is_numeric(c, rows) for c in columns]

    def fmt(line: List[str]) -> str:
        return "  ".join(t.rjust(w) if r else t.ljust(w) for t, w, r in zip(line, widths, right, strict=True)).rstrip()

    return "\n".join([fmt(columns), "  ".join("-" * w for w in widths), *(fmt(line) for line in cells)])


def render_markdown(columns: List[str], rows: List[Tuple[Run, dict]], keys: List[str]) -> str:
    escape = lambda text: text.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(escape(c) for c in columns) + " |"]
    lines.append("|" + "|".join("---:" if is_numeric(c, rows) else "---" for c in columns) + "|")
    lines += ["| " + " | ".join(escape(cell_text(c, row[c], keys)) for c in columns) + " |" for _, row in rows]
    return "\n".join(lines)


def render_csv(columns: List[str], rows: List[Tuple[Run, dict]], keys: List[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*columns, "run_dir"])
    writer.writerows([*(export_text(c, row[c], keys) for c in columns), run.source] for run, row in rows)
    return out.getvalue().rstrip("\n")


def render_json(columns: List[str], rows: List[Tuple[Run, dict]], keys: List[str]) -> str:
    records = [{**{c: row[c] for c in columns}, "run_dir": run.source, "overrides": run.overrides} for run, row in rows]
    return json.dumps(records, indent=2, default=str)


RENDERERS = {"table": render_table, "markdown": render_markdown, "csv": render_csv, "json": render_json}


# ---------------------------------------------------------------------------------------------
# Curves and the HTML report


def run_title(run: Run, keys: List[str]) -> str:
    """A legend entry: the run, and what it set when that is short enough to read (a sweep's axes)."""
    settings = ", ".join(f"{k.rsplit('.', 1)[-1]}={config_text(run.flat[k])}" for k in keys if k in run.flat)
    return f"{clip(run.label, 40)}  {clip(settings, 50, keep_end=False)}" if settings and len(keys) <= 3 else clip(run.label, 60)


def curve_points(run: Run, metric: str, x: str, notes: List[str]) -> Tuple[List[float], List[float]]:
    points = read_curves(run, notes).get(metric, [])
    if x == "step":
        pairs = [(step, value) for step, _, value in points if step is not None]
    else:
        # Per-step metrics are logged many times an epoch: one point per epoch, their mean.
        by_epoch: Dict[float, List[float]] = {}
        for _, epoch, value in points:
            if epoch is not None:
                by_epoch.setdefault(epoch, []).append(value)
        pairs = sorted((epoch, sum(v) / len(v)) for epoch, v in by_epoch.items())
    return [p[0] for p in pairs], [p[1] for p in pairs]


def render_curves(runs: List[Run], metrics: List[str], keys: List[str], x: str, notes: List[str]) -> Dict[str, bytes]:
    """{metric: PNG bytes}, one figure per metric with every run that logged it in metrics.csv."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state to leak

    for run in runs:
        if not (run.dir / "metrics.csv").is_file():
            notes.append(f"{run.source} has no metrics.csv (no csv logger, or it stopped before logging); its curves are left out.")
    pngs = {}
    for metric in metrics:
        fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
        ax = fig.subplots()
        drawn = 0
        for run in runs:
            xs, ys = curve_points(run, metric, x, notes)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 3 else None, linewidth=1.5, label=run_title(run, keys))
                drawn += 1
        if not drawn:
            notes.append(f"no run logged {metric!r} against {x} in metrics.csv; no curve is drawn for it.")
            continue
        ax.set(title=metric, xlabel=x, ylabel=metric)
        ax.grid(alpha=0.3)
        if drawn <= MAX_LEGEND:
            ax.legend(fontsize=7)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        pngs[metric] = buf.getvalue()
    return pngs


def write_plots(pngs: Dict[str, bytes], out_dir: str) -> List[Path]:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    written = []
    for metric, png in pngs.items():
        path = Path(out_dir) / (re.sub(r"[^\w.-]+", "_", metric).strip("_") + ".png")
        path.write_bytes(png)
        written.append(path)
    return written


def run_files(run: Run) -> List[Tuple[str, str, Optional[bool]]]:
    """(what, location, exists) for the files a person looks for; paths summary.json names are kept
    even when gone (the run dir was moved), others only when present. exists is None for a URI
    outside the run's own listing: not checked."""
    named = [(f"{which} checkpoint", dig(run.summary, "checkpoints", which)) for which in ("best", "last")]
    files = [(what, *run.locate(p)) for what, p in named if isinstance(p, str) and p]
    recorded_dir = dig(run.summary, "checkpoints", "dir")
    if isinstance(recorded_dir, str) and recorded_dir:
        location, exists = run.locate(recorded_dir)
        if exists is not False:
            files.append(("checkpoints", location, exists))
    elif run.has("checkpoints"):
        files.append(("checkpoints", run.where("checkpoints"), True))
    own = [
        ("metrics.csv", "metrics.csv"),
        ("samples", "samples"),
        ("wandb", "wandb"),
        ("driver log", "driver.log"),
        ("logs", "logs"),
        ("config", ".hydra/config.yaml"),
        ("summary", "summary.json"),
    ]
    return files + [(what, run.where(relative), True) for what, relative in own if run.has(relative)]


CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #1d1d1f; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.meta { color: #666; margin: 0 0 12px; }
table { border-collapse: collapse; font-size: 13px; }
.scroll { overflow-x: auto; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; white-space: nowrap; }
td.status { white-space: normal; min-width: 24em; }
th { background: #f3f3f5; position: sticky; top: 0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
.completed { color: #1a7f37; } .failed { color: #cf222e; } .running, .interrupted { color: #9a6700; } .unknown { color: #666; }
figure { margin: 0 0 16px; } img { max-width: 100%; border: 1px solid #eee; }
details { border: 1px solid #ddd; border-radius: 6px; padding: 6px 10px; margin: 6px 0; }
summary { cursor: pointer; font-weight: 600; } pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 12px; }
ul.notes li { color: #9a6700; }
"""


def status_class(run: Run) -> str:
    word = run.status.split()[0] if run.status else "unknown"
    return word if word in ("completed", "failed", "running", "interrupted") else "unknown"


def file_link(location: str, exists: Optional[bool]) -> str:
    text = html.escape(str(location))
    if exists is False:
        return f"{text} (missing)"
    if exists is None or is_uri(location):  # no browser opens s3://; the URI is shown to copy
        return text
    return f'<a href="{html.escape(Path(location).resolve().as_uri())}">{text}</a>'


def render_html(
    rows: List[Tuple[Run, dict]], columns: List[str], keys: List[str], pngs: Dict[str, bytes], notes: List[str], title: str
) -> str:
    """One self-contained page: inline CSS, curves as data: URIs, no script, nothing fetched."""
    e = html.escape
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f'<p class="meta">{len(rows)} run(s), written {datetime.now().isoformat(timespec="seconds")} by raydra compare</p>',
        '<div class="scroll"><table><thead><tr>' + "".join(f"<th>{e(c)}</th>" for c in columns) + "</tr></thead><tbody>",
    ]
    numeric = {c: is_numeric(c, rows) for c in columns}
    for i, (run, row) in enumerate(rows):
        cells = []
        for c in columns:
            text = e(cell_text(c, row[c], keys))
            if c == "run":
                text = f'<a href="#run-{i}">{text}</a>'
            cls = f"status {status_class(run)}" if c == "status" else "num" if numeric[c] else ""
            cells.append(f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    if pngs:
        out.append("<h2>Learning curves</h2>")
        for metric, png in pngs.items():
            data = base64.b64encode(png).decode("ascii")
            out.append(f'<figure><img alt="{e(metric)}" src="data:image/png;base64,{data}"></figure>')
    out.append("<h2>Runs</h2>")
    for i, (run, _) in enumerate(rows):
        status = f'<span class="{status_class(run)}">{e(status_text(run))}</span>'
        out.append(f'<details id="run-{i}"><summary>{e(run.label)} &mdash; {status}</summary>')
        out.append(f"<p>directory: {file_link(run.source, True)}</p>")
        out.append("<p>overrides:</p><pre>" + (e("\n".join(run.overrides)) or "(none)") + "</pre>")
        out.append("<ul>" + "".join(f"<li>{e(what)}: {file_link(p, ok)}</li>" for what, p, ok in run_files(run)) + "</ul>")
        config = config_source(run)
        out.append(f"<details><summary>config</summary><pre>{e(config) if config else '(no .hydra/config.yaml)'}</pre></details>")
        out.append("</details>")
    if notes:
        out.append('<h2>Notes</h2><ul class="notes">' + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out)


def config_source(run: Run) -> str:
    """The config as Hydra wrote it (comments and key order kept), not re-dumped."""
    try:
        return (run.dir / ".hydra" / "config.yaml").read_text()
    except (OSError, UnicodeDecodeError):
        return ""


# ---------------------------------------------------------------------------------------------
# `raydra show`


def show_text(run: Run, notes: List[str]) -> str:
    s = run.summary
    lines = [f"run       {run.source}", f"status    {status_text(run)}"]
    for label, key in (("name", "name"), ("run id", "run_id"), ("started", "started_at"), ("finished", "finished_at")):
        if s.get(key):
            lines.append(f"{label:<10}{s[key]}")
    if number(s.get("wall_time_s")) is not None:
        lines.append(f"wall time {s['wall_time_s']:.1f} s")
    if number(dig(s, "throughput", "samples_per_s")) is not None:
        lines.append(f"samples/s {dig(s, 'throughput', 'samples_per_s'):.1f}")
    if s.get("world_size") or s.get("strategy"):
        strategy = s.get("strategy")
        # summary.json records the strategy's settings; older runs only its name.
        name = strategy.get("name", "?") if isinstance(strategy, dict) else strategy or "?"
        lines.append(f"workers   {s.get('world_size', '?')} ({name})")
    if s.get("git_commit"):
        lines.append(f"commit    {s['git_commit']}")

    monitor = dig(s, "monitor", "metric")
    if monitor:
        lines.append(f"monitor   {monitor} ({dig(s, 'monitor', 'mode') or '?'})")
    final, best = dig(s, "metrics", "final") or {}, dig(s, "metrics", "best") or {}
    names = [n for n in dict.fromkeys([*final, *best]) if n not in ("epoch", "step")]
    if names:
        width = max(len(n) for n in names)
        lines += ["", "metrics".ljust(width + 2) + f"{'final':>12}  {'best':>12}"]
        for n in names:
            f_, b_ = (cell_text("", number(d.get(n)), []) for d in (final, best))
            lines.append(f"  {n:<{width}}{f_:>12}  {b_:>12}")
        where = [f"{k} {final[k]}" for k in ("epoch", "step") if k in final]
        if where:
            lines.append(f"  (final at {', '.join(where)})")
    elif run.summary:
        lines += ["", "metrics   none recorded in summary.json"]

    lines += ["", "overrides"] + [f"  {o}" for o in run.overrides or ["(none)"]]
    lines += ["", "files"]
    for what, location, exists in run_files(run):
        lines.append(f"  {what:<16}{location}{'  (missing)' if exists is False else ''}")
    if run.listing is None:
        if sorted((run.dir / "wandb").glob("offline-run-*")):
            lines.append(f"  upload W&B with: wandb sync {run.dir / 'wandb'}/offline-run-*")
    elif any(f.startswith("wandb/offline-run-") for f in run.listing):
        lines.append(f"  upload W&B: copy {run.where('wandb')} to a disk, then run wandb sync on its offline-run-* folders")
    config = config_source(run)
    lines += ["", "config (.hydra/config.yaml)"] + ([f"  {line}" for line in config.rstrip().splitlines()] or ["  (none)"])
    return "\n".join(lines)
