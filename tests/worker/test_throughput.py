"""Throughput and FLOPs accounting of the Throughput callback, on plain single-process Lightning; where
a run's start-up is counted from."""

import subprocess
import sys
import time

import pytest
import torch
from helpers import bare_trainer, run_dirs, summary_of, tiny_vit
from torch.utils.data import DataLoader, TensorDataset

from raydra.lightning import pl
from raydra.worker.throughput import WARMUP_STEPS, Throughput, peak_flops


class Linear(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 4, bias=False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_flops_per_step_of_a_linear_layer_match_the_hand_count():
    data = DataLoader(TensorDataset(torch.randn(16 * 20, 8), torch.randn(16 * 20, 4)), batch_size=16)
    throughput = Throughput(world_size=1, peak_flops=None)
    trainer = bare_trainer(max_epochs=1, callbacks=[throughput])
    trainer.fit(Linear(), data)
    # forward x @ W.T: 2*16*8*4; backward dW = dy.T @ x: the same again (x needs no gradient).
    assert throughput.flops_per_step == 2 * (2 * 16 * 8 * 4)
    summary = throughput.summary()
    # Warm-up steps and the counted step are left out of the steady-state figures.
    assert summary["steady_steps"] == 20 - WARMUP_STEPS - 1
    assert summary["samples_per_s"] > 0
    assert summary["tflops_per_s_per_worker"] > 0
    assert "mfu" not in summary  # no peak on CPU: FLOP/s without a ratio


class SlowBatches(TensorDataset):
    """A dataset whose every sample takes 1 ms to load: 16 ms per batch of 16."""

    def __getitem__(self, index):
        time.sleep(0.001)
        return super().__getitem__(index)


def _fit(throughput, data, epochs=1):
    trainer = bare_trainer(max_epochs=epochs, callbacks=[throughput])
    trainer.fit(Linear(), data)
    return trainer


def test_data_wait_is_the_time_the_loop_spent_getting_batches():
    data = DataLoader(SlowBatches(torch.randn(16 * 20, 8), torch.randn(16 * 20, 4)), batch_size=16)
    trainer = _fit(Throughput(world_size=1), data)
    wait, step = (float(trainer.callback_metrics["train/data_wait_s"]), float(trainer.callback_metrics["train/step_time_s"]))
    # 16 ms to load each batch; a stretch's first step has no measured wait (2 of 19 timed steps).
    assert wait > 0.012
    assert step < wait  # a linear layer's step is far cheaper than its batch
    assert float(trainer.callback_metrics["train/samples_per_s"]) < 16 / 0.016


def test_the_device_is_synchronised_per_stretch_of_steps_not_per_step(monkeypatch):
    """A sync every step would stop the host queueing the next step while the GPU works."""
    syncs = []
    monkeypatch.setattr("raydra.worker.throughput._synchronize", lambda device: syncs.append(device))
    data = DataLoader(TensorDataset(torch.randn(16 * 30, 8), torch.randn(16 * 30, 4)), batch_size=16)
    throughput = Throughput(world_size=1)
    _fit(throughput, data, epochs=2)
    # Epoch 1: open, close before the counted step, reopen, close at its end; epoch 2: open, close.
    assert len(syncs) == 6
    assert throughput.summary()["steady_steps"] == 60 - WARMUP_STEPS - 1


def test_peak_flops_is_unknown_on_cpu():
    assert peak_flops(torch.device("cpu"), "bf16-mixed") is None


@pytest.mark.gpu
def test_mfu_of_the_vit_on_a_gpu_is_a_fraction_of_the_peak():
    from raydra.data.digits import DigitsDataModule

    device = torch.device("cuda")
    throughput = Throughput(world_size=1, peak_flops=peak_flops(device, "bf16-mixed"))
    trainer = bare_trainer(max_epochs=3, accelerator="gpu", precision="bf16-mixed", callbacks=[throughput])
    model = tiny_vit(hidden_size=256, mlp_size=1024)
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=256))
    summary = throughput.summary()
    assert summary["flops_per_step_per_worker"] > 0
    assert 0 < summary["mfu"] < 1


