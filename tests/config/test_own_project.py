"""A researcher's own project on an installed raydra: `raydra train --config-dir conf model=mine
data=mine` run from the project's directory, with the project neither installed nor on PYTHONPATH.
The project is the README's example (examples/own_project, checked to be the README's text), copied
into a temporary directory. Also what raydra needs of the user's classes (docs/own-project.md),
checked on the driver before Ray starts and on the workers at the first validation."""

import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import OWN_PROJECT, OWN_PROJECT_QUICK, REPO, bare_trainer, raydra_train, run_dirs, summary_of
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict
from torch.utils.data import DataLoader, TensorDataset

from raydra.config.project import check_classes, runtime_env
from raydra.config.schema import register_schemas
from raydra.entry import CONF_DIR
from raydra.errors import RaydraError
from raydra.lightning import pl
from raydra.worker.contract import Contract

register_schemas()

EXAMPLE_FILES = ["my_project/model.py", "my_project/data.py", "conf/model/mlp.yaml", "conf/data/blobs.yaml"]


@pytest.fixture
def project(tmp_path) -> Path:
    """The README's example project, copied where nothing else is. Each test imports its own copy."""
    copy = tmp_path / "my-research"
    shutil.copytree(OWN_PROJECT, copy, ignore=shutil.ignore_patterns("__pycache__", "outputs"))
    _forget_my_project()
    yield copy
    _forget_my_project()


def _forget_my_project() -> None:
    for name in [m for m in sys.modules if m == "my_project" or m.startswith("my_project.")]:
        del sys.modules[name]


def composed(config_dir: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=[f"hydra.searchpath=[file://{config_dir}]", *overrides])


def test_the_readme_shows_the_example_project_file_for_file():
    readme = (REPO / "README.md").read_text()
    for name in EXAMPLE_FILES:
        assert (OWN_PROJECT / name).read_text().strip() in readme, f"README.md's example differs from examples/own_project/{name}"
    assert (OWN_PROJECT / "my_project" / "__init__.py").read_text() == ""
    assert "raydra train --config-dir conf model=mlp data=blobs" in readme


def test_raydra_train_is_train_py_for_help_and_cfg_job_with_the_projects_groups_beside_raydras(project):
    help_text = raydra_train("--config-dir", "conf", "--help", cwd=project, outputs=project / "outputs", timeout=120).stdout
    groups = dict(line.split(": ", 1) for line in help_text.splitlines() if ": " in line and line.split(": ")[0] in ("model", "data"))
    assert {"mlp", "vit"} <= set(groups["model"].split(", ")) and {"blobs", "digits"} <= set(groups["data"].split(", "))
    job = raydra_train("--config-dir", "conf", "--cfg", "job", *OWN_PROJECT_QUICK, cwd=project, outputs=project / "outputs", timeout=120)
    assert job.returncode == 0, job.stderr
    cfg = OmegaConf.create(job.stdout)
    assert cfg.model._target_ == "my_project.model.MLPClassifier" and cfg.data._target_ == "my_project.data.BlobsDataModule"
    assert cfg.strategy.name == "ddp" and cfg.scale.num_workers == 2  # raydra's groups, unchanged


