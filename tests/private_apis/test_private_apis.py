"""What raydra relies on in other libraries' private APIs (raydra.private_apis), pinned.

When an upgrade of Ray, Lightning, datasets or huggingface_hub moves one of these, this file fails
in seconds and names the reach; the slow end-to-end tests would only fail somewhere downstream.
Each test exercises the behaviour raydra uses, not merely that a name exists.
"""

import ast
import csv
import inspect
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import cloudpickle
import pytest
import torch
from helpers import REPO, bare_trainer

import raydra.private_apis
from raydra.lightning import pl
from raydra.private_apis.hugging_face import hub_offline
from raydra.private_apis.hydra import report_as_hydra_does
from raydra.private_apis.lightning import (
    csv_columns,
    csv_pending,
    csv_saved,
    distributed_checkpoint_metadata_file,
    epoch_end_logging_step,
    materialize_distributed_module,
    optimizers_to_device,
    restart_train_iterator,
    save_distributed_checkpoint,
    set_csv_columns,
    tensorboard_default_hp_metric,
)
from raydra.private_apis.ray import (
    RAY_NODE_DRAIN_TIMEOUT_ENV,
    RAY_PRINT_LOGS_HANDLER,
    RAY_STATE_API_ADDRESS_ENV,
    import_main_module,
    state_api_address_env,
    submitted_job_working_dir,
    worker_stdstream_dispatcher,
)
from raydra.private_apis.ray_train import (
    RAY_TRAIN_WORKER_MODULE,
    _rendezvous_sockets,
    join_process_group,
    ray_train_worker_imported,
    registered_checkpoint_names,
    rendezvous_listener,
    torch_config,
)
from raydra.private_apis.ray_tune import (
    replace_restored_tuner_callbacks,
    restore_scheduler_rungs,
    restored_tuner_scheduler,
    tune_stop_probe,
)
from raydra.private_apis.torch import FLIGHT_RECORDER_ENV, apply_activation_checkpointing, flight_record

# ---------------------------------------------------------------------------------------------
# Ray


def test_the_worker_stream_dispatcher_hands_every_line_to_each_handler_until_removed():
    dispatcher = worker_stdstream_dispatcher()
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
    assert f'name="{RAY_PRINT_LOGS_HANDLER}"' in source
    assert f'remove_handler("{RAY_PRINT_LOGS_HANDLER}")' in source


def test_the_tune_stop_probe_reads_the_session_stop_event_it_took_at_the_start(monkeypatch):
    from ray.train._internal import session as train_session

    # Outside a trial there is no session: never "stopped".
    assert tune_stop_probe()() is False

    class FakeSession:  # only the attribute raydra reads; the real class needs a running trial
        def __init__(self):
            import threading

            self.stop_event = threading.Event()

    held = FakeSession()
    monkeypatch.setattr(train_session, "get_session", lambda: held)
    probe = tune_stop_probe()
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
    assert restored_tuner_scheduler(tuner) is scheduler
    mine = tune.Callback()
    replace_restored_tuner_callbacks(tuner, [mine])
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
    restore_scheduler_rungs(after, str(tmp_path / "asha.pkl"))
    assert after._brackets[0]._rungs[-1][1] == {"trial_a": 0.9}
    # Tune refuses to set metric and mode on a scheduler that already has them, so they must be
    # this process's own: still settable through the public call without an error.
    assert (after._metric, after._mode) == ("val/acc", "max")


# ---------------------------------------------------------------------------------------------
# Lightning


def test_activation_checkpointing_wraps_the_chosen_blocks_and_keeps_their_outputs_and_gradients():
    """FSDP's activation_checkpointing: each chosen block recomputes its activations in backward."""
    from torch import nn

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    wrapped = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    wrapped.load_state_dict(plain.state_dict())
    apply_activation_checkpointing(wrapped, check_fn=lambda m: isinstance(m, nn.Linear))
    assert [type(m).__name__ for m in wrapped] == ["CheckpointWrapper", "ReLU", "CheckpointWrapper"]
    x = torch.randn(3, 4)
    plain(x).sum().backward()
    wrapped(x).sum().backward()
    torch.testing.assert_close(wrapped[0]._checkpoint_wrapped_module.weight.grad, plain[0].weight.grad)
    # The wrapper keeps the block's parameter names loadable: its prefix is dropped from state_dict.
    assert set(wrapped.state_dict()) == set(plain.state_dict())


def test_model_parallel_helpers_materialize_move_and_save_shards_that_load_back(tmp_path):
    import torch.distributed.checkpoint as dcp

    with torch.device("meta"):
        module = torch.nn.Linear(3, 2)
    materialize_distributed_module(module, torch.device("cpu"))
    assert module.weight.device.type == "cpu" and module.weight.is_meta is False

    optimizer = torch.optim.AdamW(module.parameters())
    module(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    optimizers_to_device([optimizer], torch.device("cpu"))
    assert all(v.device.type == "cpu" for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))

    # Single-process save: no process group, as torch.distributed.checkpoint allows.
    save_distributed_checkpoint({"state_dict": module.state_dict()}, tmp_path)
    loaded = {"state_dict": {k: torch.zeros_like(v) for k, v in module.state_dict().items()}}
    dcp.load(loaded, checkpoint_id=str(tmp_path))
    assert torch.equal(loaded["state_dict"]["weight"], module.state_dict()["weight"])
    # raydra.records.checkpoints reads the non-tensor state of a sharded checkpoint from this file.
    assert distributed_checkpoint_metadata_file() == "meta.pt"


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
            restart_train_iterator(trainer)

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
    set_csv_columns(writer, ["epoch", "step", "val/acc"])
    logger.log_metrics({"val/acc": 0.75, "epoch": 1}, step=19)
    logger.save()
    rows = list(csv.DictReader(path.open()))
    assert [r["val/acc"] for r in rows] == ["0.5", "0.75"]


