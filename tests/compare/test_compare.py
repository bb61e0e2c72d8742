"""`raydra compare` and `raydra show` on synthetic run directories written to the run-dir contract:
.hydra/config.yaml, .hydra/overrides.yaml, summary.json, metrics.csv (Lightning CSVLogger format)."""

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, compare, make_run

from raydra.cli import main


@pytest.fixture
def sweep(tmp_path):
    """A three-job sweep over the learning rate; job 1 is the best, job 2 the worst."""
    root = tmp_path / "sweeps" / "2026-11-22" / "15-20-01_vit_digits"
    make_run(root, "0", lr=0.001, accs=(0.5, 0.7, 0.8))
    make_run(root, "1", lr=0.01, accs=(0.6, 0.95, 0.9))
    make_run(root, "2", lr=0.1, accs=(0.3, 0.4, 0.45))
    return root


def as_json(capsys, *args):
    code, out, err = compare(capsys, *args, "--format", "json")
    assert code == 0, err
    return json.loads(out), err


def test_columns_are_the_differing_config_keys_and_metrics_match_summary(sweep, capsys):
    records, err = as_json(capsys, sweep)
    assert err == ""
    assert [r["run"] for r in records] == ["0", "1", "2"]
    assert list(records[0]) == [
        "run",
        "final val/acc",
        "best val/acc",
        "model.optimizer.lr",
        "status",
        "wall_s",
        "samples/s",
        "run_dir",
        "overrides",
    ]
    for record in records:
        summary = json.loads((Path(record["run_dir"]) / "summary.json").read_text())
        assert record["final val/acc"] == summary["metrics"]["final"]["val/acc"]
        assert record["best val/acc"] == summary["metrics"]["best"]["val/acc"]
        assert record["wall_s"] == summary["wall_time_s"]
        assert record["samples/s"] == summary["throughput"]["samples_per_s"]
        assert record["status"] == "completed"
    assert [r["model.optimizer.lr"] for r in records] == [0.001, 0.01, 0.1]
    assert records[0]["overrides"] == ["model.optimizer.lr=0.001", "trainer.max_epochs=3"]


def test_plain_table_shows_only_what_differs(sweep, tmp_path, capsys):
    make_run(tmp_path / "runs", "deep", lr=0.01, epochs=5, model="cnn")
    code, out, err = compare(capsys, sweep, tmp_path / "runs" / "deep", "--metric", "val/acc", "--metric", "test/acc")
    assert code == 0 and err == ""
    header, rule, *lines = out.strip().splitlines()
    assert header.split() == [
        "run",
        "final",
        "val/acc",
        "best",
        "val/acc",
        "final",
        "test/acc",
        "best",
        "test/acc",
        "model._target_",
        "model.name",
        "model.optimizer.lr",
        "trainer.max_epochs",
        "status",
        "wall_s",
        "samples/s",
    ]
    assert set(rule) == {"-", " "}
    assert len(lines) == 4
    assert lines[3].split()[:2] == ["runs/deep", "0.9"]
    assert lines[3].split()[-7:-3] == ["raydra.models.cnn.Classifier", "cnn", "0.01", "5"]
    assert "seed" not in header and "data.batch_size" not in header and "tags" not in header
    assert "0.905" in lines[3]  # final test/acc; best test/acc is not in summary.json, so blank


def test_sort_uses_the_monitor_mode_and_desc_asc_override(sweep, tmp_path, capsys):
    best_first, _ = as_json(capsys, sweep, "--sort")
    assert [r["run"] for r in best_first] == ["1", "0", "2"]
    ascending, _ = as_json(capsys, sweep, "--sort", "--asc")
    assert [r["run"] for r in ascending] == ["2", "0", "1"]

    loss = tmp_path / "loss_sweep"
    for job, accs in (("a", (0.5, 0.6)), ("b", (0.7, 0.9)), ("c", (0.2, 0.3))):
        make_run(loss, job, accs=accs, monitor=("val/loss", "min"))
    lowest_loss_first, _ = as_json(capsys, loss, "--sort")
    assert [r["run"] for r in lowest_loss_first] == ["b", "a", "c"]
    assert "best val/loss" in lowest_loss_first[0]
    by_desc, _ = as_json(capsys, loss, "--sort", "--desc")
    assert [r["run"] for r in by_desc] == ["c", "a", "b"]


