"""`raydra compare`, `raydra show` and `raydra.load` on runs in storage, against a real S3 server
(moto, the `s3_bucket` fixture): the same answers as for the local copies, with URIs as the paths."""

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, S3_ENV, bare_trainer, make_run, tiny_vit

import raydra
from raydra import compare, storage
from raydra.cli import main
from raydra.errors import RaydraError


def upload(local: Path, uri: str) -> str:
    storage.copy_tree(str(local), uri)
    return uri


def cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def runs(tmp_path, s3_bucket):
    """A three-job sweep and a single run on disk, and the same tree in the bucket:
    (local root, its URI)."""
    root = tmp_path / "outputs"
    sweep = root / "sweeps" / "2026-11-22" / "15-20-01_vit_digits"
    make_run(sweep, "0", lr=0.001, accs=(0.5, 0.7, 0.8))
    make_run(sweep, "1", lr=0.01, accs=(0.6, 0.95, 0.9))
    make_run(sweep, "2", lr=0.1, accs=(0.3, 0.4, 0.45))
    make_run(root / "runs" / "2026-11-23", "20-41-00_vit_digits", lr=0.01, epochs=5, model="cnn")
    for run in [*sweep.iterdir(), root / "runs" / "2026-11-23" / "20-41-00_vit_digits"]:
        # Object stores keep no empty folders: a sample, so samples/ exists on both sides.
        (run / "samples" / "epoch_0.png").write_bytes(b"png")
    (sweep / "sweep.json").write_text("{}")
    return root, upload(root, s3_bucket)


def test_compare_of_runs_in_storage_prints_the_table_of_their_local_copies(runs, capsys):
    root, uri = runs
    local = [root / "sweeps" / "2026-11-22" / "15-20-01_vit_digits", root / "runs"]
    remote = [storage.join(uri, "sweeps", "2026-11-22", "15-20-01_vit_digits"), storage.join(uri, "runs")]
    for extra in ([], ["--metric", "val/acc", "--metric", "test/acc", "--sort"], ["--format", "markdown"]):
        code, out_local, err = cli(capsys, "compare", *local, *extra)
        assert code == 0 and err == ""
        code, out_remote, err = cli(capsys, "compare", *remote, *extra)
        assert code == 0 and err == "", err
        assert out_remote == out_local
    assert len(out_remote.strip().splitlines()) == 2 + 4
    # The whole bucket prefix at once finds the same four runs, in the same order.
    code, out, _ = cli(capsys, "compare", uri, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["run"] for r in rows] == [
        "runs/2026-11-23/20-41-00_vit_digits",
        *(f"sweeps/2026-11-22/15-20-01_vit_digits/{i}" for i in range(3)),
    ]
    # Paths shown are the URIs, never the scratch copies compare read from.
    assert rows[1]["run_dir"] == storage.join(uri, "sweeps", "2026-11-22", "15-20-01_vit_digits", "0")
    code, out, _ = cli(capsys, "compare", remote[0], "--format", "json", "--html", root.parent / "report.html")
    page = (root.parent / "report.html").read_text()
    assert [r["run_dir"] for r in json.loads(out)] == [storage.join(remote[0], str(i)) for i in range(3)]
    assert "raydra-compare-" not in out + page and storage.join(remote[0], "1", "metrics.csv") in page.replace("&amp;", "&")