def test_the_csv_writer_hands_over_its_pending_rows_and_columns_and_forgets_the_rows_once_saved(tmp_path):
    logger = pl.loggers.CSVLogger(save_dir=str(tmp_path), name="", version="")
    writer = logger.experiment
    logger.log_metrics({"train/loss": 1.0, "epoch": 0}, step=0)
    path, pending, before, new_columns = csv_pending(writer)
    assert path == str(tmp_path / "metrics.csv") and before == [] and new_columns
    assert pending == [{"train/loss": 1.0, "epoch": 0, "step": 0}]
    # The new rows' keys are the writer's columns now, sorted, as its own save() has them.
    assert csv_columns(writer) == ["epoch", "step", "train/loss"]
    csv_saved(writer)
    logger.log_metrics({"train/loss": 0.5, "epoch": 0}, step=1)
    path, pending, before, new_columns = csv_pending(writer)
    assert pending == [{"train/loss": 0.5, "epoch": 0, "step": 1}] and before == ["epoch", "step", "train/loss"] and not new_columns
    # The writer's own save appends under the columns it holds: what replace_csv_whole stands in for.
    assert "_record_new_keys()" in inspect.getsource(type(writer).save)


def test_the_csv_writer_replaces_metrics_csv_whole_at_each_save(tmp_path):
    from raydra.worker.loggers import replace_csv_whole

    logger = pl.loggers.CSVLogger(save_dir=str(tmp_path), name="", version="")
    replace_csv_whole(logger.experiment)
    path = tmp_path / "metrics.csv"
    logger.log_metrics({"train/loss": 1.0, "epoch": 0}, step=0)
    logger.save()
    first = path.read_text()
    held = path.open()  # the file as it was: an append would change it, a replace leaves it be
    logger.log_metrics({"train/loss": 0.5, "epoch": 0}, step=1)
    logger.save()
    # A new column: every row again, under the new header.
    logger.log_metrics({"val/acc": 0.75, "epoch": 0}, step=1)
    logger.save()
    rows = list(csv.DictReader(path.open()))
    assert [(r["step"], r["train/loss"], r["val/acc"]) for r in rows] == [("0", "1.0", ""), ("1", "0.5", ""), ("1", "", "0.75")]
    # Replaced, not appended to in place: a new file each time, and nothing left beside it.
    assert held.read() == first and not list(tmp_path.glob("*tmp*"))
    held.close()


class _TwoOptimizers(pl.LightningModule):
    """Manual optimization with two optimizers, as a GAN steps them: two optimizer steps a batch."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.a, self.b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        for optimizer, layer in zip(self.optimizers(), (self.a, self.b)):
            loss = layer(batch[0]).pow(2).mean()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        self.log("train/loss", loss, on_step=False, on_epoch=True)

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.a(batch[0]).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)


def test_epoch_end_logging_step_is_the_step_an_epochs_end_and_validation_metrics_are_logged_at():
    from torch.utils.data import DataLoader, TensorDataset

    logged, read = {}, []

    class Steps(pl.loggers.Logger):
        name, version = "steps", 0

        def log_metrics(self, metrics, step=None):
            for key in metrics:
                logged.setdefault(key, []).append(step)

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    class Read(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            read.append((epoch_end_logging_step(trainer), trainer.global_step))

    loader = DataLoader(TensorDataset(torch.randn(10, 2)), batch_size=2)
    trainer = bare_trainer(max_epochs=2, logger=Steps(), callbacks=[Read()], num_sanity_val_steps=0)
    trainer.fit(_TwoOptimizers(), loader, loader)
    # 5 batches an epoch, two optimizer steps each: global_step is 10 and 20, the logged steps 4 and 9.
    assert read == [(4, 10), (9, 20)]
    assert logged["train/loss"] == logged["val/loss"] == [4, 9]


def test_tensorboard_logger_keeps_default_hp_metric_as_built(tmp_path):
    assert tensorboard_default_hp_metric(pl.loggers.TensorBoardLogger(str(tmp_path)))
    assert not tensorboard_default_hp_metric(pl.loggers.TensorBoardLogger(str(tmp_path), default_hp_metric=False))


# ---------------------------------------------------------------------------------------------
# Hugging Face


def test_hub_offline_switches_both_libraries_for_the_block_only():
    import datasets.config
    import huggingface_hub.constants

    before = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    with hub_offline():
        assert datasets.config.HF_HUB_OFFLINE is True and huggingface_hub.constants.HF_HUB_OFFLINE is True
        # datasets decides offline-ness from this constant when it resolves a hub id.
        assert "HF_HUB_OFFLINE" in inspect.getsource(datasets.load)
    assert (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE) == before


def test_a_submitted_jobs_working_dir_is_read_from_the_variable_ray_hands_its_driver(monkeypatch):
    import json

    from ray.job_config import JobConfig

    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert submitted_job_working_dir() is None
    # What Ray's job supervisor puts there for `ray job submit --working-dir .`.
    job = JobConfig(runtime_env={"working_dir": "gcs://_ray_pkg_abc.zip"})
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": job.runtime_env}))
    assert submitted_job_working_dir() == "gcs://_ray_pkg_abc.zip"


def test_ray_trains_controller_polls_at_the_interval_raydra_sets_and_sends_it_on(monkeypatch):
    from ray.train.v2._internal import constants
    from ray.train.v2._internal.execution.controller import controller

    from raydra.private_apis.ray_train import RAY_TRAIN_POLL_INTERVAL_ENV, poll_workers_often

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


def test_ray_trains_controller_gives_worker_groups_the_start_timeout_raydra_sets_and_sends_it_on(monkeypatch):
    from ray.train.v2._internal import constants

    from raydra.private_apis.ray_train import RAY_TRAIN_START_TIMEOUT_ENV, worker_groups_start_within

    monkeypatch.setenv(RAY_TRAIN_START_TIMEOUT_ENV, "unset")
    monkeypatch.delenv(RAY_TRAIN_START_TIMEOUT_ENV)
    with worker_groups_start_within(300):
        # The controller's worker group reads this very variable, and the driver passes it on.
        assert constants.WORKER_GROUP_START_TIMEOUT_S_ENV_VAR == RAY_TRAIN_START_TIMEOUT_ENV
        assert constants.get_env_vars_to_propagate()[RAY_TRAIN_START_TIMEOUT_ENV] == "300"
    # Only while the trainer starts: the next fit in this process sets its own.
    assert RAY_TRAIN_START_TIMEOUT_ENV not in constants.get_env_vars_to_propagate()
    # A value the user set stays.
    monkeypatch.setenv(RAY_TRAIN_START_TIMEOUT_ENV, "45")
    with worker_groups_start_within(300):
        assert constants.get_env_vars_to_propagate()[RAY_TRAIN_START_TIMEOUT_ENV] == "45"
    assert constants.get_env_vars_to_propagate()[RAY_TRAIN_START_TIMEOUT_ENV] == "45"


def test_ray_train_sets_up_the_process_group_through_raydras_backend_whose_store_listens_on_one_address(monkeypatch):
    """raydra's TorchConfig reaches Ray Train's backend set-up as given (TorchTrainer fills in the
    backend), which builds the backend from the config's class and starts it on each worker group
    through the group's execute methods; the backend's own part, rank 0's store served on the
    socket it bound, listens on that address alone (torch's env:// store: on every interface, `::`),
    and the process group works over it. tests/system/test_multirun.py and test_train_e2e.py check the
    store's address in real runs."""
    import psutil
    import ray.train
    import torch.distributed as dist
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.backend_setup import BackendSetupCallback
    from ray.train.v2._internal.execution.worker_group.execution_group import ExecutionGroup

    config = torch_config(backend=None, timeout_s=60)
    trainer = TorchTrainer(lambda: None, torch_config=config, scaling_config=ray.train.ScalingConfig(num_workers=1))
    assert trainer.backend_config is config and config.backend == "gloo" and config.timeout_s == 60
    # Ray's TorchConfig's fields and what its backend does beside the process group, as raydra's
    # config and backend carry them (without deriving from classes whose module imports torch).
    from ray.train.torch.config import TorchConfig, _TorchBackend

    assert config.to_dict() == TorchConfig(backend="gloo", timeout_s=60).to_dict()
    assert (
        config.framework == TorchConfig().framework
        and config.backend_cls.share_cuda_visible_devices == _TorchBackend.share_cuda_visible_devices
    )
    assert "_set_torch_distributed_env_vars" in inspect.getsource(_TorchBackend.on_start)
    assert "_shutdown_torch" in inspect.getsource(_TorchBackend.on_shutdown)
    assert TorchConfig().train_func_context.__name__ == "TorchConfigContextManager"
    # Where Ray Train's controller unpickles the config (by value, as the trainer sends it), no torch is imported.
    unpickled = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; config = pickle.load(sys.stdin.buffer); print(config.backend, 'torch' in sys.modules)"],
        input=cloudpickle.dumps(config),
        capture_output=True,
        timeout=120,
    )
    assert unpickled.stdout.split() == [b"gloo", b"False"], unpickled.stderr[-2000:]
    assert "backend_config.backend_cls()" in inspect.getsource(BackendSetupCallback.__init__)
    assert "self._backend.on_start(execution_group, self._backend_config)" in inspect.getsource(BackendSetupCallback)
    for name in ("execute_single", "execute_single_async"):
        assert list(inspect.signature(getattr(ExecutionGroup, name)).parameters)[:3] == ["self", "rank", "fn"], name

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    address, port = rendezvous_listener()
    join_process_group("gloo", world_rank=0, world_size=1, address=address, port=port, timeout_s=30)
    try:
        listening = [
            c.laddr.ip for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
        assert listening == ["127.0.0.1"]
        summed = torch.ones(2)
        dist.all_reduce(summed)
        assert summed.tolist() == [1.0, 1.0] and dist.get_world_size() == 1
    finally:
        dist.destroy_process_group()
    # A node address that is none of this machine's (a NAT's) cannot be bound: every interface, as torch's own.
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "203.0.113.9")
    assert rendezvous_listener()[0] == "203.0.113.9"
    with _rendezvous_sockets.pop() as listener:
        assert listener.getsockname()[0] == "0.0.0.0"


