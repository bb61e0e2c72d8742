"""raydra.storage on local paths: the same calls serve URIs through pyarrow (tests/system/test_cluster_storage.py
runs them against an S3 server)."""

import os

from raydra import storage


def test_local_paths_and_uris_are_told_apart():
    assert storage.is_uri("s3://bucket/prefix?endpoint_override=127.0.0.1:9000")
    assert storage.is_uri("gs://bucket/x")
    assert not storage.is_uri("/data/outputs") and not storage.is_uri("outputs/runs")
    assert not storage.is_uri("file:///data/outputs")
    assert storage.join("s3://b/p?scheme=http", "runs", "a") == "s3://b/p/runs/a?scheme=http"
    assert storage.join("/x/y", "runs") == "/x/y/runs"


def test_copy_tree_mirrors_files_and_leaves_out_what_it_is_told(tmp_path):
    source, target = tmp_path / "run", tmp_path / "copy"
    storage.write_text(str(source / "summary.json"), "{}")
    storage.write_text(str(source / "logs" / "worker_0.log"), "hello")
    storage.write_text(str(source / "checkpoints" / "r" / "checkpoint_000000" / "checkpoint.ckpt"), "big")
    copied = storage.copy_tree(str(source), str(target), skip=["checkpoints"])
    assert copied == ["logs/worker_0.log", "summary.json"]
    assert storage.read_text(str(target / "logs" / "worker_0.log")) == "hello"
    assert not (target / "checkpoints").exists()
    assert storage.list_files(str(tmp_path / "missing")) == []
    assert storage.exists(str(source / "summary.json")) and storage.is_dir(str(source / "logs"))


def test_the_last_checkpoint_is_the_newest_checkpoint_folder_not_rays_snapshot(tmp_path):
    from raydra.records.checkpoints import last_checkpoint

    run = tmp_path / "checkpoints" / "run-1"
    storage.write_text(str(run / "checkpoint_manager_snapshot.json"), "{}")
    assert last_checkpoint(tmp_path, "run-1") is None
    storage.write_text(str(run / "checkpoint_2026-11-23_21-00-01.000001" / "checkpoint.ckpt"), "a")
    storage.write_text(str(run / "checkpoint_2026-11-23_21-00-09.000001" / "checkpoint.ckpt" / "meta.pt"), "sharded")
    assert last_checkpoint(tmp_path, "run-1") == str(run / "checkpoint_2026-11-23_21-00-09.000001" / "checkpoint.ckpt")


def test_replacing_renames_the_whole_new_file_over_and_leaves_the_old_one_if_the_write_fails(tmp_path):
    import pytest

    path = tmp_path / "metrics.csv"
    path.write_text("old\n")
    with storage.replacing(path) as tmp:
        assert path.read_text() == "old\n"  # a reader sees the old file until the new one is whole
        open(tmp, "w").write("new\n")
    assert path.read_text() == "new\n"
    with pytest.raises(OSError):
        with storage.replacing(path) as tmp:
            open(tmp, "w").write("ha")
            raise OSError(28, "No space left on device")
    assert path.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]


def test_replacing_tree_puts_a_whole_new_directory_in_place_and_leaves_the_old_one_if_the_write_fails(tmp_path):
    """How an export (SD's pipeline/, a ViT's hf/) replaces an earlier one: a loader that opens the
    folder by its name never finds half of it."""
    import pytest

    target = tmp_path / "hf"
    target.mkdir()
    (target / "config.json").write_text("old")
    with pytest.raises(OSError):
        with storage.replacing_tree(target) as partial:
            open(os.path.join(partial, "model.safetensors"), "w").write("ha")
            raise OSError(28, "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"] and os.listdir(target) == ["config.json"]
    with storage.replacing_tree(target) as partial:
        assert os.listdir(partial) == [] and (target / "config.json").read_text() == "old"
        open(os.path.join(partial, "config.json"), "w").write("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"] and (target / "config.json").read_text() == "new"


def test_workers_restoring_a_checkpoint_from_object_storage_each_read_their_own_download(tmp_path, monkeypatch):
    # Ray's Checkpoint.as_directory gives a node's workers one shared directory, and a worker coming
    # after another's download downloads again over the files it reads (CI, on S3). A filesystem that
    # is not the local one (a SubTree over it: read like object storage) takes the download path.
    import contextlib
    import tempfile

    import pyarrow.fs
    import ray.train

    from raydra.records.layout import CHECKPOINT_FILE
    from raydra.worker import loop

    saved = tmp_path / "storage" / "checkpoint_000001"
    saved.mkdir(parents=True)
    (saved / CHECKPOINT_FILE).write_bytes(b"weights")
    remote = ray.train.Checkpoint(
        "checkpoint_000001", filesystem=pyarrow.fs.SubTreeFileSystem(str(tmp_path / "storage"), pyarrow.fs.LocalFileSystem())
    )
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: remote)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))

    # A killed attempt's copy (no clean-up ran) is replaced by the next attempt's, not kept beside it.
    left = loop._restored_checkpoint_path(contextlib.ExitStack(), "run-a", 0)
    with open(left, "wb") as file:
        file.write(b"half")
    with contextlib.ExitStack() as first:
        rank0 = loop._restored_checkpoint_path(first, "run-a", 0)
        assert rank0 == left and open(rank0, "rb").read() == b"weights"
        with contextlib.ExitStack() as second:
            rank1 = loop._restored_checkpoint_path(second, "run-a", 1)
            assert os.path.dirname(rank0) != os.path.dirname(rank1)
        assert not os.path.exists(rank1)  # each worker's download goes with it
        assert open(rank0, "rb").read() == b"weights"
    assert not os.path.exists(os.path.dirname(rank0)) and not list((tmp_path / "tmp").iterdir())

    # On a local or shared disk the checkpoint is read in place, and nothing is removed.
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: ray.train.Checkpoint.from_directory(str(saved)))
    with contextlib.ExitStack() as stack:
        assert loop._restored_checkpoint_path(stack, "run-a", 0) == str(saved / CHECKPOINT_FILE)
    assert (saved / CHECKPOINT_FILE).is_file()