def test_the_examples_classes_pass_the_driver_side_checks(project, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    check_classes(composed(project / "conf", "model=mlp", "data=blobs"))


@pytest.mark.parametrize(
    "override, sentence",
    [
        (
            "model._target_=my_projcet.model.MLPClassifier",
            "there is no module my_projcet on the import path; run from your project's directory",
        ),
        ("model._target_=my_project.model.MLP", "my_project.model defines no MLP"),
        (
            "model._target_=my_project.data.BlobsDataModule",
            "model._target_=my_project.data.BlobsDataModule is not a LightningModule subclass",
        ),
        (
            "+model.hidden=32",
            "model.hidden is not an argument of my_project.model.MLPClassifier(num_features, num_classes, hidden_size, optimizer); "
            "did you mean model.hidden_size?",
        ),
        ("~data.num_samples", "data.num_samples is missing, and my_project.data.BlobsDataModule(batch_size, num_samples,"),
        ("model.hidden_size=wide", "model.hidden_size=wide is not an integer (my_project.model.MLPClassifier takes hidden_size: int)"),
        ("model._target_=torch.nn.Linear", "is not a LightningModule subclass"),
    ],
)
def test_a_class_that_cannot_serve_is_named_before_ray_starts(project, monkeypatch, override, sentence):
    monkeypatch.syspath_prepend(str(project))
    with pytest.raises(RaydraError) as error:
        check_classes(composed(project / "conf", "model=mlp", "data=blobs", override))
    assert sentence in str(error.value)


def test_a_module_without_configure_optimizers_is_named(project, monkeypatch):
    (project / "my_project" / "bare.py").write_text(
        "from raydra.lightning import pl\n\nclass Bare(pl.LightningModule):\n    def training_step(self, batch, batch_idx):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(project))
    with pytest.raises(RaydraError, match=r"model._target_=my_project.bare.Bare does not define configure_optimizers"):
        check_classes(composed(project / "conf", "model=mlp", "data=blobs", "model._target_=my_project.bare.Bare", "~model.optimizer"))


# ---------------------------------------------------------------------------------------------
# What reaches the workers: ray.working_dir


def test_auto_ships_the_project_only_when_joining_a_cluster(project, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(project))
    cfg = composed(project / "conf", "model=mlp", "data=blobs")
    # A local Ray: the workers are on this machine and Ray gives them the driver's directory.
    assert runtime_env(cfg, cwd=project) is None
    with open_dict(cfg):
        cfg.ray.address = "auto"
    env = runtime_env(cfg, cwd=project)
    assert env["working_dir"] == str(project.resolve())
    assert {".git", ".venv", "/outputs"} <= set(env["excludes"]) and "py_modules" not in env
    # Run from elsewhere, the targets' code is not in the current directory: nothing to ship.
    assert runtime_env(cfg, cwd=tmp_path / "elsewhere") is None
    # raydra's own classes never are, even from raydra's checkout.
    assert runtime_env(composed(project / "conf", "ray.address=auto"), cwd=REPO) is None
    # A job of `ray job submit --working-dir` already runs in its shipped copy.
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {"working_dir": "gcs://_ray_pkg_1.zip"}}')
    assert runtime_env(cfg, cwd=project) is None


def test_only_a_run_of_raydras_and_its_libraries_classes_has_its_workers_import_lean(project):
    """Workers leave torchmetrics' optional integrations out (raydra.worker.preload) only when
    nothing of the user's is built there: a user's class might use them."""
    from raydra.config.project import builds_only_known_classes

    def groups(cfg):
        plain = OmegaConf.to_container(cfg, resolve=False)
        return [plain[key] for key in ("model", "data", "callbacks", "logger")]

    assert builds_only_known_classes(*groups(composed(project / "conf")))  # the default run
    assert builds_only_known_classes(*groups(composed(project / "conf", "experiment=sd_tiny", "logger=[csv,tensorboard]")))
    assert not builds_only_known_classes(*groups(composed(project / "conf", "model=mlp", "data=blobs")))
    assert not builds_only_known_classes(*groups(composed(project / "conf", "+callbacks.mine._target_=my_project.callbacks.Mine")))


def test_libraries_installed_in_a_venv_inside_the_project_are_never_shipped(project, monkeypatch):
    # `make train` puts .venv inside the checkout: torch, transformers (the optimizer's and
    # scheduler's _target_s) then live below the current directory, yet are no project code.
    site = project / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "fakelib").mkdir(parents=True)
    (site / "fakelib" / "__init__.py").write_text("class Optimizer:\n    pass\n")
    monkeypatch.syspath_prepend(str(site))
    cfg = composed(project / "conf", "ray.address=auto", "model.optimizer._target_=fakelib.Optimizer")
    assert cfg.model.optimizer._target_ == "fakelib.Optimizer"
    assert runtime_env(cfg, cwd=project) is None


def test_a_src_layout_package_goes_as_a_py_module_and_settings_are_kept(tmp_path, monkeypatch):
    _forget_my_project()
    project = tmp_path / "proj"
    shutil.copytree(OWN_PROJECT / "my_project", project / "src" / "my_project")
    shutil.copytree(OWN_PROJECT / "conf", project / "conf")
    monkeypatch.syspath_prepend(str(project / "src"))
    cfg = composed(
        project / "conf", "model=mlp", "data=blobs", "ray.address=auto", "ray.runtime_env={env_vars: {A: '1'}, excludes: [data/]}"
    )
    env = runtime_env(cfg, cwd=project)
    assert env["working_dir"] == str(project.resolve()) and env["py_modules"] == [str((project / "src" / "my_project").resolve())]
    assert env["env_vars"] == {"A": "1"} and "data/" in env["excludes"]
    explicit = composed(project / "conf", "ray.working_dir=src")  # a path ships on any Ray
    assert runtime_env(explicit, cwd=project)["working_dir"] == str((project / "src").resolve())
    assert (
        runtime_env(composed(project / "conf", "model=mlp", "data=blobs", "ray.address=auto", "ray.working_dir=null"), cwd=project) is None
    )
    with pytest.raises(RaydraError, match="ray.working_dir=nowhere is not a directory"):
        runtime_env(composed(project / "conf", "ray.working_dir=nowhere"), cwd=project)
    with pytest.raises(RaydraError, match="set ray.working_dir instead"):
        runtime_env(composed(project / "conf", "ray.runtime_env={working_dir: .}"), cwd=project)


# ---------------------------------------------------------------------------------------------
# The contract on the worker, with a plain Lightning Trainer


