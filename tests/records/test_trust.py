"""A run directory from elsewhere is data: `raydra.load`, `raydra rerun` and `resume=` of a hostile
one, built here by hand, run none of its code unless told the run is trusted (raydra.records.trust).

Each hostile run tries to leave a file behind (`pwned`): the test checks the attempt is refused in
one sentence naming what it asked for, and that no file appeared."""

import os
import shlex

import pytest
import torch
import yaml

import raydra
from raydra.errors import RaydraError
from raydra.records import trust
from raydra.rerun import rerun


class _RunsCommand:
    """Pickles as a call of os.system: what a hostile pickle in a checkpoint does."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def _zero_folder(tmp_path, marker):
    """A DeepSpeed-layout checkpoint (a folder with checkpoint/mp_rank_00_model_states.pt) whose
    states file holds a pickle that runs a command."""
    folder = tmp_path / "run" / "checkpoint.ckpt"
    (folder / "checkpoint").mkdir(parents=True)
    torch.save({"module": {}, "module_class": "x.Y", "payload": _RunsCommand(marker)}, folder / "checkpoint" / "mp_rank_00_model_states.pt")
    return folder


def test_a_pickle_in_a_zero_checkpoint_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    folder = _zero_folder(tmp_path, marker)
    with pytest.raises(RaydraError, match=r"holds a pickled posix\.system, which is neither a tensor nor DeepSpeed's own") as refused:
        raydra.load(folder)
    assert "trusted=True" in str(refused.value) and "\n" not in str(refused.value)
    assert not marker.exists()


def test_a_pickle_in_a_checkpoint_file_is_refused_in_one_sentence_naming_it_wherever_it_is_read(tmp_path):
    """Was torch's 20-line message under raydra.load, and a worker's traceback through Hydra's (41
    lines) under resume= and ckpt_path=; the worker raises the sentence now, which the console and
    the record show (errors.user_error), its traceback kept in logs/worker_<rank>.log."""
    from raydra.records.checkpoints import checkpoint_meta, load_weights

    marker = tmp_path / "pwned"
    planted = tmp_path / "checkpoint.ckpt"
    torch.save({"module_class": "raydra.models.vit.ViTClassifier", "state_dict": {}, "payload": _RunsCommand(marker)}, planted)
    sentence = rf"^{planted} holds a pickled posix\.system, which is neither a tensor nor plain data, and unpickling it could run code"
    for trusted in (False, True):  # trusted=True builds any class; it unpickles nothing but a DeepSpeed folder's
        with pytest.raises(RaydraError, match=sentence) as refused:
            raydra.load(planted, trusted=trusted)
        assert "\n" not in str(refused.value) and str(refused.value).endswith("else use a checkpoint of a run you trust.")
    # What a worker reads first: resume='s checkpoint (trainer._position_of), ckpt_path='s weights (loop._start_from).
    with pytest.raises(RaydraError, match=sentence):
        checkpoint_meta(planted, trusted=True)
    with pytest.raises(RaydraError, match=sentence):
        load_weights(torch.nn.Linear(2, 2), planted, "ckpt_path=x", "point it elsewhere")
    assert not marker.exists()


@pytest.mark.parametrize("trusted", [None, 1, "yes", ["ok", 2]], ids=["None", "1", "a_string", "a_list_with_a_number"])
def test_a_trusted_that_is_no_bool_nor_list_of_names_is_refused_in_one_sentence(trusted, tmp_path):
    """None and 1 raised a TypeError from deep inside; "yes" was read letter by letter as names."""
    with pytest.raises(RaydraError) as refused:
        raydra.load(_checkpoint(tmp_path, "raydra.models.vit.ViTClassifier", {}), trusted=trusted)
    assert str(refused.value).startswith(f"trusted={trusted!r} is neither True, False nor a list of dotted names; pass")
    assert "\n" not in str(refused.value)


def test_library_loads_inside_a_conversion_are_made_weights_only(tmp_path):
    """DeepSpeed and Lightning call torch.load(weights_only=False) while converting a ZeRO
    checkpoint; inside weights_only_loads that call is refused too."""
    import pickle

    marker = tmp_path / "pwned"
    folder = _zero_folder(tmp_path, marker)
    with trust.weights_only_loads(), pytest.raises(pickle.UnpicklingError):
        torch.load(folder / "checkpoint" / "mp_rank_00_model_states.pt", weights_only=False)
    assert not marker.exists() and "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ


def _checkpoint(tmp_path, module_class, hyper_parameters, instantiate=None):
    path = tmp_path / "checkpoint.ckpt"
    meta = {"module_class": module_class, "hyper_parameters": hyper_parameters, "state_dict": {}}
    if instantiate is not None:
        meta["raydra"] = {"instantiate": instantiate}
    torch.save(meta, path)
    return path


def test_a_module_class_that_is_no_lightning_module_is_never_called(tmp_path):
    marker = tmp_path / "pwned"
    path = _checkpoint(tmp_path, "subprocess.run", {"args": ["touch", str(marker)]})
    with pytest.raises(RaydraError, match=r"asks raydra\.load to build subprocess\.run, but it builds only a LightningModule"):
        raydra.load(path)
    assert not marker.exists()


def test_a_target_in_the_hyperparameters_is_refused_by_name_until_trusted(tmp_path):
    marker = tmp_path / "pwned"
    writes = {"_target_": "pathlib.Path.write_text", "_args_": [{"_target_": "pathlib.Path", "_args_": [str(marker)]}, "pwned"]}
    path = _checkpoint(tmp_path, "raydra.models.vit.ViTClassifier", {"net": writes}, {"_recursive_": True, "_convert_": "none"})
    with pytest.raises(RaydraError) as refused:
        raydra.load(path)
    message = str(refused.value)
    assert "build pathlib.Path.write_text, pathlib.Path" in message and "trusted=['pathlib.Path.write_text', 'pathlib.Path']" in message
    assert not marker.exists()
    # An interpolation would be resolved, by whatever resolvers this process registered: refused too.
    path = _checkpoint(tmp_path, "raydra.models.vit.ViTClassifier", {"name": "${oc.env:HOME}"}, {"_recursive_": True, "_convert_": "none"})
    with pytest.raises(RaydraError, match=r"resolve \$\{oc\.env:HOME\}.*pass trusted=True\.$"):
        raydra.load(path)
    # Named as trusted, it is built (and the class then refuses its unknown argument).
    path = _checkpoint(tmp_path, "raydra.models.vit.ViTClassifier", {"net": writes}, {"_recursive_": True, "_convert_": "none"})
    from hydra.errors import InstantiationException

    with pytest.raises(InstantiationException, match="unexpected keyword argument 'net'"):
        raydra.load(path, trusted=["pathlib.Path"])
    assert marker.read_text() == "pwned"


def test_the_default_rule_builds_networks_optimizers_and_partials_from_packages_only():
    from raydra.lightning import pl

    nets = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
    assert trust.importable("raydra.models.vit.ViTClassifier", (pl.LightningModule,))
    assert trust.importable("torch.optim.AdamW", nets) and trust.importable("torch.nn.Linear", nets)
    assert trust.importable("transformers.get_cosine_schedule_with_warmup")  # a _partial_: imported, not called
    assert not trust.importable("raydra.storage.copy_tree", nets)  # a function, called by instantiate
    for name in ("os.system", "subprocess.run", "pathlib.Path", "builtins.eval", "torch.__main__.x", "conftest.REPO"):
        assert not trust.importable(name), name  # the standard library, a dunder part, a single-file module


# ---------------------------------------------------------------------------------------------
# rerun and resume= of a run not made here


HOSTILE_TARGET = "pathlib.Path.write_text"


def _foreign_run(tmp_path, status="interrupted"):
    """A run directory as a download brings it: a recorded config (composed by raydra, with a
    hostile _target_ in it), a summary, no mark of this machine."""
    run = tmp_path / "downloaded" / "run"
    (run / ".hydra").mkdir(parents=True)
    config = {
        "name": "vit_digits",
        "model": {"_target_": "raydra.models.vit.ViTClassifier", "optimizer": {"_target_": HOSTILE_TARGET, "_args_": ["x", "y"]}},
        "data": {"_target_": "raydra.data.digits.DigitsDataModule"},
    }
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "summary.json").write_text('{"name": "vit_digits", "status": "%s", "run_id": "r1", "started_at": "x"}' % status)
    return run


def test_a_run_is_marked_by_this_machine_over_its_config(tmp_path, monkeypatch):
    run = _foreign_run(tmp_path)
    assert not trust.made_here(run)
    trust.mark_run(run)
    assert trust.made_here(run) and (run / ".machine_mark").is_file()
    assert oct(trust.machine_key_file().stat().st_mode & 0o777) == "0o600"
    (run / ".hydra" / "config.yaml").write_text((run / ".hydra" / "config.yaml").read_text() + "seed: 1\n")
    assert not trust.made_here(run)  # its config changed since
    trust.mark_run(run)
    monkeypatch.setenv("HOME", str(tmp_path / "another-home"))
    assert not trust.made_here(run)  # another machine's (another key)


def test_rerun_of_a_run_from_elsewhere_names_what_it_would_import_and_runs_nothing(tmp_path, capsys):
    run = _foreign_run(tmp_path)
    assert rerun(str(run), ["scale.num_workers=0", f"paths.outputs={tmp_path / 'out'}"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"raydra rerun: {run} was not made on this machine" in err
    assert f"model.optimizer._target_={HOSTILE_TARGET}" in err and "model._target_=raydra.models.vit.ViTClassifier" in err
    assert "add --trusted" in err and not (tmp_path / "out").exists()
    # Printing the config it would compose builds nothing: no flag needed.
    assert rerun(str(run), ["--cfg", "job"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"]["optimizer"]["_target_"] == HOSTILE_TARGET


def test_resume_of_a_run_from_elsewhere_is_refused_before_anything_is_built(train_here, tmp_path):
    run = _foreign_run(tmp_path)
    done = train_here("scale.num_workers=0", "logger=csv", f"resume={run}", outputs=tmp_path / "out")
    assert done.returncode == 1
    assert f"resume={run}: {run} was not made on this machine" in done.stdout
    assert f"model.optimizer._target_={HOSTILE_TARGET}" in done.stdout and "add resume_trusted=true" in done.stdout
    assert yaml.safe_load((run / "summary.json").read_text())["status"] == "interrupted"  # the run's record as it was
