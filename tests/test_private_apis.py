"""What raydra relies on in other libraries' private APIs (raydra.private_apis), pinned.

When an upgrade of Ray, Lightning, datasets or huggingface_hub moves one of these, this file fails
in seconds and names the reach; the slow end-to-end tests would only fail somewhere downstream.
Each test exercises the behaviour raydra uses, not merely that a name exists.
"""

import csv
import inspect
import os

import pytest
import torch
from conftest import bare_trainer

from raydra import private_apis
from raydra.lightning import pl

# ---------------------------------------------------------------------------------------------
# Ray


def test_the_worker_stream_dispatcher_hands_every_line_to_each_handler_until_removed():
    dispatcher = private_apis.worker_stdstream_dispatcher()
    seen = []
    dispatcher.add_handler("raydra-test", seen.append)
    try:
        dispatcher.emit({"lines": ["[raydra] epoch 1/2"], "pid": 7, "actor_name": "RayTrainWorker"})
    finally:
        dispatcher.remove_handler("raydra-test")
    dispatcher.emit({"lines": ["after removal"], "pid": 7})
    assert seen == [{"lines": ["[raydra] epoch 1/2"], "pid": 7, "actor_name": "RayTrainWorker"}]


def test_ray_init_registers_its_worker_printer_under_the_name_raydra_removes():
    import ray._private.worker

    source = inspect.getsource(ray._private.worker)
    assert f'name="{private_apis.RAY_PRINT_LOGS_HANDLER}"' in source
    assert f'remove_handler("{private_apis.RAY_PRINT_LOGS_HANDLER}")' in source


def test_the_tune_stop_probe_reads_the_session_stop_event_it_took_at_the_start(monkeypatch):
    from ray.train._internal import session as train_session

    # Outside a trial there is no session: never "stopped".
    assert private_apis.tune_stop_probe()() is False

    class FakeSession:  # only the attribute raydra reads; the real class needs a running trial
        def __init__(self):
            import threading

            self.stop_event = threading.Event()

    held = FakeSession()
    monkeypatch.setattr(train_session, "get_session", lambda: held)
    probe = private_apis.tune_stop_probe()
    # Tune drops the session when it stops a trial; the probe still answers from the one it held.
    monkeypatch.setattr(train_session, "get_session", lambda: None)
    assert probe() is False
    held.stop_event.set()
    assert probe() is True
    # The real session class keeps a threading.Event of that name.
    assert "self.stop_event = threading.Event()" in inspect.getsource(train_session._TrainSession)


def _trainable(config):
    return {"x": 1}


def test_a_tuners_callbacks_and_scheduler_are_reachable_after_construction(tmp_path):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    scheduler = ASHAScheduler(time_attr="epochs_done", max_t=4, grace_period=1)
    tuner = tune.Tuner(
        _trainable,
        tune_config=tune.TuneConfig(metric="x", mode="max", scheduler=scheduler),
        run_config=tune.RunConfig(name="t", storage_path=str(tmp_path), callbacks=[tune.Callback()]),
    )
    assert private_apis.restored_tuner_scheduler(tuner) is scheduler
    mine = tune.Callback()
    private_apis.replace_restored_tuner_callbacks(tuner, [mine])
    assert tuner._local_tuner.get_run_config().callbacks == [mine]


def test_restored_asha_rungs_keep_the_new_schedulers_metric_and_mode(tmp_path):
    from ray.tune.schedulers import ASHAScheduler

    def asha():
        scheduler = ASHAScheduler(time_attr="epochs_done", max_t=4, grace_period=1, reduction_factor=2)
        scheduler.set_search_properties("val/acc", "max")
        return scheduler

    before = asha()
    rung = before._brackets[0]._rungs[-1]
    rung[1]["trial_a"] = 0.9  # a recorded result at the first milestone
    before.save(str(tmp_path / "asha.pkl"))

    after = asha()
    private_apis.restore_scheduler_rungs(after, str(tmp_path / "asha.pkl"))
    assert after._brackets[0]._rungs[-1][1] == {"trial_a": 0.9}
    # Tune refuses to set metric and mode on a scheduler that already has them, so they must be
    # this process's own: still settable through the public call without an error.
    assert (after._metric, after._mode) == ("val/acc", "max")


# ---------------------------------------------------------------------------------------------
# Lightning


