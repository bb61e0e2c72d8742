"""A lightning-hydra-template project on raydra as it is (examples/lightning_hydra_template): its
module built the way Hydra builds it (a nested `net`, partial optimizer and scheduler), its
callbacks and loggers from config, its root keys (paths.*, tags, ckpt_path, seed), and the
records a user relies on (summary.json, raydra.load, raydra compare, TensorBoard's and MLflow's own
files). docs/from-lightning-hydra-template.md is the guide these tests hold to.

The end-to-end runs are few and small (hundreds of 28x28 images, 1-3 epochs): one on 2 workers of
the session's Ray with most of what a template user brings at once, one in local mode that
fine-tunes from it, and two that fail on purpose."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, bare_trainer, raydra_train, run_dirs, summary_of, tensorboard_of
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from raydra.config.checks import validate as validate_schema
from raydra.config.project import check_classes, shadowed_configs
from raydra.config.schema import register_schemas
from raydra.config.user_callbacks import take_over_callbacks
from raydra.entry import CONF_DIR
from raydra.errors import RaydraError, user_error
from raydra.run import resolve

register_schemas()


def validate(cfg):
    """What a run checks of a composed config before Ray starts, past its callbacks (as
    callbacks.resolve_and_validate does): the schema's checks, then the project's classes."""
    validate_schema(cfg)
    check_classes(cfg)


EXAMPLE = REPO / "examples" / "lightning_hydra_template"
# Small: a few hundred images, a global batch of 64.
QUICK = ("model=mnist", "data=mnist", "name=mnist", "data.train_val_test_split=[512,128,128]", "data.batch_size=64")
# A researcher's own callback, from their project: every worker writes the epochs it saw.
SEEN = """import json
from pathlib import Path

from lightning.pytorch import Callback


class Seen(Callback):
    def __init__(self, path: str) -> None:
        self.path, self.epochs = Path(path), []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epochs.append(trainer.current_epoch)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / f"rank_{trainer.global_rank}.json").write_text(json.dumps(self.epochs))
"""


def _forget_src() -> None:
    for name in [m for m in sys.modules if m == "src" or m.startswith("src.")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The example, copied where nothing else is, with the researcher's own callback beside it."""
    copy = tmp_path_factory.mktemp("template") / "mnist-project"
    # The example as committed: no caches, and neither the outputs nor the data a run of it made.
    made = {str(EXAMPLE / "outputs"), str(EXAMPLE / "data")}
    shutil.copytree(EXAMPLE, copy, ignore=lambda folder, names: [n for n in names if n == "__pycache__" or f"{folder}/{n}" in made])
    (copy / "src" / "callbacks").mkdir()
    (copy / "src" / "callbacks" / "__init__.py").write_text("")
    (copy / "src" / "callbacks" / "seen.py").write_text(SEEN)
    _forget_src()
    yield copy
    _forget_src()


