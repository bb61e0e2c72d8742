"""`raydra rerun RUN_DIR [overrides]`: a recorded run composed again from its own config (not today's
defaults), and once for real on Ray: a new run directory that names the run it reproduces."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, base_env, run_dirs, run_train, summary_of

from raydra.cli import main


def raydra(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "raydra.cli", *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=base_env()
    )


def test_rerun_composes_the_recorded_config_not_todays_defaults(tmp_path):
    # A run recorded with logger=csv, a learning rate and a seed of its own; today's default logger is [csv, wandb].
    composed = subprocess.run(
        [sys.executable, "train.py", "--cfg", "job", "logger=csv", "model.optimizer.lr=0.123", "seed=7"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=base_env(),
        check=True,
    ).stdout
    old = tmp_path / "old"
    (old / ".hydra").mkdir(parents=True)
    (old / ".hydra" / "config.yaml").write_text(composed)

    done = raydra("rerun", old, "--cfg", "job", "trainer.max_epochs=1")
    assert done.returncode == 0, done.stderr[-2000:]
    again, recorded = yaml.safe_load(done.stdout), yaml.safe_load(composed)
    assert again["trainer"].pop("max_epochs") == 1  # the override on top
    recorded["trainer"].pop("max_epochs")
    assert again == recorded
    assert set(again["logger"]) == {"csv"} and again["seed"] == 7 and again["model"]["optimizer"]["lr"] == 0.123


def test_rerun_of_a_directory_without_a_record_says_what_to_pass(tmp_path, capsys):
    assert main(["rerun", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path} has no .hydra/config.yaml; pass the directory of one recorded run." in err


@pytest.mark.e2e
def test_rerun_trains_into_a_new_run_dir_that_names_the_run_it_reproduces(ray_cluster, tmp_path):
    smoke = ("experiment=vit_digits_smoke", "trainer.max_epochs=1", "scale.num_workers=1", "logger=csv")
    first = run_train(*smoke, outputs=tmp_path, address=ray_cluster)
    assert first.returncode == 0, first.stdout + first.stderr
    (old,) = run_dirs(tmp_path)

    again = raydra("rerun", old)
    assert again.returncode == 0, again.stdout + again.stderr
    new = next(d for d in run_dirs(tmp_path) if d != old)
    summary = summary_of(new)
    assert summary["status"] == "completed" and summary["reproduces"] == str(old.resolve())
    assert (new / ".hydra" / "overrides.yaml").read_text().startswith(f"# raydra rerun of {old.resolve()}")
    assert yaml.safe_load((new / ".hydra" / "config.yaml").read_text()) == yaml.safe_load((old / ".hydra" / "config.yaml").read_text())

    compared = raydra("compare", old, new, "--format", "json")
    assert compared.returncode == 0, compared.stderr
    records = json.loads(compared.stdout)
    assert [r["status"] for r in records] == ["completed", "completed"]
    # Same config and seed: the two runs agree on the monitored metric.
    assert records[0]["best val/acc"] == pytest.approx(records[1]["best val/acc"], abs=0.05)
    assert Path(records[1]["run_dir"]).resolve() == new.resolve()