def test_model_parallel_helpers_materialize_move_and_save_shards_that_load_back(tmp_path):
    import torch.distributed.checkpoint as dcp

    with torch.device("meta"):
        module = torch.nn.Linear(3, 2)
    private_apis.materialize_distributed_module(module, torch.device("cpu"))
    assert module.weight.device.type == "cpu" and module.weight.is_meta is False

    optimizer = torch.optim.AdamW(module.parameters())
    module(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    private_apis.optimizers_to_device([optimizer], torch.device("cpu"))
    assert all(v.device.type == "cpu" for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))

    # Single-process save: no process group, as torch.distributed.checkpoint allows.
    private_apis.save_distributed_checkpoint({"state_dict": module.state_dict()}, tmp_path)
    loaded = {"state_dict": {k: torch.zeros_like(v) for k, v in module.state_dict().items()}}
    dcp.load(loaded, checkpoint_id=str(tmp_path))
    assert torch.equal(loaded["state_dict"]["weight"], module.state_dict()["weight"])
    # raydra.checkpoints reads the non-tensor state of a sharded checkpoint from this file.
    assert private_apis.distributed_checkpoint_metadata_file() == "meta.pt"


class _Tiny(pl.LightningModule):
    def __init__(self, num_workers=0):
        super().__init__()
        self.num_workers = num_workers
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.arange(16, dtype=torch.float32).view(8, 2))
        return torch.utils.data.DataLoader(data, batch_size=2, num_workers=self.num_workers)


