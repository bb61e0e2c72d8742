"""From the paths compare is given to the runs it puts side by side (collect): found (discovery),
read (recorded_run), kept or left out by config --filter KEY=VALUE, --tag and --exclude-tag, and
each labelled by where it differs from the others."""

import os
import posixpath
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple
from urllib.parse import urlsplit

from raydra.compare.discovery import find_run_dirs
from raydra.compare.recorded_run import RecordedRun, load_remote_runs, load_run
from raydra.compare.run_text import config_text


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
