"""A `_target_`'s arguments checked against its signature on the driver, before any worker starts:
fast, in this process, no Ray."""

import textwrap

import pytest
from helpers import composed, run_dirs, summary_of
from omegaconf import OmegaConf

from raydra.config import arguments
from raydra.config.schema import register_schemas
from raydra.config.user_callbacks import resolve_and_validate
from raydra.errors import RaydraError

register_schemas()

# Callables with the kinds of signature a user's `_target_` has, in a module the test puts on the path.
SHAPES = textwrap.dedent(
    """
    from __future__ import annotations

    import enum
    from pathlib import Path
    from typing import TYPE_CHECKING, Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

    if TYPE_CHECKING:
        from collections import OrderedDict  # a name only a type checker sees


    class Mode(enum.Enum):
        FAST = "fast"
        SLOW = "slow"


    class Tensorish:
        pass


    def typed(
        rate: float,
        steps: int = 10,
        name: Optional[str] = None,
        kind: Literal["min", "max"] = "min",
        sizes: List[int] = (),
        pair: Tuple[float, float] = (0.9, 0.99),
        scale: Union[float, Tensorish] = 1.0,
        table: Dict[str, float] = None,
        root: Path = Path("."),
        mode: Mode = Mode.FAST,
        flag: bool = False,
    ):
        return locals()


    def loose(anything, *args, tensor: Tensorish = None, hidden: OrderedDict = None, **kwargs):
        return locals()


    def strict(a: int, b: int = 1):
        return a + b


    def takes_a_built_one(inner: Tensorish = None, inners: Sequence[Tensorish] = ()):
        return inner
    """
)


@pytest.fixture
def shapes(tmp_path, monkeypatch):
    (tmp_path / "arg_shapes.py").write_text(SHAPES)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "arg_shapes"


def found(node: dict, key: str = "model") -> list:
    """The problems of `node` as the `key` of a run's config."""
    cfg = OmegaConf.create({key: node})
    return list(arguments.problems(cfg))


def test_a_wrong_type_for_a_nested_partial_optimizer_is_refused_naming_the_key_and_what_it_takes():
    (sentence,) = arguments.problems(composed("model.optimizer.lr=fast"))
    assert sentence == (
        "model.optimizer.lr=fast is not a float (torch.optim.AdamW takes lr: float | Tensor); give it a float, e.g. model.optimizer.lr=0.001."
    )
    # Through the checks every run makes before Ray starts, as one RaydraError of one sentence.
    with pytest.raises(RaydraError) as error:
        resolve_and_validate(composed("model.optimizer.lr=fast"))
    assert str(error.value) == sentence
    # Hydra's coercions stand: an int where a float is annotated; a string the command line typed as a number.
    assert not list(arguments.problems(composed("model.optimizer.lr=1")))
    assert not list(arguments.problems(composed("model.optimizer.lr=3e-4")))


@pytest.mark.parametrize(
    "override, sentence",
    [
        ("model.hidden_size=abc", "model.hidden_size=abc is not an integer (raydra.models.vit.ViTClassifier takes hidden_size: int)"),
        (
            "model.conv_stem=[1,a]",
            "model.conv_stem=[1,a] is not a list of integers (raydra.models.vit.ViTClassifier takes conv_stem: Sequence[int])",
        ),
        (
            "model.scheduler.num_warmup_steps=1.5",
            "model.scheduler.num_warmup_steps=1.5 is not an integer (transformers.get_cosine_schedule_with_warmup",
        ),
        ("+model.optimizer.betaz=[0.9,0.9]", "model.optimizer.betaz is not an argument of torch.optim.AdamW(params, lr, betas,"),
        ("+model.hidden_sizes=3", "model.hidden_sizes is not an argument of raydra.models.vit.ViTClassifier(image_size,"),
        ("~model.num_classes", "model.num_classes is missing, and raydra.models.vit.ViTClassifier(image_size,"),
        ("data.val_fraction=most", "data.val_fraction=most is not a float (raydra.data.digits.DigitsDataModule takes val_fraction: float)"),
        (
            "data=cifar10 data.root=/x data.flip=1.5",
            "data.flip=1.5 is not true or false (raydra.data.cifar10.CIFAR10DataModule takes flip: bool)",
        ),
        (
            "callbacks=early_stopping callbacks.early_stopping.patience=soon",
            "callbacks.early_stopping.patience=soon is not an integer (lightning.pytorch.callbacks.EarlyStopping takes patience: int); "
            "give it an integer, e.g. callbacks.early_stopping.patience=3.",
        ),
        ("logger=tensorboard logger.tensorboard.log_graph=maybe", "logger.tensorboard.log_graph=maybe is not true or false"),
    ],
)
def test_every_group_that_is_instantiated_has_its_arguments_checked(override, sentence):
    problems = list(arguments.problems(composed(*override.split())))
    assert len(problems) == 1 and problems[0].startswith(sentence), problems
    assert "\n" not in problems[0] and problems[0].endswith(".")