def test_the_state_api_address_named_in_the_environment_is_the_one_rays_clients_and_train_ask(monkeypatch):
    """What a local Ray's processes (Ray Train's placement-group cleaner among them) ask for the
    State API: the dashboard named in the environment, not /tmp/ray/ray_current_cluster's."""
    from ray.dashboard.utils import get_address_for_submission_client
    from ray.train.v2._internal.execution.controller import placement_group_cleaner
    from ray.train.v2._internal.state import util

    env = state_api_address_env(18265)
    assert env == {RAY_STATE_API_ADDRESS_ENV: "http://127.0.0.1:18265"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # named first, before RAY_ADDRESS
    assert get_address_for_submission_client(None) == "http://127.0.0.1:18265"
    # The cleaner's liveness check goes through the State API with no address of its own.
    assert "is_actor_alive" in inspect.getsource(placement_group_cleaner)
    assert "get_actor(actor_id, timeout=timeout)" in inspect.getsource(util.is_actor_alive)


# A Ray Train run of one worker that reaches the two worker-side helpers the preemption notice uses.
# The driver lists the run's worker processes as SLURM's time-limit notice does, while it trains.
WORKER_SIDE_SCRIPT = """
import os, sys, tempfile, threading, time
import ray, ray.train
from ray.train.torch import TorchTrainer
from raydra.private_apis.ray_train import run_on_train_worker_main_thread, train_worker_actors, wait_until_reports_taken

listed, marker = [], os.path.join(tempfile.mkdtemp(), "listed")

def list_workers():
    job, deadline = ray.get_runtime_context().get_job_id(), time.time() + 60
    try:
        while not listed and time.time() < deadline:
            listed.extend(train_worker_actors(job))
            time.sleep(0.2)
    finally:
        open(marker, "w").close()

def train_fn():
    on_main = run_on_train_worker_main_thread(lambda: threading.current_thread() is threading.main_thread())
    ray.train.report({"reported": 1})
    while not os.path.exists(marker):
        time.sleep(0.1)
    return {"on_main": on_main, "taken": wait_until_reports_taken(30), "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

ray.init(address=sys.argv[1])
threading.Thread(target=list_workers, daemon=True).start()
result = TorchTrainer(train_fn, scaling_config=ray.train.ScalingConfig(num_workers=1),
                      run_config=ray.train.RunConfig(storage_path=tempfile.mkdtemp())).fit()
worker = result.return_value
print("RESULT", {"on_main": worker["on_main"], "taken": worker["taken"]})
print("LISTED", [(int(w["pid"]) == worker["pid"], w["node_id"] == worker["node"]) for w in listed])
"""


@pytest.mark.e2e
def test_a_train_worker_runs_a_function_on_its_main_thread_sees_its_reports_taken_and_is_listed(ray_cluster):
    """The preemption notice installs its SIGTERM handler through the first (only a process's main
    thread may) and stops only after the second says the controller took its checkpoint; SLURM's
    time-limit notice finds the run's worker processes (pid and node) through the third."""
    import subprocess
    import sys

    from helpers import base_env

    from raydra.cluster.ray_node import free_port

    # Another cluster recorded as the latest in Ray's temp dir, as a SLURM job's or a test's own
    # `ray start` leaves it: the list must still come from the cluster the driver joined.
    temp_dir = pathlib.Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: Ray's socket paths live below it
    (temp_dir / "ray").mkdir()
    (temp_dir / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")
    env = {**base_env(), "RAY_TMPDIR": str(temp_dir)}
    env.pop("RAY_API_SERVER_ADDRESS", None)
    try:
        done = subprocess.run([sys.executable, "-c", WORKER_SIDE_SCRIPT, ray_cluster], capture_output=True, text=True, timeout=300, env=env)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert "RESULT {'on_main': True, 'taken': True}" in done.stdout, done.stdout + done.stderr
    assert "LISTED [(True, True)]" in done.stdout, done.stdout + done.stderr


# On a local Ray of its own, started as a run that shares its process starts it (Ray Data's
# AutoscalingCoordinator is detached and made once per cluster): a one-worker run without datasets
# and with both helpers left out, then one with a dataset and Ray Train's defaults (the preemption
# watcher switched back on: connect switches it off on a one-node cluster); counts each helper's
# actors after each, asking the State API the way the cleaner does (through
# RAY_API_SERVER_ADDRESS, which connect sets).
HELPERS_SCRIPT = """
import os, tempfile
import ray, ray.data, ray.train
from ray.util.state import list_actors
from raydra.cluster.ray_cluster import connect
from raydra.private_apis.ray_train import torch_trainer_class

def train_fn():
    ray.train.report({"reported": 1})

connect(None, 2, False)
watcher_switch = os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"]
def count(name):
    return len(list_actors(filters=[("class_name", "=", name)], limit=10000))
counts = []
for left_out in (True, False):
    cls = torch_trainer_class(placement_group_cleaner=False, autoscaling_requests=False) if left_out else torch_trainer_class()
    datasets = None if left_out else {"train": ray.data.range(4)}
    os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = watcher_switch if left_out else "1"
    cls(train_fn, datasets=datasets, scaling_config=ray.train.ScalingConfig(num_workers=1),
        run_config=ray.train.RunConfig(storage_path=tempfile.mkdtemp())).fit()
    counts.append([count(name) for name in ("PlacementGroupCleaner", "_AutoscalingCoordinatorActor", "DatasetManager", "PreemptionWatcher")])
print("HELPERS", counts)
"""


@pytest.mark.e2e
def test_a_trainer_leaves_out_the_helpers_a_run_has_no_use_for_and_keeps_them_otherwise():
    """torch_trainer_class: a run without datasets starts no DatasetManager (Ray Train's Ray Data
    set-up), and with placement_group_cleaner=False, autoscaling_requests=False neither the cleaner
    nor the AutoscalingCoordinator; a run with datasets on Ray Train's defaults starts all three.
    Ray Train's controller honours the preemption watcher's switch, which connect turned off for
    this one-node cluster. The local Ray serves the State API the cleaner asks."""
    import subprocess
    import sys

    from helpers import own_local_ray_env

    done = subprocess.run([sys.executable, "-c", HELPERS_SCRIPT], capture_output=True, text=True, timeout=300, env=own_local_ray_env())
    assert "HELPERS [[0, 0, 0, 0], [1, 1, 1, 1]]" in done.stdout, done.stdout + done.stderr[-3000:]


# A driver whose actor made a placement group, as Ray Train's controller makes the workers'. The
# actor dies (as a controller may, ungracefully) while the driver lives on; then the driver exits
# without removing the group.
PLACEMENT_GROUP_OWNER = """
import os, signal, sys, time, ray
from ray.util.placement_group import placement_group_table, placement_group

@ray.remote(num_cpus=0)
class Controller:
    def make(self):
        group = placement_group([{"CPU": 1}])
        ray.get(group.ready())
        return group.id.hex(), os.getpid()

ray.init(address=sys.argv[1])
group, pid = ray.get(Controller.remote().make.remote())
os.kill(pid, signal.SIGKILL)
time.sleep(3)
print("GROUP", group, placement_group_table()[group]["state"])
"""

PLACEMENT_GROUP_STATE = """
import sys, time, ray
from ray.util.placement_group import placement_group_table

ray.init(address=sys.argv[1])
for _ in range(100):
    state = placement_group_table().get(sys.argv[2], {}).get("state")
    if state == "REMOVED":
        break
    time.sleep(0.2)
print("STATE", state)
"""


@pytest.mark.e2e
def test_ray_removes_a_jobs_placement_groups_when_its_driver_exits(ray_cluster):
    """Why Ray Train has a placement-group cleaner, and why a run whose process ends with it can go
    without one (fit.fit_and_record's process_ends_with_run): a placement group made by an actor
    that dies stays while the driver lives on, and goes when the driver's process exits."""
    import subprocess
    import sys

    from helpers import base_env

    made = subprocess.run(
        [sys.executable, "-c", PLACEMENT_GROUP_OWNER, ray_cluster], capture_output=True, text=True, timeout=120, env=base_env()
    )
    assert made.returncode == 0 and "GROUP " in made.stdout, made.stdout + made.stderr[-3000:]
    group, state = made.stdout.split("GROUP ")[-1].split()
    assert state == "CREATED"  # its maker dead, the driver alive: the group still holds its CPU
    seen = subprocess.run(
        [sys.executable, "-c", PLACEMENT_GROUP_STATE, ray_cluster, group], capture_output=True, text=True, timeout=120, env=base_env()
    )
    assert "STATE REMOVED" in seen.stdout, seen.stdout + seen.stderr[-3000:]


def test_rays_checkpoint_snapshot_names_the_registered_checkpoints_latest_last(tmp_path):
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import _CheckpointManagerState, _TrainingResultState

    def result(name):
        return _TrainingResultState(checkpoint_dir_name=name, metrics={"val/acc": 0.5})

    # As Ray writes it: kept ones ranked by score, and the latest (here not the best) on its own.
    snapshot = _CheckpointManagerState(
        checkpoint_results=[result("checkpoint_2"), result("checkpoint_1")],
        checkpoint_report_indices=[2, 1],
        latest_checkpoint_result=result("checkpoint_2"),
        pending_training_results=[],
        pending_validation_specs=[],
        current_report_index=3,
        validated_checkpoint_dir_names=[],
        timed_out_validation_checkpoint_dir_names=[],
        failed_validation_checkpoint_dir_names=[],
    )
    (tmp_path / CHECKPOINT_MANAGER_SNAPSHOT_FILENAME).write_text(snapshot.json())
    assert registered_checkpoint_names(str(tmp_path)) == ["checkpoint_1", "checkpoint_2"]
    # Truncated (a full disk under Ray's own write) or absent: nothing to go by.
    (tmp_path / CHECKPOINT_MANAGER_SNAPSHOT_FILENAME).write_text(snapshot.json()[:40])
    assert registered_checkpoint_names(str(tmp_path)) is None
    assert registered_checkpoint_names(str(tmp_path / "none")) is None


def test_an_elastic_trainer_gets_a_policy_that_sees_the_nodes_as_they_are_now(monkeypatch):
    import ray.cloudpickle
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import _AutoscalingCoordinatorActor
    from ray.train import ScalingConfig
    from ray.train.v2._internal import constants
    from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy, FixedScalingPolicy
    from ray.train.v2.api import data_parallel_trainer

    from raydra.private_apis.ray_train import RAY_TRAIN_START_TIMEOUT_ENV, elastic_reacts_quickly

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


# Environment variables of Ray and torch that their documentation names for users (docs.ray.io:
# Ray Core's RAY_ADDRESS, usage stats, token authentication; Ray Tune's and Ray AIR's pages of
# environment variables; torch's "Miscellaneous Environment Variables"). Any other RAY_*, TUNE_*,
# TORCH_*, TORCHELASTIC_* name is an internal one and is read or set in private_apis.py only.
PUBLIC_ENV_VARS = {
    "RAY_ADDRESS", "RAY_USAGE_STATS_ENABLED", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AIR_NEW_OUTPUT",
    "TUNE_GLOBAL_CHECKPOINT_S", "TORCH_FORCE_WEIGHTS_ONLY_LOAD",
}  # fmt: skip
PRIVATE_ENV_VAR = re.compile(r"(__)?(RAY|TUNE|TORCH|TORCHELASTIC)_[A-Z0-9_]+")
# Attributes of other libraries' objects (not modules) that raydra reaches; a module path is found
# by the walk below instead.
PRIVATE_ATTRIBUTES = re.compile(r"_local_tuner|_data_fetcher|_record_new_keys|metrics_keys|metrics_file_path|HF_HUB_OFFLINE\s*=")
OUR_PACKAGES = {"raydra", "hydra_plugins"}


def _private_segment(dotted: str) -> bool:
    """Whether a dotted path of another library passes through a private name (`ray._private`,
    `torch.distributed._checkpoint`); dunders (`__version__`) are public."""
    parts = dotted.split(".")
    return (
        parts[0] not in OUR_PACKAGES
        and parts[0] not in sys.stdlib_module_names
        and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])
    )