@pytest.mark.parametrize("accelerator, precision", [("cpu", "32-true"), pytest.param("gpu", "bf16-mixed", marks=pytest.mark.gpu)])
def test_trainer_compile_computes_the_eager_logits_and_trains_the_digits_vit(accelerator, precision):
    """What trainer.compile=true does on every worker, on plain Lightning to keep the suite short."""
    from torch._dynamo.utils import counters

    from raydra.data.digits import DigitsDataModule
    from raydra.worker.loop import compile_networks

    pl.seed_everything(0, verbose=False)
    model = tiny_vit(conv_stem=[32, 32])  # the default model's stem
    eager = tiny_vit(conv_stem=[32, 32])
    eager.load_state_dict(model.state_dict())
    graphs = counters["stats"]["unique_graphs"]
    assert compile_networks(model) == ["forward", "stem", "net"]
    # The compiled module computes the eager one's function: same weights, same logits. (With autograd
    # on and the training batch's size: the graph the fit then uses, no second compile.) Accuracies
    # after training are not what to compare: fused kernels round differently, and 8 epochs of two
    # trajectories that far apart ended 11 and 15 images of 270 apart (CPU, 2026-11-27, and CI 11-28).
    images = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model(images).detach(), eager(images).detach(), rtol=1e-4, atol=1e-4)
    trainer = bare_trainer(max_epochs=8, accelerator=accelerator, precision=precision)
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=32))
    # Compiled for real, not silently left eager, and it learns the digits as eager does (0.89-0.96).
    assert counters["stats"]["unique_graphs"] > graphs
    assert float(trainer.callback_metrics["val/acc"]) > 0.85
    # Checkpoints of a compiled run load into an eager module (raydra.load) and the other way round.
    assert list(model.state_dict()) == list(eager.state_dict())


def test_trainer_compile_compiles_the_vit_with_its_conv_stem_as_one_graph(monkeypatch):
    """Compiled on its own, in place, the stem (an nn.Sequential) ran eager: dynamo skips that code."""
    import functools

    from raydra.worker.loop import compile_networks

    graphs = []

    def keeping_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=keeping_backend))
    model = tiny_vit(conv_stem=[32, 32])
    compile_networks(model)
    torch.compiler.reset()
    try:
        model(torch.randn(4, 1, 8, 8)).sum().backward()
    finally:
        torch.compiler.reset()
    (graph,) = graphs
    # The stem's two convolutions and the patch embedding's, in the one graph.
    convolutions = [node for node in graph.graph.nodes if "conv2d" in str(node.target)]
    assert len(convolutions) == 3, graph.graph


class SlowStart(Linear):
    """Set-up takes a second before the first batch, and validation another: neither is training."""

    def on_fit_start(self):
        time.sleep(1.0)

    def validation_step(self, batch, batch_idx):
        time.sleep(0.05)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(16 * 10, 8), torch.randn(16 * 10, 4)), batch_size=16)


def test_the_step_line_and_the_epoch_line_report_samples_per_s_on_one_basis():
    from raydra.worker.console_progress import ConsoleProgress

    lines = []
    # every_s=0.3: a step line now and then through each epoch, as every 15 s on a long run.
    progress = ConsoleProgress(max_steps=-1, world_size=1, every_s=0.3, emit=lines.append)
    data = DataLoader(SlowBatches(torch.randn(16 * 40, 8), torch.randn(16 * 40, 4)), batch_size=16)
    trainer = bare_trainer(max_epochs=2, callbacks=[Throughput(world_size=1), progress])
    trainer.fit(SlowStart(), data)
    step_rates = [float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("step ")]
    epoch_rate = float(trainer.callback_metrics["train/samples_per_s"])
    assert step_rates and all(line.split()[-2] == "train/samples_per_s" for line in lines if line.startswith("step "))
    # The first step line once took in the second of set-up, and lines after validation its time:
    # then a line read a fraction of the epoch's figure (624 against ~2000). Now each agrees.
    for rate in step_rates:
        assert 0.7 * epoch_rate < rate < 1.3 * epoch_rate, (step_rates, epoch_rate)
    assert [line.split()[:2] for line in lines if line.startswith("epoch ")] == [["epoch", "1/2"], ["epoch", "2/2"]]