def test_filter_keeps_matching_runs_and_says_when_none_match(sweep, tmp_path, capsys):
    make_run(sweep, "3", lr=0.01, model="cnn")
    records, _ = as_json(capsys, sweep, "--filter", "model.name=vit")
    assert [r["run"] for r in records] == ["0", "1", "2"]
    records, _ = as_json(capsys, sweep, "--filter", "model.optimizer.lr=0.01", "--filter", "model.name=cnn")
    assert [r["run"] for r in records] == ["3"]
    records, _ = as_json(capsys, sweep, "--filter", "model.optimizer._partial_=True", "--filter", "strategy.backend=null")
    assert len(records) == 4

    code, out, err = compare(capsys, sweep, "--filter", "model.name=resnet")
    assert code == 1 and out == ""
    assert "none of the 4 runs matches model.name=resnet" in err
    code, _, err = compare(capsys, sweep, "--filter", "model.nmae=vit")
    assert code == 1 and "no run has config key 'model.nmae'" in err
    code, _, err = compare(capsys, sweep, "--filter", "model.name")
    assert code == 2 and "KEY=VALUE" in err


def test_markdown_csv_and_json_exports_parse_back(sweep, capsys):
    records, _ = as_json(capsys, sweep, "--metric", "val/acc", "--metric", "val/loss")

    code, out, _ = compare(capsys, sweep, "--metric", "val/acc", "--metric", "val/loss", "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["run"] for r in rows] == [r["run"] for r in records]
    for row, record in zip(rows, records):
        assert float(row["final val/loss"]) == record["final val/loss"]
        assert float(row["best val/acc"]) == record["best val/acc"]
        assert float(row["model.optimizer.lr"]) == record["model.optimizer.lr"]
        assert row["run_dir"] == record["run_dir"]

    code, out, _ = compare(capsys, sweep, "--metric", "val/acc", "--metric", "val/loss", "--format", "markdown")
    lines = out.strip().splitlines()
    assert re.fullmatch(r"\|(---:?\|)+", lines[1])
    table = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[:1] + lines[2:]]
    header, body = table[0], table[1:]
    assert header[0] == "run" and "final val/loss" in header
    assert len(body) == 3 and all(len(row) == len(header) for row in body)
    for row, record in zip(body, records):
        cell = dict(zip(header, row))
        assert float(cell["best val/acc"]) == pytest.approx(record["best val/acc"], abs=5e-4)
        assert cell["status"] == "completed"