def fence_offences(source: str) -> list:
    """What in `source` reaches into another library's private API: a module path with a `._name`
    segment (imported, used as an attribute path of an imported module, or named in a string),
    an object attribute of PRIVATE_ATTRIBUTES, or a private Ray/torch environment variable."""
    tree = ast.parse(source)
    modules = set()  # names bound to another library's modules or objects by an import
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _private_segment(alias.name):
                    found.append((node.lineno, f"import {alias.name}"))
                modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if _private_segment(f"{node.module}.{alias.name}"):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
                if node.module.split(".")[0] not in OUR_PACKAGES:
                    modules.add(alias.asname or alias.name)
    inner_links = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner_links:  # each whole path once
            chain, inner = [], node
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in modules:
                dotted = ".".join([inner.id, *reversed(chain)])
                if _private_segment(dotted):
                    found.append((node.lineno, dotted))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if re.fullmatch(r"[A-Za-z_][\w.]*", text) and "." in text and _private_segment(text):
                found.append((node.lineno, repr(text)))
            if PRIVATE_ENV_VAR.fullmatch(text) and text not in PUBLIC_ENV_VARS:
                found.append((node.lineno, f"environment variable {text}"))
    for n, line in enumerate(source.splitlines(), 1):
        if PRIVATE_ATTRIBUTES.search(line):
            found.append((n, line.strip()))
    return sorted(set(found))


