"""Input that raised a traceback, said in one sentence naming the file and what to do, or made to
work: a checkpoint cut short, given to raydra.load or to ckpt_path=; a compare report to a place
that takes no write; a run name beyond ASCII on Ray. Fast: files made on the spot, in this process."""

import sys
from pathlib import Path

import pytest
import torch
from helpers import on_a_private_tmpfs, run_dirs, summary_of

import raydra
from raydra.errors import RaydraError
from raydra.records.checkpoints import check_whole


@pytest.fixture
def cut_short(tmp_path) -> Path:
    """A checkpoint.ckpt (what Lightning saves, through torch.save) of which only the first half was copied."""
    whole = tmp_path / "whole" / "checkpoint.ckpt"
    whole.parent.mkdir()
    torch.save({"state_dict": {"w": torch.zeros(64, 64)}, "module_class": "raydra.models.vit.ViTClassifier"}, whole)
    cut = tmp_path / "cut" / "checkpoint.ckpt"
    cut.parent.mkdir()
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    return cut


def test_a_checkpoint_cut_short_is_named_by_raydra_load(cut_short):
    with pytest.raises(RaydraError) as error:
        raydra.load(cut_short)
    said = str(error.value)
    assert said.startswith(
        f"{cut_short} is not a whole checkpoint (it starts as torch.save's zip archive, whose directory at the end is missing)"
    )
    assert said.endswith("copy it again, or use another of the run's checkpoints (a run directory's best or last).") and "\n" not in said


def test_a_whole_checkpoint_and_one_of_torchs_older_format_are_let_be(cut_short, tmp_path):
    check_whole(cut_short.parent.parent / "whole" / "checkpoint.ckpt")
    older = tmp_path / "older.ckpt"
    torch.save({"w": torch.zeros(2)}, older, _use_new_zipfile_serialization=False)
    check_whole(older)
    with pytest.raises(RaydraError, match=r"is not a whole checkpoint \(it starts as torch.save's zip archive"):
        check_whole(cut_short)
    # An unpickling refusal is no damage: said as what it is (test_trust.py), not as a copy cut short.
    refused = tmp_path / "code" / "checkpoint.ckpt"
    refused.parent.mkdir()
    torch.save({"f": Path("x")}, refused)
    with pytest.raises(RaydraError, match=r"holds a pickled pathlib\.\w*Path, which is neither a tensor nor plain data"):
        raydra.load(refused)


def test_ckpt_path_to_a_checkpoint_cut_short_is_refused_on_the_driver_before_training(train_here, cut_short, tmp_path):
    done = train_here(f"ckpt_path={cut_short}", "scale.num_workers=0", "logger=csv", outputs=tmp_path / "out")
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in said, said
    assert f"error: ckpt_path={cut_short}: {cut_short} is not a whole checkpoint" in done.stdout
    (run_dir,) = run_dirs(tmp_path / "out")
    assert summary_of(run_dir)["status"] == "failed" and not (run_dir / "checkpoints").exists()


def test_a_compare_report_to_a_read_only_place_is_said_in_one_sentence(tmp_path):
    """`raydra compare --html` to a read-only filesystem (a tmpfs mounted so in a namespace of its own:
    tests run as root, which file modes do not stop) printed OSError's traceback."""
    run = tmp_path / "runs" / "r1"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("name: r1\n")
    (run / "summary.json").write_text('{"status": "completed", "metrics": {"final": {}, "best": {}}}')
    read_only = tmp_path / "ro"
    read_only.mkdir()
    report = read_only / "report.html"
    command = [sys.executable, "-m", "raydra", "compare", str(run), "--html", str(report)]
    done = on_a_private_tmpfs(read_only, command, "size=64k,ro", timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"raydra compare: {report} is on a read-only filesystem: the HTML report cannot be written there; "
        "name a file in a directory you can write (--html)."
    )
    assert "r1" in done.stdout  # the table itself is shown


def test_a_run_name_beyond_ascii_names_its_directory_and_record_and_gives_ray_an_ascii_run_name(train_here, tmp_path, monkeypatch):
    """Ray Train tags its metrics with the run's name and Ray encodes tags as ASCII: a name with an
    accent failed every Ray run at its controller's start ('ascii' codec can't encode). The run's
    id, which Ray gets as the run's name, is ASCII; the user's name stays in the directory and record."""
    from raydra.cluster import ray_cluster
    from raydra.records.layout import ray_safe
    from raydra.run import driver

    assert ray_safe("modèle été/v2 実験") == "modele_ete_v2___"
    assert ray_safe("vit_digits-1.5") == "vit_digits-1.5"
    # Ray is not started: the lifecycle connects through raydra.cluster.ray_cluster.connect.
    monkeypatch.setattr(ray_cluster, "connect", lambda *args, **kwargs: None)

    def stop(cfg, run_dir, run_id, **kwargs):
        raise RaydraError(f"stopped before the fit, as {run_id}")

    monkeypatch.setattr(driver.resolve, "resolve", stop)
    done = train_here("name='modèle_été_実験'", "scale.num_workers=1", "logger=csv", outputs=tmp_path)
    (run_dir,) = run_dirs(tmp_path)
    summary = summary_of(run_dir)
    assert run_dir.name.endswith("_modèle_été_実験") and summary["name"] == "modèle_été_実験", done.stdout
    assert summary["run_id"].isascii() and "_modele_ete____" in summary["run_id"]
    assert f"stopped before the fit, as {summary['run_id']}" in summary["error"]