def test_an_unknown_argument_is_named_with_the_nearest_one():
    (sentence,) = arguments.problems(composed("+model.hidden_sizes=3"))
    assert "did you mean model.hidden_size? fix the key, or drop it with ~model.hidden_sizes." in sentence


def test_annotations_are_checked_as_a_config_can_satisfy_them(shapes):
    target = f"{shapes}.typed"
    assert found({"_target_": target, "rate": 1, "steps": 2.0, "name": None, "kind": "max", "sizes": [1, 2], "pair": [1, 2.5]}) == []
    assert found({"_target_": target, "rate": 0.1, "table": {"a": 1}, "root": "/data", "mode": "slow", "flag": True, "scale": 2}) == []
    wrong = {
        "rate": "fast",
        "steps": 2.5,
        "name": [1],
        "kind": "up",
        "sizes": [1, "x"],
        "pair": [1, 2, 3],
        "scale": "big",
        "table": {"a": "b"},
        "mode": "medium",
        "flag": "maybe",
    }
    problems = found({"_target_": target, **wrong})
    assert [p.split("=")[0] for p in problems] == [f"model.{key}" for key in wrong], problems
    said = dict(zip(wrong, problems, strict=True))
    assert said["rate"].startswith("model.rate=fast is not a float (arg_shapes.typed takes rate: float); give it a float.")
    assert said["name"].startswith("model.name=[1] is not a string or null")
    assert said["kind"].startswith("model.kind=up is not one of min, max")
    assert "e.g. model.kind=min." in said["kind"]
    assert said["pair"].startswith("model.pair=[1,2,3] is not a list of 2 (float, float)")
    # Union[float, a class a config cannot hold]: the float is what a config gives.
    assert said["scale"].startswith("model.scale=big is not a float (arg_shapes.typed takes scale: float | Tensorish)")
    assert said["mode"].startswith("model.mode=medium is not one of fast, slow")


def test_what_a_config_cannot_be_checked_against_is_accepted(shapes):
    # No annotation, *args and **kwargs, a class a config value cannot be (code converts into it),
    # a name only a type checker imports.
    assert found({"_target_": f"{shapes}.loose", "anything": [1], "tensor": 3, "hidden": "x", "extra": "y", "_args_": [1, 2, 3]}) == []
    assert found({"_target_": f"{shapes}.strict", "a": None}) == []  # null: filled in later, or the callable's own to refuse
    # A value instantiate builds (a nested _target_, in a list too) is not checked against its annotation,
    # but its own arguments are.
    built = {"_target_": f"{shapes}.typed", "rate": 1.0}
    assert found({"_target_": f"{shapes}.takes_a_built_one", "inner": built, "inners": [built, built]}) == []
    assert found({"_target_": f"{shapes}.takes_a_built_one", "inners": [{**built, "rate": "x"}]}) == [
        "model.inners[0].rate=x is not a float (arg_shapes.typed takes rate: float); give it a float."
    ]


def test_an_interpolation_is_checked_resolved_and_left_alone_where_it_cannot_resolve(shapes):
    cfg = OmegaConf.create(
        {"rates": {"good": 0.1, "bad": "fast"}, "model": {"_target_": f"{shapes}.typed", "rate": "${rates.bad}", "name": "${now:%H}"}}
    )
    assert [p.split(" is ")[0] for p in arguments.problems(cfg)] == ["model.rate=fast"]
    cfg.model.rate = "${rates.good}"
    cfg.model.steps = "${hydra:job.num}"  # a Hydra resolver outside Hydra's run: not resolvable here
    cfg.model.sizes = "???"
    assert list(arguments.problems(cfg)) == []


def test_partial_and_positional_arguments_are_bound_as_instantiate_binds_them(shapes):
    strict = f"{shapes}.strict"
    assert found({"_target_": strict}) == [f"model.a is missing, and {strict}(a, b) requires it; add it with +model.a=<value>."]
    assert found({"_target_": strict, "_partial_": True}) == []  # the rest comes when the partial is called
    assert found({"_target_": strict, "_args_": [1]}) == []
    assert found({"_target_": strict, "_args_": ["one"]}) == [
        f"model._args_[0]=one is not an integer ({strict} takes a: int); give it an integer."
    ]
    assert found({"_target_": strict, "_partial_": True, "a": "one"}) == [
        f"model.a=one is not an integer ({strict} takes a: int); give it an integer."
    ]
    # A node that is not built recursively hands its nested nodes over as config: they are checked as partials.
    assert found({"_target_": f"{shapes}.loose", "_recursive_": False, "anything": {"_target_": strict, "b": "x"}}) == [
        f"model.anything.b=x is not an integer ({strict} takes b: int); give it an integer, e.g. model.anything.b=1."
    ]