def test_hydras_report_of_an_error_is_its_message_for_its_own_and_a_traceback_for_others(capsys):
    """What raydra's entry hands back to Hydra when it has no sentence of its own for an error."""
    from hydra.errors import MissingConfigException

    with pytest.raises(SystemExit) as exited:
        report_as_hydra_does(MissingConfigException("In 'train': Could not find 'experiment/nope'", "experiment/nope"))
    assert exited.value.code == 1
    assert capsys.readouterr().err.startswith("In 'train': Could not find 'experiment/nope'\n")
    try:
        raise KeyError("not Hydra's")
    except KeyError as error:
        with pytest.raises(SystemExit):
            report_as_hydra_does(error)
    assert 'KeyError: "not Hydra\'s"' in capsys.readouterr().err


def test_the_fence_sees_every_kind_of_private_reach():
    reaches = {
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing": 1,
        "from ray._private import worker": 1,
        "import ray._private.worker": 1,
        "from ray.train.v2 import _internal": 1,
        "import torch\nfsdp = torch.distributed._composable": 1,
        "import ray.train as rt\nx = rt._internal.session": 1,
        "import importlib\nm = importlib.import_module('ray.train.v2._internal.constants')": 1,
        "import os\nos.environ.setdefault('RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S', '300')": 1,
        "import os\nos.environ['RAY_API_SERVER_ADDRESS'] = 'http://127.0.0.1:8265'": 1,
        "env = {'TORCH_NCCL_ASYNC_ERROR_HANDLING': '1', 'TORCHELASTIC_RUN_ID': 'x', '__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR': 'm.f'}": 3,
        "loop = trainer.fit_loop._data_fetcher": 1,
    }
    for source, count in reaches.items():
        assert len(fence_offences(source)) == count, source
    public = (
        "import os, sys\nimport torch\nfrom raydra import _private_helper\n"
        "v = torch.__version__\nf = sys._getframe\nos.environ.get('RAY_ADDRESS')\nos.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')\n"
        "hint = 'set RAY_AUTH_MODE=token'\nname = 'RAYDRA_MULTIRUN_JOB'\nself._cache = None\n"
    )
    assert fence_offences(public) == []


