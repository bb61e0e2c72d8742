"""tune.scheduler=pbt: what a trial PBT copied into does after Lightning restored the other trial's
checkpoint (raydra's ViT and a real Trainer, no Ray), PBT's settings refused before any trial, and
the lineage's record. The real sweep: test_a_pbt_sweep_copies_a_poor_trial_from_a_good_one_and_records_the_lineage."""

import csv
import json
import re
import time

import pytest
import torch
from helpers import bare_trainer, composed, run_train, summary_of
from hydra.utils import instantiate

from raydra.config.checks import validate
from raydra.config.schema import register_schemas
from raydra.data.digits import DigitsDataModule
from raydra.errors import RaydraError
from raydra.lightning import pl
from raydra.records import sweep
from raydra.records.sweep import Exploit, SweepRecord
from raydra.worker.hyperparameters import PlainHyperparameters
from raydra.worker.mutated import MutatedHyperparameters

register_schemas()

# The copied trial's rate and the rate PBT perturbed it to.
COPIED_LR, MUTATED_LR = 3e-3, 1e-4


def vit_node(lr: float) -> dict:
    """The model node as conf/model/vit.yaml writes it (a partial optimizer, a warm-up-and-cosine
    schedule over the run's steps), at a size that trains on digits in a second."""
    return {
        "_target_": "raydra.models.vit.ViTClassifier",
        "_convert_": "all",
        **dict(image_size=8, num_channels=1, num_classes=10, patch_size=2, hidden_size=16, num_layers=1, num_heads=2, mlp_size=32),
        "export_hf": False,
        "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": lr, "weight_decay": 0.05},
        "scheduler": {"_target_": "transformers.get_cosine_schedule_with_warmup", "_partial_": True, "num_warmup_steps": 3},
    }