def test_restarting_the_train_iterator_at_train_start_takes_the_loaders_new_position(tmp_path):
    """Resumable moves the sampler at on_train_start and makes the iterator again: the first batch
    trained must be the one after the skipped ones. With a loader worker process, batches from the
    old position are already queued by then; without the restart index 0 would come first."""
    first = []

    class SkipTwo(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            loader = trainer.train_dataloader
            loader.batch_sampler.sampler = list(range(4, 8))
            private_apis.restart_train_iterator(trainer)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            first.append(batch[0][0].tolist())
            trainer.should_stop = True

    trainer = bare_trainer(max_epochs=1, callbacks=[SkipTwo()], default_root_dir=tmp_path)
    trainer.fit(_Tiny(num_workers=1))
    assert first[0] == [8.0, 9.0]  # index 4, not index 0


def test_csv_columns_set_on_the_writer_make_it_append_under_the_kept_header(tmp_path):
    logger = pl.loggers.CSVLogger(save_dir=str(tmp_path), name="", version="")
    writer = logger.experiment
    path = tmp_path / "metrics.csv"
    with path.open("w", newline="") as file:
        kept = csv.DictWriter(file, fieldnames=["epoch", "step", "val/acc"])
        kept.writeheader()
        kept.writerow({"epoch": 0, "step": 9, "val/acc": 0.5})
    private_apis.set_csv_columns(writer, ["epoch", "step", "val/acc"])
    logger.log_metrics({"val/acc": 0.75, "epoch": 1}, step=19)
    logger.save()
    rows = list(csv.DictReader(path.open()))
    assert [r["val/acc"] for r in rows] == ["0.5", "0.75"]


# ---------------------------------------------------------------------------------------------
# Hugging Face


def test_hub_offline_switches_both_libraries_for_the_block_only():
    import datasets.config
    import huggingface_hub.constants

    before = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    with private_apis.hub_offline():
        assert datasets.config.HF_HUB_OFFLINE is True and huggingface_hub.constants.HF_HUB_OFFLINE is True
        # datasets decides offline-ness from this constant when it resolves a hub id.
        assert "HF_HUB_OFFLINE" in inspect.getsource(datasets.load)
    assert (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE) == before


def test_a_submitted_jobs_working_dir_is_read_from_the_variable_ray_hands_its_driver(monkeypatch):
    import json

    from ray.job_config import JobConfig

    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert private_apis.submitted_job_working_dir() is None
    # What Ray's job supervisor puts there for `ray job submit --working-dir .`.
    job = JobConfig(runtime_env={"working_dir": "gcs://_ray_pkg_abc.zip"})
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": job.runtime_env}))
    assert private_apis.submitted_job_working_dir() == "gcs://_ray_pkg_abc.zip"


def test_ray_trains_controller_polls_at_the_interval_raydra_sets_and_sends_it_on(monkeypatch):
    from ray.train.v2._internal import constants
    from ray.train.v2._internal.execution.controller import controller

    from raydra.private_apis import RAY_TRAIN_POLL_INTERVAL_ENV, poll_workers_often

    # setenv first: monkeypatch then puts the variable back as it was, whatever the test sets.
    monkeypatch.setenv(RAY_TRAIN_POLL_INTERVAL_ENV, "unset")
    monkeypatch.delenv(RAY_TRAIN_POLL_INTERVAL_ENV)
    poll_workers_often(0.5)
    # The controller reads this very variable for its poll interval, and the driver passes it on.
    assert constants.HEALTH_CHECK_INTERVAL_S_ENV_VAR == RAY_TRAIN_POLL_INTERVAL_ENV
    assert "HEALTH_CHECK_INTERVAL_S_ENV_VAR" in open(controller.__file__).read()
    assert constants.get_env_vars_to_propagate()[RAY_TRAIN_POLL_INTERVAL_ENV] == "0.5"
    # A value the user set stays.
    monkeypatch.setenv(RAY_TRAIN_POLL_INTERVAL_ENV, "3")
    poll_workers_often(0.5)
    assert constants.get_env_vars_to_propagate()[RAY_TRAIN_POLL_INTERVAL_ENV] == "3"


def test_an_elastic_trainer_gets_a_policy_that_sees_the_nodes_as_they_are_now(monkeypatch):
    import ray.cloudpickle
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import _AutoscalingCoordinatorActor
    from ray.train import ScalingConfig
    from ray.train.v2._internal import constants
    from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy, FixedScalingPolicy
    from ray.train.v2.api import data_parallel_trainer

    from raydra.private_apis import RAY_TRAIN_START_TIMEOUT_ENV, elastic_reacts_quickly

    monkeypatch.setenv(RAY_TRAIN_START_TIMEOUT_ENV, "unset")
    monkeypatch.delenv(RAY_TRAIN_START_TIMEOUT_ENV)
    # TorchTrainer.fit makes its controller's policy through the module's own name, which is swapped.
    assert "scaling_policy=create_scaling_policy(self.scaling_config)" in inspect.getsource(data_parallel_trainer.DataParallelTrainer.fit)
    original = data_parallel_trainer.create_scaling_policy
    with elastic_reacts_quickly(7):
        elastic = data_parallel_trainer.create_scaling_policy(ScalingConfig(num_workers=(1, 2)))
        fixed = data_parallel_trainer.create_scaling_policy(ScalingConfig(num_workers=2))
        # The controller is started with the timeout from the driver's environment.
        assert constants.get_env_vars_to_propagate()[RAY_TRAIN_START_TIMEOUT_ENV] == "7"
    assert data_parallel_trainer.create_scaling_policy is original and RAY_TRAIN_START_TIMEOUT_ENV not in os.environ
    assert isinstance(fixed, FixedScalingPolicy) and type(elastic).__name__ == "FreshElasticScalingPolicy"
    # What the controller actor gets: the class itself, pickled by value, still Ray's elastic policy.
    shipped = ray.cloudpickle.loads(ray.cloudpickle.dumps(elastic))
    assert isinstance(shipped, ElasticScalingPolicy) and shipped._get_reserved_resources.__qualname__.startswith("_fresh_elastic")
    for name in ("_latest_reserved_resources_query_time", "_latest_reserved_resources", "GET_RESERVED_RESOURCES_INTERVAL_S"):
        assert hasattr(shipped, name)
    assert "self._get_reserved_resources()" in inspect.getsource(ElasticScalingPolicy.make_decision_for_non_running_worker_group)
    # A user's own timeout stays.
    monkeypatch.setenv(RAY_TRAIN_START_TIMEOUT_ENV, "90")
    with elastic_reacts_quickly(7):
        assert constants.get_env_vars_to_propagate()[RAY_TRAIN_START_TIMEOUT_ENV] == "90"
    assert os.environ[RAY_TRAIN_START_TIMEOUT_ENV] == "90"

    # The coordinator's answer: stale after a node dies until its tick, fresh with recompute=True.
    nodes = [{"NodeID": n, "Alive": True, "Resources": {"CPU": 1.0}} for n in ("a", "b")]
    coordinator = _AutoscalingCoordinatorActor(send_resources_request=lambda *args, **kwargs: None, get_cluster_nodes=lambda: nodes)
    coordinator.request_resources("train-x", [{"CPU": 1.0}] * 2, expire_after_s=180)
    assert set(coordinator.get_reserved_resources("train-x")) == {"a", "b"}
    nodes[1]["Alive"] = False
    assert set(coordinator.get_reserved_resources("train-x")) == {"a", "b"}
    assert set(coordinator.get_reserved_resources("train-x", recompute=True)) == {"a"}


def test_nothing_outside_private_apis_reaches_into_private_modules():
    """The fence itself: a new reach must be added here, with its own test, not in passing."""
    import pathlib
    import re

    root = pathlib.Path(private_apis.__file__).parent
    pattern = re.compile(r"\._private\b|\._internal\b|_local_tuner|_data_fetcher|metrics_keys|HF_HUB_OFFLINE\s*=")
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        if path.name != "private_apis.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


@pytest.mark.parametrize("package", ["ray", "pytorch-lightning", "transformers", "datasets", "huggingface-hub"])
def test_installed_versions_are_inside_the_caps_this_file_was_run_against(package):
    """pyproject.toml caps each library whose private API raydra reaches at the minor version this
    file passed with; an install outside the caps means nobody has run it against that version."""
    from importlib import metadata
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    requirements = {Requirement(r).name.lower(): Requirement(r) for r in project["dependencies"]}
    requirement = requirements[package]
    assert any(spec.operator == "<" for spec in requirement.specifier), f"{package} has no upper bound"
    assert requirement.specifier.contains(metadata.version(package), prereleases=True)