def test_nothing_outside_private_apis_reaches_into_private_modules():
    """The fence itself: a new reach must be added to raydra.private_apis, with its own test, not in passing."""
    fence = pathlib.Path(raydra.private_apis.__file__).parent
    src = fence.parents[1]
    offenders = [
        f"{path.relative_to(src)}:{n}: {what}"
        for path in sorted(src.rglob("*.py"))
        if fence not in path.parents
        for n, what in fence_offences(path.read_text())
    ]
    assert offenders == []


@pytest.mark.parametrize(
    "package", ["ray", "torch", "lightning", "torchmetrics", "transformers", "datasets", "huggingface-hub", "hydra-core"]
)
def test_installed_versions_are_inside_the_caps_this_file_was_run_against(package):
    """pyproject.toml caps each library whose private API raydra reaches at the minor version this
    file passed with; an install outside the caps means nobody has run it against that version."""
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = {Requirement(r).name.lower(): Requirement(r) for r in project["dependencies"]}
    requirement = requirements[package]
    assert any(spec.operator == "<" for spec in requirement.specifier), f"{package} has no upper bound"
    assert requirement.specifier.contains(metadata.version(package), prereleases=True)


LOCAL_RAY_PROBE = """
import contextlib, glob, json, os, signal, sys, time
import psutil
import ray
from raydra.private_apis import ray as ray_apis

lean = ray_apis.lean_local_ray() if sys.argv[1] == "lean" else {}
if sys.argv[1] == "lean":
    ray_apis.keep_sigterm_through_ray_shutdown()
# raydra's local Ray (lean) listens on the loopback address only; a plain one on the machine's too.
with ray_apis.local_ray_on_loopback() if sys.argv[1] == "lean" else contextlib.nullcontext():
    ray.init(address="local", num_cpus=1, include_dashboard=False, _temp_dir=sys.argv[2], **lean)
# The raylet prestarts its idle workers as the first driver registers, before it logs that driver's
# job as started in its worker pool: wait for that line, then count the workers started before it.
raylet, deadline, text = glob.glob(os.path.join(sys.argv[2], "session_latest", "logs", "raylet.out"))[0], time.time() + 60, ""
while "started in worker pool" not in text:
    if time.time() > deadline:
        sys.exit("the raylet never logged the driver's job as started in its worker pool: " + text[-3000:])
    time.sleep(0.1)
    text = open(raylet).read()
prestarted = text.split("started in worker pool", 1)[0].count("Started worker process")


@ray.remote
class Probe:
    def report(self):
        return {"pid": os.getpid(), "hook_pid": os.environ.get("HOOK_RAN_IN")}


hook_env = {**ray_apis.worker_setup_hook_env("hook_module.hook"), "PYTHONPATH": sys.argv[3]}
seen = ray.get(Probe.options(runtime_env={"env_vars": hook_env}).remote().report.remote())
# Every address a process of this Ray (the driver's, the GCS, the raylet, its workers and agents) listens on.
mine = {p.pid for p in [psutil.Process(), *psutil.Process().children(recursive=True)]}
listening = sorted({c.laddr.ip for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid in mine})
print(json.dumps({"prestarted": prestarted, "listening": listening, **seen}), flush=True)
# The driver's own SIGTERM handler (raydra's stop signals), then Ray's shutdown, then a SIGTERM.
signal.signal(signal.SIGTERM, lambda signum, frame: print("SIGTERM reached the driver's handler", flush=True))
ray.shutdown()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.1)
"""


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["lean", "plain"])
def test_a_lean_local_ray_prestarts_no_idle_workers_and_an_actors_setup_hook_runs_first(mode, tmp_path):
    """lean_local_ray's system config stops the idle workers Ray starts for the first driver (the
    plain start shows them), an actor whose env carries worker_setup_hook_env runs the hook in
    its own process before its first method, a Ray started inside local_ray_on_loopback
    listens on the loopback address alone (the plain start on others too), and after
    keep_sigterm_through_ray_shutdown a SIGTERM after ray.shutdown() still reaches the driver's
    handler (the plain driver is ended by it: Ray's shutdown set SIGTERM to the kernel's default)."""
    import ipaddress
    import json
    import subprocess
    import sys
    import tempfile

    from helpers import base_env

    (tmp_path / "hook_module.py").write_text("import os\n\ndef hook():\n    os.environ['HOOK_RAN_IN'] = str(os.getpid())\n")
    temp_dir = tempfile.mkdtemp(prefix="rayl-", dir="/tmp")  # Ray's socket paths must stay short
    env = {k: v for k, v in base_env().items() if not k.startswith("RAY_AUTH")}
    try:
        done = subprocess.run(
            [sys.executable, "-c", LOCAL_RAY_PROBE, mode, temp_dir, str(tmp_path)], env=env, capture_output=True, text=True, timeout=180
        )
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)  # the probe's Ray ended with it
    lines = done.stdout.strip().splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith("{"))
    seen, after = json.loads(lines[at]), lines[at + 1 :]
    assert seen["hook_pid"] == str(seen["pid"])
    loopback = [ip for ip in seen["listening"] if ipaddress.ip_address(ip).is_loopback or ip == "::ffff:127.0.0.1"]
    if mode == "lean":
        assert seen["prestarted"] == 0
        assert seen["listening"] and loopback == seen["listening"], seen["listening"]
        assert done.returncode == 0 and after == ["SIGTERM reached the driver's handler"], done.stdout + done.stderr[-3000:]
    else:
        assert seen["prestarted"] >= 1
        assert loopback != seen["listening"], seen["listening"]  # the machine's address, or every interface
        assert done.returncode == -signal.SIGTERM and after == [], done.stdout + done.stderr[-3000:]