class Seen(pl.Callback):
    """What the optimizer, scheduler and hparams hold as training starts and ends."""

    def on_train_start(self, trainer, pl_module):
        self.start = self._now(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        self.end = self._now(trainer, pl_module)

    @staticmethod
    def _now(trainer, pl_module):
        group = trainer.optimizers[0].param_groups[0]
        return {
            "step": trainer.global_step,
            "lr": group["lr"],
            "initial_lr": group["initial_lr"],
            "weight_decay": group["weight_decay"],
            "base_lrs": list(trainer.lr_scheduler_configs[0].scheduler.base_lrs),
            "hparams_lr": pl_module.hparams.optimizer.keywords["lr"],
        }


def fit(node: dict, epochs: int, ckpt_path=None, callbacks=()):
    seen = Seen()
    trainer = bare_trainer(
        max_epochs=epochs, limit_train_batches=6, limit_val_batches=1, callbacks=[PlainHyperparameters(node), *callbacks, seen]
    )
    # As raydra's worker fits: the copied checkpoint loaded with weights_only (plain data only).
    trainer.fit(instantiate(node), datamodule=DigitsDataModule(batch_size=32), ckpt_path=ckpt_path, weights_only=True)
    return trainer, seen


def test_a_trial_continued_from_another_trials_checkpoint_trains_on_with_its_own_perturbed_values(tmp_path):
    torch.manual_seed(0)
    # The trial PBT copies: two epochs at its own rate, its checkpoint at the end of them.
    copied, seen = fit(vit_node(COPIED_LR), epochs=2)
    copied.save_checkpoint(tmp_path / "copied.ckpt")
    at_copy = seen.end
    assert at_copy["step"] == 12 and at_copy["base_lrs"] == [COPIED_LR]

    # Lightning alone (ray#36660): the trial is built with its new rate, and the restore puts the
    # copied trial's optimizer and schedule back over it.
    _, lost = fit(vit_node(MUTATED_LR), epochs=3, ckpt_path=tmp_path / "copied.ckpt")
    assert lost.start["base_lrs"] == [COPIED_LR] and lost.start["lr"] == pytest.approx(at_copy["lr"])

    # With the trial's values put back: the copied position, weights' optimizer state, and the
    # perturbed rate where the schedule stands; the other optimizer settings as copied.
    mutated = MutatedHyperparameters({"model.optimizer.lr": MUTATED_LR})
    trainer, seen = fit(vit_node(MUTATED_LR), epochs=3, ckpt_path=tmp_path / "copied.ckpt", callbacks=[mutated])
    assert seen.start["step"] == at_copy["step"], "training continued from the copied step, not from zero"
    assert seen.start["base_lrs"] == [MUTATED_LR] and seen.start["initial_lr"] == MUTATED_LR
    assert seen.start["lr"] == pytest.approx(at_copy["lr"] * MUTATED_LR / COPIED_LR)
    assert seen.start["hparams_lr"] == MUTATED_LR and seen.start["weight_decay"] == 0.05
    assert seen.end["step"] == 18 and seen.end["base_lrs"] == [MUTATED_LR]
    # The saved copy holds the perturbed rate: a restore of the trial's own checkpoint (a restarted
    # worker group, a paused trial) applies the same values again and changes nothing.
    trainer.save_checkpoint(tmp_path / "own.ckpt")
    _, again = fit(
        vit_node(MUTATED_LR),
        epochs=4,
        ckpt_path=tmp_path / "own.ckpt",
        callbacks=[MutatedHyperparameters({"model.optimizer.lr": MUTATED_LR})],
    )
    assert again.start["lr"] == pytest.approx(seen.end["lr"]) and again.start["base_lrs"] == [MUTATED_LR]


def test_weight_decay_and_betas_go_to_the_param_groups_and_a_tuple_stays_a_tuple():
    from raydra.worker.mutated import apply

    module = instantiate(vit_node(COPIED_LR))
    optimizer = torch.optim.AdamW(module.parameters(), lr=COPIED_LR, betas=(0.9, 0.999), weight_decay=0.05)
    apply({"model.optimizer.weight_decay": 0.1, "model.optimizer.betas": [0.8, 0.99], "model.dropout": 0.2}, [optimizer], [], module)
    group = optimizer.param_groups[0]
    assert group["weight_decay"] == 0.1 and group["betas"] == (0.8, 0.99) and group["lr"] == COPIED_LR
    assert module.hparams.dropout == 0.2 and module.hparams.optimizer.keywords["weight_decay"] == 0.1


# ---------------------------------------------------------------------------------------------
# A real PBT sweep

# Two trials side by side (half a CPU each), learning rates that differ clearly by the first epoch;
# PBT compares them after it (synch: both at once, so the bottom one copies the top one every time)
# and perturbs the copied rate within a range, so the copy trains on with a rate of its own. Two, not
# the four of experiments/pbt-sweep.md: every trial starts twice under synch PBT, and four took 150 s
# of CI against 88 s for two, with the same copy, restore and record asserted.
PBT_SWEEP = (
    "experiment=vit_digits_smoke",
    "tune=pbt",
    "tune.num_samples=1",
    "tune.space={model.optimizer.lr: {grid: [1e-5, 3e-3]}}",
    "tune.pbt.mutations={model.optimizer.lr: {loguniform: [1e-5, 1e-2]}}",
    "tune.pbt.synch=true",
    "scale.num_workers=1",
    "scale.cpus_per_worker=0.5",
    "trainer.max_epochs=2",
    "trainer.test=false",
    "logger=csv",
)


@pytest.mark.e2e
def test_a_pbt_sweep_copies_a_poor_trial_from_a_good_one_and_records_the_lineage(ray_cluster, tmp_path):
    started = time.time()
    done = run_train(*PBT_SWEEP, outputs=tmp_path, address=ray_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    wall = time.time() - started
    (sweep_dir,) = [p.parent for p in tmp_path.glob("sweeps/*/*/sweep.json")]
    record = sweep.read(sweep_dir)
    assert record.status == "completed" and record.trials.completed == 2, record
    assert record.mutations == {"model.optimizer.lr": {"loguniform": [1e-5, 1e-2]}}
    # The bottom trial (a 1e-5 one) copied a top one (3e-3) at the end of epoch 1.
    (copy,) = record.lineage
    trials = {p.parent.name: summary_of(p.parent) for p in sweep_dir.glob("trials/*/summary.json")}
    assert trials[copy.copied]["trial"]["sampled"] == {"model.optimizer.lr": 3e-3} == copy.copied_values
    assert copy.epoch == 1 and copy.step == trials[copy.copied]["global_step"] // 2
    copier = trials[copy.trial]
    # Its record: the perturbed rate as its values, trained on to the end from the copied step.
    assert copier["trial"]["sampled"] == copy.values and copy.values["model.optimizer.lr"] != 3e-3
    assert copier["status"] == "completed" and copier["epochs_completed"] == 2 and copier["global_step"] == 2 * copy.step
    worker_log = (sweep_dir / "trials" / copy.trial / "logs" / "worker_0.log").read_text()
    assert f"resumed from {sweep_dir}/tune/" in worker_log and f"global step {copy.step})" in worker_log
    assert f"put the trial's values back after restoring {sweep_dir}/tune/" in worker_log
    assert f"{{'model.optimizer.lr': {copy.values['model.optimizer.lr']}}}" in worker_log
    rows = {row["trial"]: row for row in csv.DictReader((sweep_dir / "trials.csv").open())}
    assert rows[copy.trial]["copied"] == f"{copy.copied}@1" and {rows[t]["copied"] for t in rows if t != copy.trial} == {""}
    assert f"trial {copy.trial} continues from trial {copy.copied} at epoch 1" in done.stdout
    print(f"pbt sweep: {wall:.1f} s, {len(record.lineage)} copies")


# ---------------------------------------------------------------------------------------------
# PBT's settings, refused before any trial


def pbt_config(*overrides: str):
    from raydra.sweep.space import check_samples, parse_mutations

    cfg = composed("tune=pbt", *overrides)
    validate(cfg)
    check_samples(cfg, parse_mutations(cfg), "pbt.mutations" if cfg.tune.pbt.mutations else "space")
    return cfg


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["checkpoint.every_n_epochs=2"], "tune.pbt.perturbation_interval=1 is not a multiple of checkpoint.every_n_epochs=2"),
        (["checkpoint.every_n_steps=20"], "tune.scheduler=pbt copies trials at epoch ends, but checkpoint.every_n_steps=20"),
        (["tune.search=optuna"], "tune.scheduler=pbt chooses each trial's next values itself, so it cannot run under tune.search=optuna"),
        (["tune.pbt.quantile_fraction=0.6"], "tune.pbt.quantile_fraction=0.6 must be above 0 and at most 0.5"),
        (["tune.pbt.perturbation_interval=0"], "tune.pbt.perturbation_interval=0 must be positive"),
        (
            ["+tune.pbt.mutations.model.optimizer.lrr={uniform: [1e-4, 1e-2]}"],
            "tune.pbt.mutations: model.optimizer.lrr is not a key of the composed config",
        ),
        (
            ["+tune.pbt.mutations.data.batch_size={choice: [32, 33]}"],
            "tune.pbt.mutations.data.batch_size: the value 33 makes an invalid run",
        ),
    ],
)
def test_pbt_settings_it_cannot_use_are_refused_naming_the_key(overrides, message):
    with pytest.raises(RaydraError, match=re.escape(message)):
        pbt_config(*overrides)