def test_failed_running_corrupt_and_bad_paths_are_reported_and_the_table_still_prints(sweep, tmp_path, capsys):
    make_run(sweep, "3", lr=0.5, status="failed", error="CUDA out of memory while allocating 2 GiB", metrics_csv=False)
    make_run(sweep, "4", lr=0.2, status="running", accs=(0.2, 0.6))
    corrupt = make_run(sweep, "5", lr=0.3)
    (corrupt / "summary.json").write_text('{"status": "completed", "metrics": {')
    make_run(sweep, "6", lr=0.4, summary=False)
    make_run(sweep, "7", lr=0.6, status="interrupted", error="interrupted by the user", accs=(0.1,))
    # A status that is no string read as the record's default, running, which this run never was.
    make_run(sweep, "8", lr=0.7, status=5)
    not_a_run = tmp_path / "notes"
    not_a_run.mkdir()
    (not_a_run / "readme.txt").write_text("nothing here")

    code, out, err = compare(capsys, sweep, not_a_run, tmp_path / "missing", "--metric", "val/acc", "--metric", "val/acx")
    assert code == 0
    lines = {line.split()[0]: line for line in out.strip().splitlines()[2:]}
    assert sorted(lines) == ["0", "1", "2", "3", "4", "5", "6", "7", "8"]
    assert "failed: CUDA out of memory while allocating 2 GiB" in lines["3"]
    assert lines["4"].split()[1:5] == ["0.6", "0.6", "0.2", "running"]  # from metrics.csv, the summary has none yet
    assert "unknown (corrupt summary.json)" in lines["5"]
    assert "unknown (no summary.json)" in lines["6"]
    assert lines["7"].split()[1:] == ["0.1", "0.1", "0.6", "interrupted", "by", "the", "user"]
    assert "unknown (unreadable status in summary.json)" in lines["8"] and "running" not in lines["8"]

    err_lines = err.strip().splitlines()
    assert len(err_lines) == 5, err
    assert any(
        str(sweep / "8" / "summary.json") in line and "status is not one of running, completed, failed" in line and "(5)" in line
        for line in err_lines
    )
    assert any(str(not_a_run) in line and "is not a run or sweep directory" in line for line in err_lines)
    assert any(str(tmp_path / "missing") in line and "does not exist" in line for line in err_lines)
    # The JSON reader's own words, where and what (errors.whole_message).
    assert any(str(corrupt / "summary.json") in line and "corrupt (Expecting property name" in line for line in err_lines)
    assert any("'val/acx'" in line and "val/acc" in line for line in err_lines)

    records, _ = as_json(capsys, sweep, "--filter", "status=failed")
    assert [r["run"] for r in records] == ["3"]
    assert records[0]["status"] == "failed: CUDA out of memory while allocating 2 GiB"
    assert records[0]["final val/acc"] is None


def test_nothing_to_show_exits_1(tmp_path, capsys):
    code, out, err = compare(capsys, tmp_path)
    assert code == 1 and out == ""
    assert str(tmp_path) in err and "no run to show" in err


def test_globs_and_several_sweeps(sweep, tmp_path, capsys):
    other = tmp_path / "sweeps" / "2026-11-22" / "16-00-00_vit_digits"
    make_run(other, "0", lr=0.001, epochs=4)
    records, _ = as_json(capsys, tmp_path / "sweeps" / "*" / "*")
    assert [r["run"] for r in records] == [
        "15-20-01_vit_digits/0",
        "15-20-01_vit_digits/1",
        "15-20-01_vit_digits/2",
        "16-00-00_vit_digits/0",
    ]
    records, _ = as_json(capsys, sweep / "*", sweep / "1")  # the same run twice is shown once
    assert len(records) == 3
    code, _, err = compare(capsys, tmp_path / "nope*")
    assert code == 1 and "matches no run or sweep directory" in err