REREAD_AUTH_PROBE = """
import os
import ray
from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode
from raydra.private_apis.ray import reread_auth_settings

token = lambda: (get_authentication_mode() == AuthenticationMode.TOKEN, AuthenticationTokenLoader.instance().has_token())
before = token()
os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="c" * 64)
unread = token()
reread_auth_settings()
print(before, unread, token())
"""


def test_ray_takes_up_a_token_set_after_its_import_once_told_to_reread():
    """What `ray.address=slurm` does in a driver that imported Ray before it made the job's token:
    until told, Ray keeps the mode and token it read at import (none here: a home without a token)."""
    import subprocess
    import sys

    from helpers import base_env

    env = {k: v for k, v in base_env().items() if not k.startswith("RAY_AUTH")}
    done = subprocess.run(
        [sys.executable, "-c", REREAD_AUTH_PROBE], env={**env, "HOME": "/nonexistent"}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "(False, False) (False, False) (True, True)"


def test_ray_trains_preemption_watcher_switch_is_read_by_name_and_sent_on_to_the_controller():
    from ray.train.v2._internal import constants

    assert constants.ENABLE_PREEMPTION_WATCHER_ENV_VAR == "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
    assert constants.ENABLE_PREEMPTION_WATCHER_ENV_VAR in constants.ENV_VARS_TO_PROPAGATE


def test_the_preload_waits_for_ray_trains_worker_module_by_the_name_ray_imports_it_under():
    import importlib

    module = importlib.import_module(RAY_TRAIN_WORKER_MODULE)
    assert module.RayTrainWorker.__module__ == RAY_TRAIN_WORKER_MODULE
    assert ray_train_worker_imported()


# ---------------------------------------------------------------------------------------------
# Python's multiprocessing (a multirun job's process: raydra.multirun.job_process, raydra.multirun.job)

LOST_STARTER = """
import json, os, sys, time
from multiprocessing import get_context
from raydra.private_apis.ray import leave_forkserver

def child(leave):
    if leave:
        leave_forkserver()
    time.sleep(60)

if __name__ == "__main__":
    context = get_context("forkserver")
    process = context.Process(target=child, args=(sys.argv[1] == "leave",))
    process.start()
    from multiprocessing import forkserver
    print(json.dumps({"server": forkserver._forkserver._forkserver_pid, "child": process.pid}), flush=True)
    time.sleep(1)  # the child is running
    os._exit(0)  # the starter is gone without stopping anything, as a kill -9 leaves it
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("leave", [True, False])
def test_a_forkserver_whose_children_let_go_of_its_pipe_ends_with_the_process_that_started_it(leave, tmp_path):
    """raydra.multirun.job_process relies on the server ending with the launcher (its jobs then get their
    parent-death signal); without leave_forkserver, a running child keeps it alive (the control)."""
    import json
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "starter.py"
    script.write_text(LOST_STARTER)
    out = tmp_path / "out.txt"
    with out.open("w") as file:  # not a pipe: the server and the child hold it after the starter is gone
        subprocess.run([sys.executable, str(script), "leave" if leave else "keep"], stdout=file, timeout=120, check=True)
    pids = json.loads(out.read_text().strip().splitlines()[-1])
    try:
        deadline = time.time() + 15
        while _alive(pids["server"]) and time.time() < deadline:
            time.sleep(0.2)
        assert _alive(pids["server"]) is (not leave)
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


FORKED_IDS = """
import sys
from multiprocessing import get_context
from raydra.multirun import job_process

def draw(sender):
    import ray._raylet
    sender.send(ray._raylet.ObjectRef.from_random().hex())

if __name__ == "__main__":
    context = get_context("forkserver")
    as_jobs = sys.argv[1] == "as_jobs"
    context.set_forkserver_preload([m for m in job_process.PRELOAD if as_jobs or m != "raydra.multirun.job_server"])
    ids = []
    for _ in range(2):
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=draw, args=(sender,))
        child.start()
        ids.append(receiver.recv())
        child.join()
    print("same" if ids[0] == ids[1] else "different")
