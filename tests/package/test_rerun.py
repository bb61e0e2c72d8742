"""`raydra rerun RUN_DIR [overrides]`: a recorded run composed again from its own config (not today's
defaults), and once for real on Ray: a new run directory that names the run it reproduces."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO, base_env, run_dirs, run_train, summary_of

from raydra.cli import main


def raydra(*args, timeout=600, env=None):
    return subprocess.run(
        [sys.executable, "-m", "raydra.cli", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base_env(), **(env or {})},
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

    temp = tmp_path / "temp"
    temp.mkdir()
    done = raydra("rerun", old, "--cfg", "job", "trainer.max_epochs=1", env={"TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr[-2000:]
    # The config it composed from was written to a scratch directory, which goes once it is done.
    assert not list(temp.iterdir())
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
    # Same config and seed on the same machine: the same numbers to the last digit, as the docs promise
    # (docs/compare.md#re-running-a-run): the monitored metric and every loss and accuracy logged on the way.
    assert records[0]["best val/acc"] == records[1]["best val/acc"]
    assert _learning_curves(old) == _learning_curves(new)
    assert Path(records[1]["run_dir"]).resolve() == new.resolve()


def _learning_curves(run_dir: Path) -> list:
    """metrics.csv's losses and accuracies by step (its timings, which vary from run to run, left out)."""
    import csv

    with open(run_dir / "metrics.csv") as f:
        return [
            {k: v for k, v in row.items() if k in ("epoch", "step") or k.endswith(("loss", "acc", "loss_step", "loss_epoch"))}
            for row in csv.DictReader(f)
        ]


def _recorded_before_issue_30(tmp_path: Path) -> Path:
    """A run directory as raydra wrote it before models were built as Hydra builds them: its config
    without the keys added since (callbacks, ckpt_path, the template's paths, model._convert_, the
    new trainer fields), and a checkpoint of a ViT that was handed plain-dict hyperparameters
    (instantiate(..., _recursive_=False, _convert_="all")), with no record of how it was built."""
    import torch
    from helpers import bare_trainer
    from hydra.utils import instantiate

    from raydra.config.schema import TrainerConfig
    from raydra.worker.resumable import Resumable

    composed = subprocess.run(
        [sys.executable, "train.py", "--cfg", "job", "logger=csv", "trainer.max_epochs=1", "model.num_layers=1", "model.conv_stem=[8]"],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=base_env(), check=True,
    ).stdout  # fmt: skip
    config = yaml.safe_load(composed)
    for key in ("callbacks", "ckpt_path"):
        config.pop(key)
    for key in ("root_dir", "work_dir", "data_dir", "output_dir", "log_dir"):
        config["paths"].pop(key)
    config["model"].pop("_convert_")
    for key in set(TrainerConfig.__dataclass_fields__) - {
        "max_epochs", "max_steps", "precision", "check_val_every_n_epoch", "val_check_interval", "gradient_clip_val",
        "accumulate_grad_batches", "log_every_n_steps", "num_sanity_val_steps", "fast_dev_run", "deterministic", "test", "compile", "tf32",
    }:  # fmt: skip
        config["trainer"].pop(key)
    old = tmp_path / "runs" / "2026-11-20" / "10-00-00_vit_digits"
    (old / ".hydra").mkdir(parents=True)
    (old / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    model_config = {k: v for k, v in config["model"].items() if k != "shard_blocks"}
    model_config.update(image_size=8, num_channels=1, num_classes=10)
    model_config["optimizer"]["fused"] = False
    module = instantiate(model_config, _recursive_=False, _convert_="all")
    assert isinstance(module.hparams.optimizer, dict)  # what the old worker handed over
    data = torch.utils.data.TensorDataset(torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,)))
    trainer = bare_trainer(max_steps=2, callbacks=[Resumable()])
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    checkpoint = old / "checkpoints" / "r" / "checkpoint_000000" / "checkpoint.ckpt"
    checkpoint.parent.mkdir(parents=True)
    trainer.save_checkpoint(checkpoint)
    assert "raydra" not in torch.load(checkpoint, weights_only=True)
    summary = {
        "name": "vit_digits",
        "run_dir": str(old),
        "status": "completed",
        "checkpoints": {"best": str(checkpoint), "last": str(checkpoint)},
    }
    (old / "summary.json").write_text(json.dumps(summary))
    return old, module


def test_a_run_recorded_before_models_were_built_as_hydra_builds_them_loads_and_composes_again(tmp_path):
    import torch

    from raydra import load

    old, trained = _recorded_before_issue_30(tmp_path)
    loaded = load(old)  # Class(**hyperparameters), as then: the optimizer a plain _partial_ config
    assert loaded.hparams.optimizer["_target_"] == "torch.optim.AdamW"
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in trained.state_dict().items())
    done = raydra("rerun", old, "--cfg", "job")
    assert done.returncode == 0, done.stderr[-2000:]
    again = yaml.safe_load(done.stdout)
    # Today's keys take their defaults; the model is built as Hydra builds it now (no _convert_ recorded).
    assert again["callbacks"] == {} and again["ckpt_path"] is None and "_convert_" not in again["model"]
    assert again["model"]["optimizer"]["_partial_"] is True and again["paths"]["data_dir"] == "${paths.root_dir}/data"


@pytest.mark.e2e
def test_a_run_recorded_before_models_were_built_as_hydra_builds_them_reruns(tmp_path):
    old, _ = _recorded_before_issue_30(tmp_path)
    # Written by hand, as a run from before raydra marked its runs: not this machine's (raydra.records.trust).
    again = raydra("rerun", "--trusted", old, "scale.num_workers=0", f"paths.outputs={tmp_path}")
    assert again.returncode == 0, again.stdout + again.stderr
    new = next(d for d in run_dirs(tmp_path) if d != old)
    summary = summary_of(new)
    assert summary["status"] == "completed" and summary["reproduces"] == str(old.resolve()) and "test/acc" in summary["metrics"]["final"]
