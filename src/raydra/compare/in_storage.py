"""Runs in storage (`s3://bucket/prefix/runs/...?endpoint_override=...`, any URI raydra.storage reaches)
as compare and show read them: listed in one request, and their record files (RECORD_FILES) downloaded
into a scratch directory, side by side, to be read as a run directory on a disk is. The rest of a
run there (checkpoints, logs, samples, wandb: up to gigabytes) is only listed, to say what exists.

pyarrow and raydra.storage are imported only when a URI is given.
"""

import os
import posixpath
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from raydra.errors import whole_message
from raydra.records import layout
from raydra.storage import is_uri

# The files compare and show read: from storage only these are downloaded.
RECORD_FILES = (layout.SUMMARY, layout.METRICS, layout.CONFIG, layout.OVERRIDES, layout.HYDRA_RECORD)


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