def test_pbt_perturbs_tune_space_unless_told_which_keys_and_checkpoints_every_interval():
    from raydra.sweep.pbt import scheduler
    from raydra.sweep.space import parse_mutations

    cfg = pbt_config("tune.pbt.perturbation_interval=4", "checkpoint.every_n_epochs=2")
    assert parse_mutations(cfg) == {"model.optimizer.lr": ("loguniform", [1e-4, 1e-1])}
    cfg = pbt_config("tune.pbt.mutations={data.batch_size: {choice: [32, 64]}}")
    pbt = scheduler(cfg, parse_mutations(cfg))
    # A choice is PBT's list (a neighbouring value), epochs its time.
    assert pbt._hyperparam_mutations == {"data.batch_size": [32, 64]} and pbt._time_attr == "epochs_done"


# ---------------------------------------------------------------------------------------------
# The lineage: recorded by the sweep's driver as a copied trial starts again, kept by a resume


class Restarting:
    """What TrialEvents reads of a trial Tune starts: Tune's Trial's id, config and latest checkpoint."""

    def __init__(self, trial_id, config, checkpoint):
        self.trial_id, self.config, self.checkpoint = trial_id, config, checkpoint


def tune_checkpoint_of(tmp_path, trial_id, epochs_done, lr):
    """A Tune checkpoint as a PBT trial reports it (raydra.sweep.pbt.tune_checkpoint)."""
    from ray.train import Checkpoint

    from raydra.sweep.pbt import tune_checkpoint

    folder = tmp_path / f"{trial_id}-{epochs_done}"
    folder.mkdir()
    (folder / "checkpoint.ckpt").write_bytes(b"")
    return tune_checkpoint(Checkpoint.from_directory(folder), trial_id, {"epochs_done": epochs_done, "step": 40 * epochs_done}, {LR: lr})