"""


@pytest.mark.parametrize("preload", ["as_jobs", "without_raydra_job_server"])
def test_processes_forked_from_the_jobs_server_draw_different_ray_ids(preload, tmp_path):
    """Two multirun jobs joining Ray at once each put a warm-up object with a random id in the
    object store; with the same id, one crashed (raydra.private_apis.ray.draw_actor_class_ids_from_os).
    Without raydra.multirun.job_server, importing Ray Train in the server seeds Ray's generator for every
    child (the control: if it draws different ids, Ray has become fork-safe and the patch can go)."""
    import subprocess
    import sys

    script = tmp_path / "forked_ids.py"
    script.write_text(FORKED_IDS)
    done = subprocess.run([sys.executable, str(script), preload], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == ("different" if preload == "as_jobs" else "same")


def test_main_module_import_names_the_main_module_and_imports_it_as_multiprocessing_does(tmp_path):
    import subprocess
    import sys

    (tmp_path / "user_main.py").write_text(
        "from omegaconf import OmegaConf\n"
        "OmegaConf.register_new_resolver('from_main', lambda: 'yes')\n"
        "print('top level ran as', __name__)\n"
        "if __name__ == '__main__':\n"
        "    from raydra.private_apis.ray import main_module_import\n"
        "    import json; print('HOW', json.dumps(main_module_import()))\n"
    )
    out = subprocess.run([sys.executable, "user_main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True).stdout
    how = out.split("HOW ")[1].strip()
    assert how == '{"init_main_from_path": "%s"}' % (tmp_path / "user_main.py")
    # Another process imports it once, not as __main__: its top level runs, its main block does not.
    code = (
        "import json, sys; from omegaconf import OmegaConf; from raydra.private_apis.ray import import_main_module;"
        f"import_main_module(json.loads({how!r})); print('resolved', OmegaConf.create({{'a': '${{from_main:}}'}}).a);"
        "print('main is', sys.modules['__main__'].__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines() == ["top level ran as __mp_main__", "resolved yes", "main is __mp_main__"]
    # A script that is not on this machine (a Ray node of another host) is skipped.
    import_main_module({"init_main_from_path": str(tmp_path / "elsewhere.py")})


@pytest.mark.e2e
def test_a_ray_node_raydra_starts_stops_at_once_and_takes_its_temp_dir_when_its_job_is_signalled_whole(tmp_path):
    """SLURM's scancel sends SIGTERM to every process of the job at once, the head's GCS among them.
    A `ray start --block` that first asks its GCS to drain the node waits out Ray's drain timeout
    (30 s) for a GCS already gone and outlives the job; raydra's nodes start with the drain off.
    The driver that started the node may never get to clean up after it (it can block leaving Ray
    until SLURM kills it): the node's keeper removes its temp dir, with nothing done here."""
    import psutil

    from raydra.cluster import ray_node

    temp_dir = tempfile.mkdtemp(prefix="rd-", dir="/tmp")  # short: Ray's socket paths live below it
    log = tmp_path / "head.log"
    args = ["--head", f"--port={ray_node.free_port()}", "--num-cpus=0", "--include-dashboard=false", *ray_node.port_flags()]
    env = {k: v for k, v in os.environ.items() if k != RAY_NODE_DRAIN_TIMEOUT_ENV}
    head = ray_node.start([*args, f"--temp-dir={temp_dir}"], log, {**env, "RAY_AUTH_MODE": "disabled"})
    try:
        ray_node.wait_started(head, log, 120)
        tree = [psutil.Process(head.pid), *psutil.Process(head.pid).children(recursive=True)]
        assert any("gcs_server" in p.name() for p in tree)
        for p in tree:
            p.terminate()
        head.wait(timeout=15)
        assert "Draining" not in log.read_text()
        assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not os.path.exists(temp_dir), os.listdir(temp_dir)
    finally:
        ray_node.stop(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# torchmetrics

LEAN_TORCHMETRICS_PROBE = """
import json, sys
from raydra.private_apis import torchmetrics as torchmetrics_apis
first = torchmetrics_apis.torchmetrics_without_optional_integrations()
finders, walked = list(sys.meta_path), []
for finder in sys.meta_path:  # as an import on another thread walks them, halfway as torchmetrics imports
    walked.append(finder)
    if len(walked) == 2:
        import raydra.worker.loop  # what a Ray Train worker imports: Lightning, and torchmetrics with it
left_out = [name for name in torchmetrics_apis.TORCHMETRICS_LEAN_LEAVES_OUT if name in sys.modules]
import torch, torchmetrics
accuracy = float(torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1])))
bert = hasattr(torchmetrics.text, "BERTScore")  # exported only where transformers is there
import lightning_utilities.core.imports as lu
import scipy.signal
print(json.dumps({"first": first, "again": torchmetrics_apis.torchmetrics_without_optional_integrations(), "loaded": left_out,
    "accuracy": accuracy, "bert": bert, "scipy_elsewhere": lu.package_available("scipy"),
    "signal_works": float(scipy.signal.windows.hamming(3)[1]), "skipped": [getattr(f, "__name__", type(f).__name__) for f in finders if f not in walked]}))
"""


def test_torchmetrics_imports_without_its_optional_integrations_and_its_metrics_still_work():
    """A worker of a run that builds nothing of the user's: torchmetrics leaves out transformers,
    scipy.signal and matplotlib (its flags in torchmetrics.utilities.imports and `package_available`
    of lightning_utilities, as torchmetrics 1.9 reads them), its classification metrics work, the
    metrics that need those packages are missing as without them, and everything else sees the packages as they are.
    An import on another thread meanwhile still asks every finder (a skipped PathFinder failed a
    worker's task with "No module named ...")."""
    import json
    import subprocess

    done = subprocess.run([sys.executable, "-c", LEAN_TORCHMETRICS_PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["first"] is True and seen["again"] is False  # once torchmetrics is in, nothing changes
    assert seen["loaded"] == [], seen["loaded"]
    assert seen["accuracy"] == pytest.approx(2 / 3)
    assert seen["bert"] is False  # as on a machine without transformers
    assert seen["scipy_elsewhere"] is True and seen["signal_works"] == 1.0
    assert seen["skipped"] == []


@pytest.mark.parametrize(
    "backend",
    ["gloo", pytest.param("nccl", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])],
)
def test_torchs_flight_record_of_this_processs_collectives_is_dumped_as_json(backend, monkeypatch):
    """The hang watchdog keeps each worker's flight record with its stacks (raydra.worker.watchdog)."""
    import json

    import torch.distributed as dist

    from raydra.cluster.ray_node import free_port

    monkeypatch.setenv(FLIGHT_RECORDER_ENV, "100")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    assert flight_record() is None  # no process group: nothing to dump
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        tensor = torch.ones(3, device="cuda" if backend == "nccl" else "cpu")
        dist.all_reduce(tensor)
        if backend == "nccl":
            torch.cuda.synchronize()
        record = json.loads(flight_record())
    finally:
        dist.destroy_process_group()
    assert any("all_reduce" in entry["profiling_name"] for entry in record["entries"])
    assert record["pg_status"]


def test_a_trial_another_process_asked_for_takes_reports_and_its_end_through_the_study_that_loads_it(tmp_path):
    """raydra.private_apis.optuna.running_trial: a resumed sweep continues its killed driver's
    running trials, reporting their epochs and telling their ends, from a study loaded anew."""
    import optuna

    from raydra.private_apis.optuna import running_trial

    def storage():
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "study.journal")))

    first = optuna.create_study(study_name="s", storage=storage(), direction="maximize")
    for value in (0.9, 0.8):
        first.tell(first.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), value)
    asked = first.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    asked.report(0.5, step=0)

    loaded = optuna.load_study(study_name="s", storage=storage(), pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0))
    trial = running_trial(loaded, asked.number)
    assert trial.number == asked.number and trial.params == asked.params
    trial.report(0.1, step=1)
    assert loaded.trials[asked.number].intermediate_values == {0: 0.5, 1: 0.1}
    loaded.tell(asked.number, 0.7)
    assert loaded.trials[asked.number].state == optuna.trial.TrialState.COMPLETE


def test_the_ray_modules_a_job_imports_on_first_use_are_where_its_server_imports_them_ahead():
    """raydra.private_apis.ray.RAY_MODULES_IMPORTED_ON_FIRST_USE: the multirun jobs' server preloads
    them; a module Ray moved would be skipped there and cost every job its import again."""
    import importlib

    from raydra.private_apis.ray import RAY_MODULES_IMPORTED_ON_FIRST_USE

    for name in RAY_MODULES_IMPORTED_ON_FIRST_USE:
        importlib.import_module(name)