def test_a_compiled_run_with_every_raydra_callback_runs_compiled_graphs_on_every_training_step(train_here, tmp_path, monkeypatch):
    """trainer.compile=true as a user's run trains: train.py's entry, every raydra callback on, and
    Throughput counting the FLOPs of one step. Counting under FlopCounterMode alone made dynamo skip
    the compiled code for good: from the step after it every step ran eager (on an H200, compiled
    raydra 0.65x the plain compiled loop). A backend that counts its graphs' runs stands in for
    inductor, whose CPU compile would take a minute here."""
    import functools

    import raydra.worker.throughput as throughput

    ran = []  # one entry per run of a compiled graph, True where gradients were on (training)

    def counting_backend(graph, example_inputs):
        def run(*args):
            ran.append(torch.is_grad_enabled())
            return graph.forward(*args)

        return run

    # trainer.compile reaches torch.compile through Module.compile too: every compile gets this backend.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=counting_backend))
    at_step_end = []
    step_end = throughput.Throughput.on_train_batch_end

    def record(self, *args):
        at_step_end.append(sum(ran))
        step_end(self, *args)

    monkeypatch.setattr(throughput.Throughput, "on_train_batch_end", record)
    steps = WARMUP_STEPS + 4
    torch.compiler.reset()  # no compiled code, nor code dynamo has marked skipped, from another test
    try:
        done = train_here(
            "experiment=vit_digits_smoke",
            "scale.num_workers=0",
            "trainer.compile=true",
            f"trainer.max_steps={steps}",
            "checkpoint.every_n_steps=3",
            "trainer.limit_val_batches=2",
            "trainer.test=false",
            outputs=tmp_path,
        )
    finally:
        torch.compiler.reset()
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path)
    summary = summary_of(run_dir)
    assert summary["global_step"] == steps
    graphs_per_step = [after - before for before, after in zip([0, *at_step_end], at_step_end)]
    # The counted step alone runs eager (FLOPs are counted op by op); every other step runs compiled.
    assert graphs_per_step[WARMUP_STEPS] == 0, graphs_per_step
    del graphs_per_step[WARMUP_STEPS]
    assert all(graphs_per_step), graphs_per_step
    assert summary["throughput"]["flops_per_step_per_worker"] > 0


class FailsWhenCounted(Linear):
    def training_step(self, batch, batch_idx):
        if batch_idx == WARMUP_STEPS:
            raise RuntimeError("a step that fails while its FLOPs are counted")
        return super().training_step(batch, batch_idx)


def test_a_step_that_fails_while_counted_leaves_compilation_on():
    """In local mode the driver's process trains; a failed run must not leave it compiling nothing."""
    data = DataLoader(TensorDataset(torch.randn(16 * 10, 8), torch.randn(16 * 10, 4)), batch_size=16)
    with pytest.raises(RuntimeError, match="while its FLOPs are counted"):
        bare_trainer(max_epochs=1, callbacks=[Throughput(world_size=1)]).fit(FailsWhenCounted(), data)
    graphs = []
    compiled = torch.compile(lambda x: x * 2, backend=lambda graph, example_inputs: graphs.append(graph) or graph.forward)
    compiled(torch.ones(2))
    assert graphs


def test_a_run_s_start_up_is_counted_from_its_process_s_launch_to_the_hundredth():
    """summary.json's startup starts at the process's launch. psutil's launch time is built on a
    whole-second boot time, and came 0.73 s early on this machine: every start-up read that much longer."""
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", "from raydra.run import startup; print(repr(startup.run_began()))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert before - 0.05 <= float(out) <= before + 0.5