def test_show_of_a_run_in_storage(runs, capsys):
    root, uri = runs
    local_run = root / "sweeps" / "2026-11-22" / "15-20-01_vit_digits" / "1"
    remote_run = storage.join(uri, "sweeps", "2026-11-22", "15-20-01_vit_digits", "1")
    code, out_local, _ = cli(capsys, "show", local_run)
    code, out, err = cli(capsys, "show", remote_run)
    assert code == 0 and err == ""
    assert out.splitlines()[0] == f"run       {remote_run}"

    def section(text, start, end):
        return text[text.index(start) : text.index(end)]

    # Status, metrics, overrides and the config read the same as from the local copy.
    assert section(out, "status", "files") == section(out_local, "status", "files")
    assert out[out.index("config (.hydra") :] == out_local[out_local.index("config (.hydra") :]
    # Files are listed where they are in storage, the checkpoint summary.json named on the disk it
    # was written on among them ("  <what, 16 wide><where>").
    listed = section(out, "files\n", "\nconfig (").splitlines()[1:]
    files = {line[2:18].strip(): line[18:] for line in listed if line.strip()}
    checkpoint = storage.join(remote_run, "checkpoints", "1_ab12cd", "checkpoint_000002", "checkpoint.ckpt")
    assert files["best checkpoint"] == files["last checkpoint"] == checkpoint
    for what, relative in [("metrics.csv", "metrics.csv"), ("samples", "samples"), ("config", ".hydra/config.yaml")]:
        assert files[what] == storage.join(remote_run, *relative.split("/"))
    assert "(missing)" not in out

    # A checkpoint deleted from storage is reported missing, from the run's listing.
    fs, path = storage.filesystem(checkpoint)
    fs.delete_file(path)
    code, out, _ = cli(capsys, "show", remote_run)
    assert f"{checkpoint}  (missing)" in out


def test_missing_paths_buckets_and_sweeps_in_storage_are_one_sentence(runs, s3_server, capsys):
    root, uri = runs
    nothing = storage.join(uri, "runs", "2026-01-01")
    code, out, err = cli(capsys, "compare", nothing)
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"raydra compare: {nothing} does not exist; pass the storage URI of a run or sweep directory.",
        "raydra compare: no run to show.",
    ]
    no_bucket = f"s3://no-such-bucket/prefix?endpoint_override={s3_server}&scheme=http"
    code, _, err = cli(capsys, "show", no_bucket)
    assert code == 1
    assert err == (
        f"raydra show: {no_bucket} does not exist: there is no bucket 'no-such-bucket' at this endpoint; "
        "check the bucket name and the URI's endpoint_override (or AWS_ENDPOINT_URL).\n"
    )
    sweep = storage.join(uri, "sweeps", "2026-11-22", "15-20-01_vit_digits")
    code, _, err = cli(capsys, "show", sweep)
    assert code == 1 and f"{sweep} is a sweep directory with 3 runs" in err
    a_file = storage.join(sweep, "sweep.json")
    code, _, err = cli(capsys, "show", a_file)
    assert code == 1 and err == f"raydra show: {a_file} is a file; pass the storage URI of one run's directory.\n"
    bad_key = uri + "&endpoint=x"
    code, _, err = cli(capsys, "compare", bad_key)
    assert code == 1 and "Unexpected query parameter in S3 URI: 'endpoint'" in err and "check the URI" in err
    # A local run next to runs in storage: both shown, each by its own path.
    code, out, err = cli(capsys, "compare", root / "runs", sweep, "--format", "json")
    assert code == 0 and err == ""
    assert [r["run_dir"] for r in json.loads(out)] == [
        str(root / "runs" / "2026-11-23" / "20-41-00_vit_digits"),
        *(storage.join(sweep, str(i)) for i in range(3)),
    ]


def test_run_dirs_in_a_listing_are_found_as_on_a_disk(tmp_path):
    files = [
        "a/10/summary.json",
        "a/9/summary.json",
        "a/9/checkpoints/x/summary.json",
        "a/sweep.json",
        "a/.hidden/summary.json",
        "b/.hydra/config.yaml",
        "b/logs/worker_0.log",
        "c/readme.txt",
    ]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("{}")
    found = compare.run_dirs_in(files)
    assert found == ["a/9", "a/10", "b"]
    assert [os.path.relpath(d, tmp_path) for d in compare.runs_below(str(tmp_path))] == found
    assert compare.run_dirs_in(["summary.json", "x/summary.json"]) == [""]
    assert compare.run_dirs_in(["sweep.json", ".hydra/config.yaml", "0/summary.json"]) == ["0"]