class _Logs(pl.LightningModule):
    """Logs `name` in validation (or nothing); trains a linear layer on tensors or on `batch_type`."""

    def __init__(self, name=None):
        super().__init__()
        self.layer, self.name = torch.nn.Linear(2, 1), name

    def training_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (list, tuple)) else batch["x"]
        return self.layer(x).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        if self.name:
            self.log(self.name, 1.0)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loaders():
    data = TensorDataset(torch.randn(8, 2))
    return DataLoader(data, batch_size=4), DataLoader(data, batch_size=4)


def test_a_monitor_the_module_never_logs_fails_at_the_first_validation_with_one_sentence():
    trainer = bare_trainer(max_epochs=5, callbacks=[Contract(monitor="val/acc")])
    with pytest.raises(RaydraError) as error:
        trainer.fit(_Logs("val/loss"), *_loaders())
    assert trainer.current_epoch == 0
    assert str(error.value) == (
        "checkpoint.monitor=val/acc is not a metric _Logs logs (after epoch 1 it had logged val/loss); log it in "
        'validation_step with self.log("val/acc", value, sync_dist=True), or set checkpoint.monitor to a metric it logs '
        "(and checkpoint.mode to min or max)."
    )


def test_a_logged_monitor_passes_and_a_later_first_validation_is_waited_for():
    bare_trainer(max_epochs=2, callbacks=[Contract(monitor="val/acc")]).fit(_Logs("val/acc"), *_loaders())
    # Validating every 2nd epoch: epoch 1 has no val/acc yet, and that is no fault.
    trainer = bare_trainer(max_epochs=3, check_val_every_n_epoch=2, callbacks=[Contract(monitor="val/acc")])
    with pytest.raises(RaydraError, match="after epoch 2 it had logged nothing"):
        trainer.fit(_Logs(None), *_loaders())


def test_a_batch_raydra_cannot_count_is_named():
    class Pair:
        def __init__(self, x):
            self.x = x

    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4, collate_fn=lambda rows: Pair(torch.stack([r[0] for r in rows])))
    with pytest.raises(RaydraError, match="_Logs's training batches are Pair objects; raydra counts samples in a tensor"):
        bare_trainer(max_epochs=1, callbacks=[Contract(monitor="val/acc")]).fit(_Logs("val/acc"), loader)


# ---------------------------------------------------------------------------------------------
# End to end: raydra train from the project's directory


@pytest.mark.e2e
def test_the_own_project_trains_on_two_workers_of_a_cluster_through_raydra_train(ray_cluster, project, tmp_path, monkeypatch):
    outputs = tmp_path / "outputs"
    done = raydra_train(
        "--config-dir", "conf", *OWN_PROJECT_QUICK, "scale.num_workers=2", cwd=project, outputs=outputs, address=ray_cluster
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    (run_dir,) = run_dirs(outputs)
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["epochs_completed"] == 3
    assert summary["metrics"]["final"]["test/acc"] > 0.9 and summary["metrics"]["best"]["val/acc"] > 0.9
    # The cluster's workers got the project through Ray's runtime_env, not from this directory.
    assert f"shipped {project.resolve()} to the workers" in done.stdout
    # The best checkpoint loads back into the project's own class.
    import raydra

    monkeypatch.syspath_prepend(str(project))
    assert type(raydra.load(run_dir)).__name__ == "MLPClassifier"


@pytest.mark.e2e
def test_a_multirun_of_the_own_project_runs_each_job_as_raydra_train(ray_cluster, project, tmp_path):
    outputs = tmp_path / "outputs"
    grid = ("-m", "--config-dir", "conf", *OWN_PROJECT_QUICK, "trainer.max_epochs=1", "scale.num_workers=1", "model.hidden_size=16,32")
    done = raydra_train(*grid, cwd=project, outputs=outputs, address=ray_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = run_dirs(outputs, kind="sweeps")
    assert [summary_of(job)["status"] for job in jobs] == ["completed", "completed"]
    # Each job's own driver shipped the project to its workers.
    for job in jobs:
        assert f"shipped {project.resolve()} to the workers" in (job / "console.log").read_text()


@pytest.mark.e2e
def test_a_monitor_metric_the_module_never_logs_fails_the_run_fast_with_the_sentence(project, tmp_path):
    # A local Ray (no ray.address): its workers import the project from the driver's directory.
    outputs = tmp_path / "outputs"
    done = raydra_train(
        "--config-dir", "conf", *OWN_PROJECT_QUICK, "trainer.max_epochs=30", "checkpoint.monitor=val/f1", cwd=project, outputs=outputs
    )
    assert done.returncode == 1
    (run_dir,) = run_dirs(outputs)
    summary = summary_of(run_dir)
    sentence = "checkpoint.monitor=val/f1 is not a metric MLPClassifier logs (after epoch 1 it had logged "
    assert summary["status"] == "failed" and summary["error"].startswith(sentence), summary["error"]
    assert 'log it in validation_step with self.log("val/f1", value, sync_dist=True)' in summary["error"]
    assert f"error: {summary['error']}" in done.stdout
    assert "epoch 2/30" not in done.stdout and "Traceback" not in done.stdout + done.stderr