def test_the_default_config_and_every_shipped_option_pass():
    # data=imagefolder leaves data.num_classes null (and the model's ${data.num_classes}): the driver
    # fills it in from the folders before the workers build either.
    for overrides in (
        [],
        ["data=cifar10", "data.root=/x"],
        ["data=imagefolder", "data.root=/x"],
        ["callbacks=[early_stopping,lr_monitor,model_summary]"],
        ["logger=[tensorboard,mlflow]"],
    ):
        assert list(arguments.problems(composed(*overrides))) == [], overrides


def test_raydras_own_classes_are_checked_apart_from_what_is_nested_in_them():
    cfg = composed("model.hidden_size=abc", "model.optimizer.lr=fast", "callbacks=early_stopping", "callbacks.early_stopping.patience=soon")
    assert [p.split("=")[0] for p in arguments.problems(cfg, raydras_own=True)] == ["model.hidden_size"]
    assert [p.split("=")[0] for p in arguments.problems(cfg, raydras_own=False)] == [
        "model.optimizer.lr",
        "callbacks.early_stopping.patience",
    ]


def test_a_wrong_argument_is_refused_by_the_command_before_training(train_here, tmp_path):
    done = train_here("model.optimizer.lr=fast", "model.hidden_size=abc", "scale.num_workers=0", "logger=csv", outputs=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    # Local mode builds raydra's own model in this process: its arguments are checked here too, all at once.
    assert (
        "error: model.hidden_size=abc is not an integer (raydra.models.vit.ViTClassifier takes hidden_size: int); give it an "
        "integer, e.g. model.hidden_size=768. model.optimizer.lr=fast is not a float (torch.optim.AdamW takes lr: float | Tensor)"
        in done.stdout
    )
    (run_dir,) = run_dirs(tmp_path)
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and summary["error"].startswith("model.hidden_size=abc is not an integer")
    assert not (run_dir / "checkpoints").exists()


def test_a_ray_run_refuses_a_wrong_optimizer_argument_before_its_workers_start(train_here, tmp_path, monkeypatch):
    """model.optimizer.lr=fast started Ray and a worker, and failed there after 12 s. The check runs
    alongside Ray's start (it imports torch and transformers, which held Ray's start back by ~1.5 s)
    and refuses before the run is recorded running or any worker starts."""
    from raydra.cluster import ray_cluster
    from raydra.run import fit, resolve

    connected = []
    monkeypatch.setattr(ray_cluster, "connect", lambda *args, **kwargs: connected.append(True))
    monkeypatch.setattr(fit, "fit_and_record", lambda *args, **kwargs: pytest.fail("a refused run reached its workers"))
    monkeypatch.setattr(resolve, "resolve", lambda *args, **kwargs: pytest.fail("a refused run was resolved"))
    done = train_here("model.optimizer.lr=fast", "scale.num_workers=2", "logger=csv", outputs=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error: model.optimizer.lr=fast is not a float (torch.optim.AdamW takes lr: float | Tensor)" in done.stdout
    assert summary_of(run_dirs(tmp_path)[0])["status"] == "failed"
    assert connected == [True]  # alongside Ray's start, not before it


def test_the_workers_of_a_ray_run_check_raydras_own_classes_before_building_them(tmp_path, monkeypatch):
    """Importing raydra's model and data classes on the driver of a Ray run delayed its first step by
    3-7 s (Lightning, beside Ray's start, on 2 cores): each worker, which imports them anyway, checks
    their arguments from the run's spec before building them, in the sentence the driver would say."""
    from types import SimpleNamespace

    from raydra.run import resolve
    from raydra.worker import loop

    spec = resolve.resolve(composed("model.hidden_size=abc", "scale.num_workers=2", "logger=csv"), tmp_path / "run", "r1")
    monkeypatch.setattr(loop.ray.train, "get_context", lambda: SimpleNamespace(get_world_rank=lambda: 0, get_world_size=lambda: 2))
    monkeypatch.setattr(loop, "instantiate", lambda *args, **kwargs: pytest.fail("built before its arguments were checked"))
    with pytest.raises(
        RaydraError, match=r"^model.hidden_size=abc is not an integer \(raydra.models.vit.ViTClassifier takes hidden_size: int\)"
    ):
        loop._train(spec, mirror=None, restored=None)