def test_compare_of_storage_imports_pyarrow_but_not_the_training_stack(runs):
    _, uri = runs
    env = {**os.environ, **S3_ENV, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "raydra", "compare", uri, "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(csv.DictReader(io.StringIO(proc.stdout)))) == 4
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "pyarrow" in imported
    assert not imported & {"ray", "torch", "wandb", "hydra", "omegaconf", "lightning", "pytorch_lightning", "matplotlib"}


# ---------------------------------------------------------------------------------------------
# raydra.load


def tiny_checkpoint(path: Path) -> "torch.nn.Module":
    """A real Lightning checkpoint of a tiny ViT, written by pl.Trainer with raydra's Resumable callback
    (which records the module class raydra.load rebuilds); returns the trained module."""
    from raydra.worker.resumable import Resumable

    torch.manual_seed(0)
    module = tiny_vit(
        num_classes=3,
        patch_size=4,
        hidden_size=8,
        num_layers=1,
        num_heads=1,
        mlp_size=8,
        optimizer={"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.5},
    )
    data = torch.utils.data.TensorDataset(torch.randn(8, 1, 8, 8), torch.randint(0, 3, (8,)))
    trainer = bare_trainer(max_steps=2, callbacks=[Resumable()])
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    path.parent.mkdir(parents=True, exist_ok=True)
    trainer.save_checkpoint(path)
    return module


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_load_a_run_and_a_checkpoint_from_storage(tmp_path, s3_bucket):
    run = tmp_path / "runs" / "2026-11-23" / "20-41-00_vit_digits"
    ckpt = run / "checkpoints" / "r1" / "checkpoint_000001" / "checkpoint.ckpt"
    trained = tiny_checkpoint(ckpt)
    # "best" in the sharded layout fsdp writes (a folder: Lightning's meta.pt beside torch.distributed
    # shards), with other weights (+1), so each load shows which checkpoint it read.
    sharded = run / "checkpoints" / "r1" / "checkpoint_000000" / "checkpoint.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    plus_one = {k: v + 1 if v.is_floating_point() else v for k, v in state.pop("state_dict").items()}
    from raydra.private_apis.lightning import save_distributed_checkpoint

    sharded.mkdir(parents=True)
    save_distributed_checkpoint({"state_dict": plus_one}, sharded)
    torch.save(state, sharded / "meta.pt")
    summary = {"run_dir": str(run), "status": "completed", "checkpoints": {"best": str(sharded), "last": str(ckpt)}}
    (run / "summary.json").write_text(json.dumps(summary))
    # On this disk, as always.
    assert same_weights(raydra.load(run, "last"), trained)
    run_uri = upload(run, storage.join(s3_bucket, "runs", "2026-11-23", "20-41-00_vit_digits"))
    ckpt_uri = storage.join(run_uri, "checkpoints", "r1", "checkpoint_000001", "checkpoint.ckpt")

    for loaded in (raydra.load(run_uri, "last"), raydra.load(ckpt_uri)):
        assert not loaded.training and same_weights(loaded, trained)
    best = raydra.load(run_uri, "best")
    assert all(torch.equal(best.state_dict()[k], v) for k, v in plus_one.items())

    # A run whose record is on this disk and whose checkpoints are in storage (paths.storage=).
    local = tmp_path / "elsewhere"
    local.mkdir()
    (local / "summary.json").write_text(json.dumps({"checkpoints": {"best": ckpt_uri, "last": ckpt_uri}}))
    assert same_weights(raydra.load(local), trained)

    missing = storage.join(s3_bucket, "runs", "2026-01-01", "nothing")
    with pytest.raises(RaydraError, match=re.escape(f"{missing} is neither a raydra run directory")):
        raydra.load(missing)
    fs, path = storage.filesystem(ckpt_uri)
    fs.delete_file(path)
    with pytest.raises(
        RaydraError, match=rf"{re.escape(run_uri)} has no last checkpoint \(summary.json lists {re.escape(ckpt_uri)}, which is not there\)"
    ):
        raydra.load(run_uri, "last")
    with pytest.raises(RaydraError, match=rf"{re.escape(str(local))} has no best checkpoint .*which is not there"):
        raydra.load(local)