def test_show_prints_config_overrides_status_metrics_and_files(sweep, capsys):
    run = sweep / "1"
    assert main(["show", str(run)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert re.search(r"^status\s+completed$", out, re.M)
    assert re.search(r"^\s+val/acc\s+0\.9\s+0\.95$", out, re.M)
    assert "model.optimizer.lr=0.01" in out
    assert (run / ".hydra" / "config.yaml").read_text().splitlines()[3].strip() in out
    assert "lr: 0.01" in out
    summary = json.loads((run / "summary.json").read_text())
    assert str(run / summary["checkpoints"]["best"]) in out
    for name in ("metrics.csv", "samples", "summary.json"):
        assert str(run / name) in out

    failed = make_run(sweep, "3", status="failed", error="NCCL timeout after 1800 s")
    assert main(["show", str(failed)]) == 0
    assert re.search(r"^status\s+failed: NCCL timeout after 1800 s$", capsys.readouterr().out, re.M)

    assert main(["show", str(sweep)]) == 1
    assert "is a sweep directory with 4 runs" in capsys.readouterr().err


def test_plot_writes_one_png_per_metric(sweep, tmp_path, capsys):
    plots = tmp_path / "plots"
    code, _, err = compare(capsys, sweep, "--metric", "val/acc", "--metric", "train/loss", "--plot", plots)
    assert code == 0
    assert sorted(p.name for p in plots.iterdir()) == ["train_loss.png", "val_acc.png"]
    for png in plots.iterdir():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert f"wrote {plots / 'val_acc.png'}" in err
    code, _, _ = compare(capsys, sweep, "--plot", tmp_path / "by_epoch", "--x", "epoch")
    assert code == 0 and (tmp_path / "by_epoch" / "val_acc.png").is_file()


def test_plot_draws_a_metric_with_one_point_per_run_as_bars(sweep, tmp_path, capsys):
    from matplotlib.image import imread

    plots = tmp_path / "plots"
    code, _, err = compare(capsys, sweep, "--metric", "test/acc", "--metric", "val/acc", "--plot", plots)
    assert code == 0, err

    def first_colour_share(png):
        # matplotlib's first colour, C0 (#1f77b4): run 0's line, or its bar.
        pixels = imread(png)[..., :3]
        return float((abs(pixels - [0x1F / 255, 0x77 / 255, 0xB4 / 255]).max(axis=-1) < 0.02).mean())

    # One bar per run fills a good part of the figure; a line a sliver of it.
    assert first_colour_share(plots / "test_acc.png") > 0.05
    assert first_colour_share(plots / "val_acc.png") < 0.01


def test_200_runs_compare_in_under_3_seconds(tmp_path, capsys):
    template, root = make_run(tmp_path, "template", lr=1e-4), tmp_path / "big"
    for i in range(200):
        shutil.copytree(template, root / str(i))
        config = root / str(i) / ".hydra" / "config.yaml"
        config.write_text(config.read_text().replace("lr: 0.0001", f"lr: {0.0001 * (i + 1):.6g}"))
        summary = root / str(i) / "summary.json"
        summary.write_text(summary.read_text().replace('"val/acc": 0.9,', f'"val/acc": {i / 1000},'))
    started = time.perf_counter()
    code, out, _ = compare(capsys, root, "--metric", "val/acc", "--metric", "val/loss", "--sort")
    elapsed = time.perf_counter() - started
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 202
    assert lines[2].split()[:3] == ["199", "0.199", "0.199"] and lines[2].split()[5] == "0.02"
    assert lines[-1].split()[:3] == ["0", "0", "0"] and lines[-1].split()[5] == "0.0001"
    print(f"compare over 200 runs: {elapsed:.2f} s")
    assert elapsed < 3.0


def test_python_m_raydra_compare_runs_without_the_training_stack(sweep):
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "raydra", "compare", str(sweep), "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["run"] for r in csv.DictReader(io.StringIO(proc.stdout))] == ["0", "1", "2"]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in lines}
    assert {"yaml", "raydra"} <= imported
    heavy = {"ray", "torch", "wandb", "hydra", "omegaconf", "lightning", "pytorch_lightning", "matplotlib", "pandas"}
    assert not imported & heavy


def test_show_and_compare_print_a_hostile_runs_control_characters_escaped(tmp_path, capsys):
    """A run directory's values reach the terminal as text: a clear-screen, a carriage return and
    a cursor move in its error (that would overwrite its "failed" line), an 8-bit CSI in a tag and
    a right-to-left override in a metric's name all show as escapes."""
    root = tmp_path / "sweep"
    hostile = "boom\x1b[2J\rcompleted\x1b[1A"
    run = make_run(root, "0", status="failed", error=hostile, tags=("tag\x9b2J",))
    make_run(root, "1")
    summary = json.loads((run / "summary.json").read_text())
    summary["metrics"] = {"final": {"val/acc\u202e": 0.5}, "best": {}}
    (run / "summary.json").write_text(json.dumps(summary))

    assert main(["show", str(run)]) == 0
    shown = capsys.readouterr().out
    code, compared, _ = compare(capsys, root, "--metric", "val/acc\u202e")
    assert code == 0
    for out in (shown, compared):
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", out), repr(out)
    assert "failed: boom\\x1b[2J" in shown and "completed\\x1b[1A" in shown
    assert "tag\\x9b2J" in shown and "val/acc\\u202e" in shown
    assert "failed: boom\\x1b[2J" in compared
