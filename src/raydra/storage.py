"""Where a run's files live beyond the driver's disk: a local or NFS path, or a URI that pyarrow's
filesystems reach (s3://, gs://, hdfs://, ...), the same way Ray Train reaches its storage_path.

A URI may carry pyarrow's options as a query (`s3://bucket/prefix?endpoint_override=host:port&scheme=http`
for an S3-compatible store); the standard AWS_* environment variables (credentials, AWS_ENDPOINT_URL,
AWS_DEFAULT_REGION) are read by pyarrow as well. Every function takes a plain path or a URI alike,
so callers never branch on which one they hold. pyarrow is imported by the functions that use it,
so `raydra compare` tells a URI from a path without loading it.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    import pyarrow.fs as pafs


def is_uri(location: str) -> bool:
    """Whether `location` names a remote filesystem (a scheme other than file://)."""
    scheme = urlsplit(str(location)).scheme
    return len(scheme) > 1 and scheme != "file"


def filesystem(location: str) -> Tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem serving `location` and the path within it."""
    import pyarrow.fs as pafs

    location = str(location)
    if not is_uri(location):
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(location.removeprefix("file://")))
    return pafs.FileSystem.from_uri(location)


def join(location: str, *parts: str) -> str:
    """`location` with `parts` appended to its path; a URI keeps its scheme, host and query."""
    location = str(location)
    if not is_uri(location):
        return os.path.join(location, *parts)
    split = urlsplit(location)
    return urlunsplit(split._replace(path=posixpath.join(split.path or "/", *parts)))


def location_of(base: str, fs_path: str) -> str:
    """The location (URI or path) of `fs_path`, a path within the filesystem of `base` (as Ray's
    Result and Checkpoint objects give them: no scheme, no query)."""
    if not is_uri(base):
        return fs_path
    relative = posixpath.relpath(fs_path, filesystem(base)[1])
    return base if relative == "." else join(base, relative)


def exists(location: str) -> bool:
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def is_dir(location: str) -> bool:
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    return fs.get_file_info(path).type == pafs.FileType.Directory


def read_bytes(location: str) -> bytes:
    fs, path = filesystem(location)
    with fs.open_input_stream(path) as stream:
        return stream.read()


def read_text(location: str) -> str:
    return read_bytes(location).decode("utf-8")


def write_bytes(location: str, data: bytes) -> None:
    """Write a whole file. Object stores make it visible at once and whole; a local file is
    written beside and renamed over, so a reader never sees half of it."""
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    fs.create_dir(posixpath.dirname(path), recursive=True)
    if isinstance(fs, pafs.LocalFileSystem):
        with replacing(path) as tmp, fs.open_output_stream(tmp) as stream:
            stream.write(data)
        return
    with fs.open_output_stream(path) as stream:
        stream.write(data)


@contextmanager
def replacing(path: "str | os.PathLike[str]") -> Iterator[str]:
    """The one way raydra replaces a local file whole: write the new one to the path this yields
    (beside `path`), and on leaving the block it is renamed over `path`, so a reader, a kill or a
    full disk never leaves half a file where the whole one was. If the block raises, the partial
    file is removed and `path` stays as it was."""
    # Per thread, too: the driver's SIGTERM thread records a run while its main thread may.
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


@contextmanager
def replacing_tree(path: "str | os.PathLike[str]") -> Iterator[str]:
    """`replacing` for a directory (an export a loader opens by its name): fill the empty
    directory this yields, a hidden sibling of `path`, and on leaving the block it takes `path`'s
    place, an older one there (a resumed run's) removed, so a crash never leaves a half-written
    directory under `path`. If the block raises, the partial directory is removed and `path`
    stays as it was."""
    target = os.fspath(path)
    head, name = os.path.split(target)
    partial, old = os.path.join(head, f".{name}.partial"), os.path.join(head, f".{name}.old")
    shutil.rmtree(partial, ignore_errors=True)  # a crashed export's
    os.makedirs(partial)
    try:
        yield partial
        if os.path.exists(target):
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(partial, target)
            shutil.rmtree(old)
        else:
            os.replace(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def write_text(location: str, text: str) -> None:
    write_bytes(location, text.encode("utf-8"))


def _files(location: str) -> Dict[str, Tuple[int, Optional[int]]]:
    """{relative path: (size, modification time in ns)} of every file below `location`."""
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return {}
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    root = path.rstrip("/") + "/"
    return {info.path[len(root) :]: (info.size, info.mtime_ns) for info in infos if info.type == pafs.FileType.File}


def list_files(location: str) -> List[str]:
    """Every file below `location`, as paths relative to it (sorted); [] where nothing is there."""
    return sorted(_files(location))


def copy_tree(
    source: str, destination: str, skip: Sequence[str] = (), seen: Optional[Dict[str, Tuple[int, Optional[int]]]] = None
) -> List[str]:
    """Copy every file below `source` to the same relative path below `destination`, except those
    whose relative path is or lies below one of `skip`, at any depth (`checkpoints` leaves out
    `trials/<id>/checkpoints/...` too); returns the relative paths copied.

    Files are copied one by one (not pyarrow's copy_files over the whole tree), so a tree with a
    checkpoints/ folder of gigabytes can be mirrored without it. `seen`: a dict this function
    keeps between calls, so that a repeated mirror copies only the files that changed since.
    """
    import pyarrow.fs as pafs

    source_fs, source_path = filesystem(source)
    destination_fs, destination_path = filesystem(destination)
    copied = []
    for relative, stamp in sorted(_files(source).items()):
        if any(_under(relative, s) for s in skip):
            continue
        if seen is not None and seen.get(relative) == stamp:
            continue
        target = posixpath.join(destination_path, relative)
        destination_fs.create_dir(posixpath.dirname(target), recursive=True)
        # A local copy replaces the file whole, as write_bytes does: a reader (or a full disk) never
        # leaves half a metrics.csv where the whole one was.
        local = isinstance(destination_fs, pafs.LocalFileSystem)
        with replacing(target) if local else contextlib.nullcontext(target) as written:
            pafs.copy_files(
                posixpath.join(source_path, relative), written, source_filesystem=source_fs, destination_filesystem=destination_fs
            )
        if seen is not None:
            seen[relative] = stamp
        copied.append(relative)
    return copied


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _under(relative: str, name: str) -> bool:
    """Whether `relative` is `name` or lies below it, `name` standing at any depth of the path."""
    name = name.strip("/")
    return f"/{relative}/".find(f"/{name}/") >= 0