LR = "model.optimizer.lr"


def test_a_copy_is_recorded_once_as_its_trial_starts_again_and_a_resumed_sweep_keeps_the_lineage(tmp_path):
    from raydra.sweep.report import TrialEvents, TrialRow, write_tables

    # Before the resume: b copied a at the end of epoch 1, recorded in sweep.json.
    earlier = Exploit(
        trial="b", copied="a", epoch=1, step=40, values={LR: 0.0036}, copied_values={LR: 0.003}, at="2026-11-28T10:00:00+00:00"
    )
    sweep.write(
        tmp_path, SweepRecord(status="interrupted", scheduler="pbt", lineage=[earlier], mutations={LR: {"loguniform": [1e-5, 1e-2]}})
    )
    resumed = sweep.read(tmp_path).resumed_from_here()
    assert resumed.lineage == [earlier] and not resumed.problems

    events = TrialEvents("val/acc", max_epochs=4)
    events.mutations, events.lineage = [LR], list(resumed.lineage)
    told = []
    events.lineage_grew = lambda lineage: told.append(list(lineage))
    # The resumed sweep starts b from the checkpoint it copied (its latest Tune checkpoint still): no second copy.
    events.on_trial_start(0, [], Restarting("b", {LR: 0.0036}, tune_checkpoint_of(tmp_path, "a", 1, 0.003)))
    # Its own checkpoint: a pause, a resume.
    events.on_trial_start(0, [], Restarting("b", {LR: 0.0036}, tune_checkpoint_of(tmp_path, "b", 2, 0.0036)))
    events.on_trial_start(0, [], Restarting("c", {LR: 0.001}, None))
    assert told == []
    # PBT copies a into b again, at epoch 3, perturbing a's rate.
    events.on_trial_start(0, [], Restarting("b", {LR: 0.0024}, tune_checkpoint_of(tmp_path, "a", 3, 0.003)))
    (lineage,) = told
    assert lineage[0] == earlier and len(lineage) == 2
    assert (lineage[1].trial, lineage[1].copied, lineage[1].epoch, lineage[1].step) == ("b", "a", 3, 120)
    assert lineage[1].values == {LR: 0.0024} and lineage[1].copied_values == {LR: 0.003}

    rows = [TrialRow(trial=t, status="completed", sampled={LR: lr}) for t, lr in [("a", 0.003), ("b", 0.0024)]]
    write_tables(tmp_path, rows, "val/acc", lineage)
    table = {row["trial"]: row for row in csv.DictReader((tmp_path / "trials.csv").open())}
    assert table["b"]["copied"] == "a@1 a@3" and table["a"]["copied"] == ""
    # A sweep other than PBT's has no such column; an older sweep.json reads with no lineage.
    write_tables(tmp_path, rows, "val/acc")
    assert "copied" not in next(csv.DictReader((tmp_path / "trials.csv").open()))
    (tmp_path / "sweep.json").write_text(json.dumps({"format": 2, "kind": "tune sweep", "status": "completed", "scheduler": "asha"}))
    older = sweep.read(tmp_path)
    assert older.lineage == [] and older.mutations == {} and not older.problems