@pytest.fixture
def on_path(project, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    _forget_src()
    yield project
    _forget_src()


def composed(project: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=[f"hydra.searchpath=[file://{project / 'configs'}]", *overrides])


# ---------------------------------------------------------------------------------------------
# On 2 workers, then in local mode from its weights: one run each


@pytest.fixture(scope="module")
def trained(project, ray_cluster, tmp_path_factory):
    """The example on 2 workers of the session's cluster, with the template's default callbacks (its
    ModelCheckpoint monitoring val/loss, its EarlyStopping made to stop at the first validation),
    raydra's lr_monitor, the researcher's own callback, and TensorBoard and MLflow beside metrics.csv."""
    outputs = tmp_path_factory.mktemp("outputs")
    done = raydra_train(
        "--config-dir", "configs", *QUICK, "trainer.max_epochs=3", "scale.num_workers=2", "tags=[dev,mnist]",
        "callbacks=[default,lr_monitor]", "callbacks.early_stopping.stopping_threshold=-1", "callbacks.lr_monitor.logging_interval=epoch",
        "callbacks.model_checkpoint.monitor=val/loss", "callbacks.model_checkpoint.mode=min",
        "+callbacks.seen._target_=src.callbacks.seen.Seen", "+callbacks.seen.path=${paths.output_dir}/seen",
        "logger=[csv,tensorboard,mlflow]",
        cwd=project, outputs=outputs, address=ray_cluster,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(outputs)
    return run_dir, done


@pytest.mark.e2e
def test_the_template_project_trains_on_two_workers_with_its_callbacks_and_loggers(trained):
    run_dir, done = trained
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["tags"] == ["dev", "mnist"] and summary["seed"] == 42
    # The ModelCheckpoint drove raydra's checkpointing, said so, and never ran beside it; the
    # progress bar gave way to raydra's lines.
    assert summary["monitor"] == {"metric": "val/loss", "mode": "min"}
    assert "callbacks.model_checkpoint (lightning.pytorch.callbacks.ModelCheckpoint) drives raydra's checkpointing: " in done.stdout
    assert "checkpoint.monitor=val/loss, checkpoint.mode=min, checkpoint.num_to_keep=1" in done.stdout
    assert "callbacks.rich_progress_bar (RichProgressBar) left out" in done.stdout
    assert summary["checkpoints"]["best"] and not list(run_dir.glob("**/epoch_*.ckpt"))

    # EarlyStopping ended training at the first validation, on both workers at the same step.
    stopped = summary["stopped_early"]
    assert stopped["by"] == "callbacks.early_stopping" and stopped["epoch"] == 0 and stopped["monitor"] == "val/acc"
    assert stopped["step"] == summary["global_step"] > 0 and summary["epochs_completed"] == 1
    assert stopped["reason"].startswith("Stopping threshold reached: val/acc =") and 0 <= stopped["value"] <= 1
    for rank in (0, 1):
        log = (run_dir / "logs" / f"worker_{rank}.log").read_text()
        assert f"stopped early at epoch 0, step {stopped['step']}, by callbacks.early_stopping" in log
    # The researcher's own callback ran on every worker, writing into the run's record.
    assert [json.loads((run_dir / "seen" / f"rank_{rank}.json").read_text()) for rank in (0, 1)] == [[0], [0]]

    # The checkpoint holds plain data only: the net and both partials as the config nodes they came from.
    checkpoint = torch.load(run_dir / summary["checkpoints"]["best"], map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["net"]["_target_"] == "src.models.components.simple_dense_net.SimpleDenseNet"
    assert checkpoint["hyper_parameters"]["optimizer"] == {
        "_target_": "torch.optim.Adam",
        "_partial_": True,
        "lr": 0.001,
        "weight_decay": 0.0,
    }
    assert checkpoint["raydra"] == {"instantiate": {"_recursive_": True, "_convert_": "none"}}


@pytest.mark.e2e
def test_tensorboard_and_mlflow_hold_the_run_as_their_own_readers_see_it(trained):
    from mlflow.tracking import MlflowClient

    run_dir, _ = trained
    summary = summary_of(run_dir)
    scalars, hparams = tensorboard_of(run_dir)
    assert {"val/acc", "val/loss", "train/loss", "lr-Adam"} <= set(scalars), scalars
    ((_, val_acc),) = scalars["val/acc"]
    assert val_acc == pytest.approx(summary["metrics"]["final"]["val/acc"], abs=1e-6)
    # HPARAMS: the run's config, nested, beside hp_metric, the best of the monitored val/loss (mode min).
    assert hparams["model/net/lin1_size"] == 64 and hparams["checkpoint/monitor"] == "val/loss"
    assert scalars["hp_metric"] == scalars["val/loss"]
    assert scalars["hp_metric"][0][1] == pytest.approx(summary["metrics"]["best"]["val/loss"], abs=1e-6)

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir}/logs/mlflow/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.run_name == summary["run_id"] and run.info.status == "FINISHED"
    assert {"dev", "mnist"} <= set(run.data.tags) and run.data.tags["raydra.run_id"] == summary["run_id"]
    assert run.data.params["model/net/lin1_size"] == "64" and run.data.params["checkpoint/monitor"] == "val/loss"
    assert run.data.metrics["val/acc"] == pytest.approx(summary["metrics"]["final"]["val/acc"], abs=1e-6)


@pytest.fixture(scope="module")
def fine_tuned(project, trained, tmp_path_factory):
    """The example in local mode, starting from the 2-worker run's weights with a learning rate
    that leaves them as they are."""
    outputs = tmp_path_factory.mktemp("outputs_local")
    done = raydra_train(
        "--config-dir", "configs", *QUICK, "scale.num_workers=0", "trainer.max_epochs=1", "logger=csv",
        f"ckpt_path={trained[0]}", "model.optimizer.lr=1e-12", "callbacks=none",
        cwd=project, outputs=outputs,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(outputs)
    return run_dir


@pytest.mark.e2e
def test_ckpt_path_starts_a_new_local_run_from_the_weights_and_both_runs_load_and_compare(project, trained, fine_tuned, on_path):
    import raydra

    source, summary = summary_of(trained[0]), summary_of(fine_tuned)
    assert summary["status"] == "completed" and summary["run_id"] != source["run_id"] and summary["world_size"] == 0
    assert summary["ckpt_path"] == str(trained[0] / source["checkpoints"]["best"])
    # Optimizer and epochs from scratch: one epoch of its own, not the source's count plus one.
    assert summary["epochs_completed"] == 1 and summary["stopped_early"] is None
    # Local mode records the same final metrics as a Ray run: the last report's, then the test's.
    assert {"val/acc", "val/loss", "train/loss", "epoch", "test/acc"} <= set(summary["metrics"]["final"])
    assert {"val/acc", "test/acc"} <= set(source["metrics"]["final"])

    before, after = raydra.load(trained[0]), raydra.load(fine_tuned)
    for module in (before, after):
        assert type(module).__name__ == "MNISTLitModule" and type(module.net).__name__ == "SimpleDenseNet" and not module.training
    # The weights it started from are the source's (lr 1e-12 barely moves them).
    assert torch.allclose(after.net.model[0].weight, before.net.model[0].weight, atol=1e-6)
    fresh = instantiate(OmegaConf.to_container(composed(project, "model=mnist", "data=mnist").model))
    assert not torch.allclose(fresh.net.model[0].weight, before.net.model[0].weight, atol=1e-3)
    # A checkpoint of another architecture is refused in one sentence naming the first key that differs.
    narrower = instantiate(OmegaConf.to_container(composed(project, "model=mnist", "data=mnist", "model.net.lin1_size=32").model))
    from raydra.records.checkpoints import load_weights

    with pytest.raises(RaydraError) as error:
        load_weights(narrower, str(trained[0] / source["checkpoints"]["best"]), "ckpt_path=x", "point ckpt_path at a run of this model")
    assert str(error.value) == (
        "ckpt_path=x: its weights do not fit MNISTLitModule (net.model.0.weight is [64, 784] in the checkpoint and [32, 784] here); "
        "point ckpt_path at a run of this model."
    )

    compared = subprocess.run(
        [str(Path(sys.executable).parent / "raydra"), "compare", str(trained[0]), str(fine_tuned), "--metric", "val/acc"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert compared.returncode == 0, compared.stderr
    assert trained[0].name in compared.stdout and fine_tuned.name in compared.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [0, 1])
def test_a_worker_error_points_at_the_log_that_holds_its_traceback(project, ray_cluster, tmp_path, workers):
    done = raydra_train(
        "--config-dir", "configs", *QUICK, f"scale.num_workers={workers}", "trainer.max_epochs=1", "logger=none",
        "model.net.input_size=100", cwd=project, outputs=tmp_path, address=ray_cluster if workers else None,
    )  # fmt: skip
    assert done.returncode != 0
    (run_dir,) = run_dirs(tmp_path)
    error = summary_of(run_dir)["error"]
    assert error.startswith("worker 0: RuntimeError: mat1 and mat2 shapes cannot be multiplied") and error.endswith(
        "(the whole trace is in logs/worker_0.log)"
    ), error
    log = (run_dir / "logs" / "worker_0.log").read_text()
    assert "worker 0 failed:\nTraceback (most recent call last):" in log and "in training_step" in log


@pytest.mark.e2e
def test_with_storage_what_a_worker_writes_under_the_output_dir_reaches_storage_and_the_run_directory(project, ray_cluster, tmp_path):
    """paths.storage as an NFS path every node mounts: a worker writes its part of the record into a
    scratch directory of its own and pushes it there, and ${paths.output_dir} follows it."""
    storage = tmp_path / "shared"
    done = raydra_train(
        "--config-dir", "configs", *QUICK, "scale.num_workers=1", "trainer.max_epochs=1", "logger=[csv,tensorboard]",
        "+callbacks.seen._target_=src.callbacks.seen.Seen", "+callbacks.seen.path=${paths.output_dir}/seen", f"paths.storage={storage}",
        cwd=project, outputs=tmp_path / "outputs", address=ray_cluster,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path / "outputs")
    shared = storage / run_dir.relative_to(tmp_path / "outputs")
    for record in (run_dir, shared):
        assert list(record.glob(f"tensorboard/{summary_of(run_dir)['run_id']}/events.out.tfevents.*")), record
        assert json.loads((record / "seen" / "rank_0.json").read_text()) == [0]


# ---------------------------------------------------------------------------------------------
# What the driver says before anything starts


def test_the_template_trainer_keys_are_refused_naming_raydras(project, on_path):
    (project / "configs" / "trainer").mkdir(exist_ok=True)
    # The template's trainer/ddp.yaml, as a researcher brings it.
    (project / "configs" / "trainer" / "ddp.yaml").write_text(
        "defaults:\n  - default\n\nstrategy: ddp\naccelerator: gpu\ndevices: 4\nnum_nodes: 1\nsync_batchnorm: True\n"
    )
    with pytest.raises(RaydraError) as error:
        validate(composed(project, *QUICK, "trainer=ddp"))
    assert str(error.value) == (
        "trainer.accelerator=gpu, trainer.devices=4, trainer.num_nodes=1, trainer.strategy=ddp: raydra sets these itself; "
        "for trainer.accelerator, set scale.use_gpu=true for GPU workers (false: CPU); "
        "for trainer.devices, set scale.num_workers (one device per worker; scale.gpus_per_worker is each one's share of a GPU); "
        "for trainer.num_nodes, set scale.num_workers, the workers over all nodes (Ray places them); "
        "for trainer.strategy, pick strategy=ddp, strategy=fsdp or strategy=deepspeed (docs/from-lightning-hydra-template.md)."
    )
    # Read unresolved: ${paths.output_dir} is null until the run starts.
    with pytest.raises(
        RaydraError, match=r"^trainer._target_=lightning.pytorch.trainer.Trainer, trainer.default_root_dir=\$\{paths.output_dir\}: "
    ):
        validate(
            composed(project, *QUICK, "trainer._target_=lightning.pytorch.trainer.Trainer", "trainer.default_root_dir=${paths.output_dir}")
        )
    # Lightning's own Trainer arguments the template sets are raydra's too.
    validate(composed(project, *QUICK, "trainer.min_epochs=1", "trainer.limit_train_batches=10", "trainer.sync_batchnorm=true"))
    with pytest.raises(RaydraError, match=r"paths.output_dir=/x is the run's own directory, which raydra fills in"):
        validate(composed(project, *QUICK, "paths.output_dir=/x"))


def test_a_file_of_the_project_that_raydras_own_hides_is_named(project, tmp_path):
    configs = tmp_path / "configs"
    shutil.copytree(project / "configs", configs)
    assert shadowed_configs([str(configs), str(CONF_DIR)], CONF_DIR) is None
    (configs / "trainer").mkdir(exist_ok=True)
    (configs / "trainer" / "default.yaml").write_text("max_epochs: 10\n")
    assert shadowed_configs([str(configs)], CONF_DIR) == (
        f"{configs}/trainer/default.yaml is not read: raydra's own file of the same group and name comes first in Hydra's search "
        "path; rename yours (e.g. callbacks/my_early_stopping.yaml) and select that name, or set what differs in an experiment/ "
        "file (docs/from-lightning-hydra-template.md)."
    )


def test_the_template_paths_resolve_to_the_run_and_the_command_directory(project, on_path, tmp_path, monkeypatch):
    monkeypatch.chdir(project)
    cfg = composed(project, *QUICK, "logger=csv")
    config = resolve.resolve(cfg, tmp_path / "run", "r1").resolved_config()
    paths = config["paths"]
    assert paths["root_dir"] == paths["work_dir"] == str(project) and paths["data_dir"] == f"{project}/data"
    assert paths["output_dir"] == str(tmp_path / "run") and paths["log_dir"] == f"{tmp_path / 'run'}/logs"
    assert config["data"]["data_dir"] == f"{project}/data"
    assert config["logger"]["csv"] == {"flush_logs_every_n_steps": 50}
    mlflow = resolve.resolve(composed(project, *QUICK, "logger=mlflow"), tmp_path / "run2", "r2").resolved_config()["logger"]["mlflow"]
    assert mlflow["tracking_uri"] == f"sqlite:///{tmp_path / 'run2'}/logs/mlflow/mlflow.db"


def test_a_model_checkpoint_sets_checkpoint_keys_and_a_conflict_names_both(project, on_path):
    cfg = composed(
        project, *QUICK, "callbacks=default", "callbacks.model_checkpoint.save_top_k=-1", "callbacks.model_checkpoint.every_n_epochs=2"
    )
    take_over_callbacks(cfg, [])
    assert set(cfg.callbacks) == {"early_stopping", "model_summary"}
    assert (cfg.checkpoint.monitor, cfg.checkpoint.mode, cfg.checkpoint.num_to_keep, cfg.checkpoint.every_n_epochs) == (
        "val/acc",
        "max",
        None,
        2,
    )
    validate(cfg)
    take_over_callbacks(cfg, [])  # once taken over, nothing left to do
    overrides = ["callbacks=default", "checkpoint.monitor=val/loss"]
    with pytest.raises(RaydraError) as error:
        take_over_callbacks(composed(project, *QUICK, *overrides), overrides)
    assert str(error.value) == (
        "callbacks.model_checkpoint.monitor=val/acc and checkpoint.monitor=val/loss disagree: a ModelCheckpoint in callbacks sets "
        "checkpoint.monitor, so keep one of the two (or make them agree)."
    )
    with pytest.raises(RaydraError, match=r"callbacks.model_checkpoint.save_top_k=0 would keep no checkpoint"):
        take_over_callbacks(composed(project, *QUICK, "callbacks=default", "callbacks.model_checkpoint.save_top_k=0"), [])
    with pytest.raises(
        RaydraError, match=r"callbacks.model_checkpoint.train_time_interval=.*set callbacks.model_checkpoint.every_n_train_steps"
    ):
        take_over_callbacks(composed(project, *QUICK, "callbacks=default", "callbacks.model_checkpoint.train_time_interval=600"), [])


@pytest.mark.parametrize(
    "overrides, sentence",
    [
        (["+callbacks.stop.patience=3"], "callbacks.stop has no _target_; name the Callback class, e.g. callbacks.stop._target_="),
        (["+callbacks.stop._target_=torch.nn.Linear"], "callbacks.stop._target_=torch.nn.Linear is not a Lightning Callback"),
        (
            ["+callbacks.stop._target_=src.callbacks.nowhere.Stop"],
            "callbacks.stop._target_=src.callbacks.nowhere.Stop: there is no module src.callbacks.nowhere on the import path",
        ),
        (
            ["callbacks=early_stopping", "+callbacks.early_stopping.patiense=3"],
            "callbacks.early_stopping.patiense is not an argument of lightning.pytorch.callbacks.EarlyStopping(",
        ),
        (
            ["callbacks=lr_monitor", "logger=none"],
            "callbacks.lr_monitor (LearningRateMonitor) writes to the run's loggers, and logger=none",
        ),
        (["+logger.tb.save_dir=/tmp"], "logger.tb has no _target_; name the Logger class"),
        (
            ["+logger.tb._target_=lightning.pytorch.callbacks.EarlyStopping"],
            "logger.tb._target_=lightning.pytorch.callbacks.EarlyStopping is not a Lightning Logger",
        ),
    ],
)
def test_a_callback_or_logger_that_cannot_serve_is_named_before_ray_starts(project, on_path, overrides, sentence):
    with pytest.raises(RaydraError) as error:
        validate(composed(project, *QUICK, *overrides))
    assert sentence in str(error.value)


def test_callbacks_none_and_null_mean_none_of_the_users(project, on_path):
    unset = composed(project, *QUICK, "callbacks=early_stopping")
    with open_dict(unset):
        unset.callbacks = None  # `callbacks: null` in a YAML (on the command line: callbacks=none)
    for cfg in (composed(project, *QUICK, "callbacks=none"), composed(project, *QUICK, "~callbacks"), unset):
        validate(cfg)
        take_over_callbacks(cfg, [])
        assert not cfg.get("callbacks")
    with open_dict(unset):
        unset.callbacks = ["lightning.pytorch.callbacks.EarlyStopping"]  # a list, as Lightning's Trainer takes them
    with pytest.raises(
        RaydraError,
        match=r"^callbacks is a list, not a dict of named entries; give each one a name, e.g. callbacks.early_stopping._target_=",
    ):
        validate(unset)
    from raydra.worker.callbacks import build_callbacks

    assert build_callbacks(None, 0) == [] and build_callbacks({}, 0) == [] and build_callbacks({"x": None}, 1) == []
    built = build_callbacks(
        OmegaConf.to_container(composed(project, *QUICK, "callbacks=[early_stopping,lr_monitor]").callbacks, resolve=True), 1
    )
    assert [name for name, _ in built] == ["early_stopping"]  # lr_monitor writes to the loggers, which rank 0 alone has


# ---------------------------------------------------------------------------------------------
# Checkpoints of a module holding objects, without Ray


def _small_data(project):
    from src.data.synthetic_mnist_datamodule import SyntheticMNISTDataModule

    data = SyntheticMNISTDataModule(data_dir=str(project / "data"), train_val_test_split=[64, 32, 32], batch_size=32)
    data.prepare_data()
    return data


def test_a_checkpoint_of_a_module_holding_a_network_and_partials_loads_safely_and_resumes(project, on_path, tmp_path):
    import raydra
    from raydra.worker.hyperparameters import PlainHyperparameters
    from raydra.worker.resumable import Resumable

    model_config = OmegaConf.to_container(composed(project, *QUICK).model, resolve=True)
    module = instantiate(model_config)
    assert isinstance(module.hparams.net, torch.nn.Module) and callable(module.hparams.optimizer)
    data = _small_data(project)
    trainer = bare_trainer(max_epochs=1, callbacks=[Resumable(), PlainHyperparameters(model_config, {"data_dir": "x"})])
    trainer.fit(module, datamodule=data)
    path = tmp_path / "checkpoint.ckpt"
    trainer.save_checkpoint(path)

    checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # no object to unpickle
    assert checkpoint["hyper_parameters"]["net"] == {k: v for k, v in model_config["net"].items()}
    assert checkpoint["hyper_parameters"]["compile"] is False and "hparams_type" not in checkpoint
    loaded = raydra.load(path)
    assert type(loaded.net).__name__ == "SimpleDenseNet" and torch.equal(loaded.net.model[0].weight, module.net.model[0].weight)
    # Resumed with weights_only=True, as every raydra run resumes.
    again = bare_trainer(max_epochs=2)
    again.fit(instantiate(model_config), datamodule=_small_data(project), ckpt_path=path, weights_only=True)
    assert again.current_epoch == 2


def test_a_module_written_for_the_old_convention_is_told_what_changed(project, on_path):
    """A module that calls instantiate() on its optimizer, as raydra's convention asked before."""
    from src.models.mnist_module import MNISTLitModule

    class OldStyle(MNISTLitModule):
        def configure_optimizers(self):
            return instantiate(self.hparams.optimizer)(params=self.parameters())

    built = instantiate(OmegaConf.to_container(composed(project, *QUICK).model, resolve=True))
    module = OldStyle(net=built.net, optimizer=built.hparams.optimizer, scheduler=built.hparams.scheduler, compile=False)
    with pytest.raises(Exception) as raised:
        bare_trainer(max_epochs=1).fit(module, datamodule=_small_data(project))
    error = user_error(raised.value)
    assert str(error) == (
        "the model calls hydra.utils.instantiate on a partial that raydra has already built, as Hydra builds a model (a _partial_ "
        "optimizer or scheduler arrives as a partial, a nested _target_ as its object): call it instead "
        "(self.hparams.optimizer(params=self.parameters())), or add `_recursive_: false` to the model's YAML to get plain config "
        "(docs/own-project.md)."
    )


def test_the_readme_and_the_migration_page_describe_the_example(project):
    page = (REPO / "docs" / "from-lightning-hydra-template.md").read_text()
    assert "raydra train --config-dir configs model=mnist data=mnist" in page
    for name in ("src/models/mnist_module.py", "configs/model/mnist.yaml", "configs/data/mnist.yaml", "configs/callbacks/default.yaml"):
        assert (EXAMPLE / name).is_file() and name in page
    assert re.search(r"from-lightning-hydra-template\.md", (REPO / "README.md").read_text())


def test_secrets_in_logger_settings_are_masked_in_the_record_and_what_the_loggers_log(project, on_path, tmp_path):
    secret = "s3cretpassw0rd"
    uri = f"https://researcher:{secret}@mlflow.example.com"
    config = resolve.resolve(
        composed(project, *QUICK, "logger=mlflow", f"logger.mlflow.tracking_uri={uri}"), tmp_path / "run", "r1"
    ).resolved_config()
    # The logger is built with the real URI; what is logged or recorded has it masked, as W&B's settings.
    assert config["logger"]["mlflow"]["tracking_uri"] == uri
    assert config["run"]["logged_config"]["logger"]["mlflow"]["tracking_uri"] == "https://***@mlflow.example.com"

    from raydra.worker.loggers import build_loggers

    other = ("+logger.other._target_=lightning.pytorch.loggers.CSVLogger", "+logger.other.save_dir=${paths.output_dir}/other")
    spec = resolve.resolve(
        composed(project, *QUICK, "logger=none", *other, f"+ray.runtime_env.env_vars.MLFLOW_TRACKING_PASSWORD={secret}"),
        tmp_path / "run2",
        "r2",
    )
    (logger,) = build_loggers(spec, rank=0)
    logger.save()
    (hparams,) = (tmp_path / "run2" / "other").glob("**/hparams.yaml")
    assert "MLFLOW_TRACKING_PASSWORD: '***'" in hparams.read_text() and secret not in hparams.read_text()


def test_the_templates_experiment_file_composes_and_validates_as_it_is(project, on_path):
    cfg = composed(project, "experiment=example")
    validate(cfg)
    assert (cfg.name, list(cfg.tags), cfg.seed, cfg.trainer.min_epochs, cfg.model.net.lin1_size) == (
        "mnist_example", ["mnist", "simple_dense_net"], 12345, 10, 128,
    )  # fmt: skip
    assert set(cfg.callbacks) == {"model_checkpoint", "early_stopping", "model_summary", "rich_progress_bar"}
