"""The composed config and its validation: fast, no Ray."""

import subprocess
import sys

import pytest
from helpers import REPO, bare_trainer, composed, run_dirs, summary_of
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError, ValidationError

from raydra.config.checks import validate
from raydra.config.schema import register_schemas
from raydra.entry import CONF_DIR
from raydra.errors import RaydraError
from raydra.run.prepare import Invocation, prepare, writable

register_schemas()


def test_default_config_is_the_embedded_digits_vit_on_two_cpu_workers():
    cfg = composed()
    assert cfg.model._target_ == "raydra.models.vit.ViTClassifier"
    assert cfg.data._target_ == "raydra.data.digits.DigitsDataModule"
    assert cfg.strategy.name == "ddp"
    assert (cfg.scale.num_workers, cfg.scale.use_gpu, cfg.scale.cpus_per_worker) == (2, False, 1)
    assert cfg.ray.address is None
    assert set(cfg.logger) == {"csv", "wandb"}
    # Shapes are stated once, by the data group.
    assert (cfg.model.image_size, cfg.model.num_channels, cfg.model.num_classes) == (8, 1, 10)
    validate(cfg)


def test_the_default_vit_sees_the_images_through_a_conv_stem_and_a_pretrained_one_is_refused_it():
    import torch
    from helpers import tiny_vit

    model = tiny_vit(conv_stem=list(composed().model.conv_stem))
    convs = [m for m in model.stem if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [(1, 32, (3, 3)), (32, 32, (3, 3))]
    # The patch embedding takes the stem's channels; the output is one logit per class.
    assert model.net.vit.embeddings.patch_embeddings.projection.in_channels == 32
    assert model(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert len(tiny_vit().stem) == 0  # conv_stem=[]: the patches go straight in, as in a plain ViT
    # Refused before any weights are looked for, in one sentence naming both keys.
    with pytest.raises(
        RaydraError,
        match=r"model.conv_stem=\[32\] adds layers that model.pretrained=/models/vit has no weights for; set model.conv_stem=\[\]",
    ):
        tiny_vit(conv_stem=[32], pretrained="/models/vit")
    assert list(composed("experiment=vit_cifar10").model.conv_stem) == []  # seed 002's plain ViT


def test_experiment_preset_overrides_the_defaults():
    cfg = composed("experiment=vit_digits_smoke")
    assert cfg.name == "vit_digits_smoke"
    assert cfg.trainer.max_epochs == 3
    assert set(cfg.logger) == {"csv"}


def test_several_loggers_or_none():
    assert set(composed("logger=[csv,wandb]").logger) == {"csv", "wandb"}
    assert set(composed("logger=csv").logger) == {"csv"}
    assert len(composed("logger=none").logger) == 0


def test_unknown_group_option_lists_the_choices():
    with pytest.raises(ConfigCompositionException, match="Available options") as error:
        composed("strategy=dpp")
    assert "ddp" in str(error.value)


def test_an_unknown_experiment_lists_the_presets_instead_of_training_the_default():
    with pytest.raises(ConfigCompositionException, match="Could not find 'experiment/doesnotexist'") as error:
        composed("experiment=doesnotexist")
    assert "vit_digits_smoke" in str(error.value)


def test_a_worker_count_that_is_no_count_is_refused_by_the_command_in_one_sentence(train_here, tmp_path):
    """Through the entry, which records the run before validating it: no traceback, the run failed."""
    for n, value in enumerate(("abc", "[1,2,3]")):
        done = train_here(f"scale.num_workers={value}", "logger=csv", outputs=tmp_path / str(n))
        assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
        assert f"error: scale.num_workers={value} is neither a count of workers nor [min, max]" in done.stdout
        (run_dir,) = run_dirs(tmp_path / str(n))
        summary = summary_of(run_dir)
        assert summary["status"] == "failed" and summary["world_size"] is None


def test_what_hydra_refuses_before_the_run_is_said_in_one_sentence_by_the_command(train_here, tmp_path):
    """Composition and the run's directory fail inside Hydra, before raydra's main: Hydra printed a
    traceback (95 lines for a YAML error, 103 for a long name), or for an override its grammar
    cannot read four lines that name no key; the command says one sentence."""
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "broken.yaml").write_text("# @package _global_\nname: broken\ntrainer:\n  max_epochs: [1, 2\n")
    cases = [
        (
            (f"--config-dir={tmp_path / 'conf'}", "experiment=broken"),
            f"error: {conf / 'broken.yaml'}, line 5, column 1, is not YAML: expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence that starts at line 4, column 15); fix the file there.",
        ),
        (
            ("scale.cpus_per_worker=abc",),
            "error: scale.cpus_per_worker=abc is not a float; give it a float, e.g. scale.cpus_per_worker=1.0.",
        ),
        (
            ("scale.num_workerz=2",),
            "error: scale.num_workerz is not a key raydra knows (scale has a fixed set of keys); did you mean scale.num_workers?",
        ),
        # Hydra's grammar refuses these naming neither the override nor its key.
        (
            ("model.optimizer.lr=range(1,",),
            "error: model.optimizer.lr=range(1, cannot be read as an override of model.optimizer.lr (no viable alternative "
            "at input 'range(1,'); check that its brackets and quotes close",
        ),
        (("model.optimizer.lr=[1e-3,2e-3",), "error: model.optimizer.lr=[1e-3,2e-3 cannot be read as an override of model.optimizer.lr"),
        # Nested the run's directory one level deeper, where this resume=latest (and any other) did not find it.
        (
            ("name=ablation/lr", "resume=latest"),
            "error: name=ablation/lr holds a '/', which would nest the run's directory where resume=latest does not look for it; "
            "name it without one, e.g. name=ablation_lr.",
        ),
        (("name=" + "x" * 300,), "is a name longer than the filesystem allows (a part of 309 characters; most allow 255)"),
    ]
    for n, (overrides, sentence) in enumerate(cases):
        done = train_here(*overrides, "scale.num_workers=0", outputs=tmp_path / str(n))
        said = done.stdout + done.stderr
        assert done.returncode == 1 and sentence in done.stderr and "Traceback" not in said, said
        assert len(said.strip().splitlines()) == 1, said
        assert not run_dirs(tmp_path / str(n))
    assert "the run's directory cannot be created; give the run a shorter name= (it names the directory)." in said
    assert not list((tmp_path / "6").rglob("*x" * 3))  # nothing half-made is left
    assert not list((tmp_path / "5").rglob("*"))  # nor for a name with a '/'


def test_what_raydra_does_not_say_itself_hydra_reports_as_it_did(train_here, tmp_path):
    done = train_here("experiment=doesnotexist", outputs=tmp_path)
    assert done.returncode == 1 and "Could not find 'experiment/doesnotexist'" in done.stderr and "error:" not in done.stderr
    assert "Available options in 'experiment'" in done.stderr and "Traceback" not in done.stderr


def test_wrong_type_fails_at_compose_time():
    # scale.num_workers takes a count or [min, max], which OmegaConf cannot type: validate refuses it.
    with pytest.raises(ConfigCompositionException, match="scale.cpus_per_worker=abc") as error:
        composed("scale.cpus_per_worker=abc")
    assert isinstance(error.value.__cause__, ValidationError)


def test_misspelt_key_in_a_typed_group_fails():
    with pytest.raises(ConfigCompositionException, match="num_workerz"):
        composed("scale.num_workerz=2")


@pytest.mark.parametrize(
    "override, message",
    [
        ("scale.num_workers=-1", "scale.num_workers=-1 is negative; ask for 1 or more workers, or 0 for local mode"),
        ("scale.num_workers=abc", "scale.num_workers=abc is neither a count of workers nor"),
        ("scale.cpus_per_worker=-1", "scale.cpus_per_worker=-1.0 must be positive"),
        ("trainer.max_epochs=0", "both below 1"),
        ("trainer.precision=fp8", "not a Lightning precision"),
        ("trainer.precision=16-mixed", "needs GPU workers"),
        ("checkpoint.mode=up", "must be min or max"),
        ("trainer.benchmark=sometimes", "trainer.benchmark=sometimes must be auto, true, false or null"),
        ("checkpoint.every_n_steps=0", "checkpoint.every_n_steps=0 must be positive"),
        ("checkpoint.every_n_epochs=-2", "checkpoint.every_n_epochs=-2 must be positive"),
        (
            "ledger.price_per_gpu_hour=-1",
            r"ledger.price_per_gpu_hour=-1.0 is not a price; give what an hour costs, e.g. ledger.price_per_gpu_hour=2.5",
        ),
        ("data.batch_size=33", "does not split evenly"),
        ("scale.placement_strategy=RANDOM", "not a Ray placement strategy"),
        ("data.batch_size=1.5", "data.batch_size=1.5 must be a whole number of samples"),
        ("data.batch_size=1.5 scale.num_workers=0", "data.batch_size=1.5 must be a whole number of samples"),
        # `+` adds a key to a typed section, where nothing would read it.
        ("+scale.num_workerz=2", r"scale.num_workerz is not a key raydra knows .*; did you mean scale.num_workers\?"),
        ("+trainer.max_epoch=3", r"trainer.max_epoch is not a key raydra knows .*; did you mean trainer.max_epochs\?"),
        ("+strategy.sharding=full", "strategy.sharding is not a key raydra knows"),
        ("+foo=1", "foo is not a key raydra knows"),
    ],
)
def test_validation_names_the_key_and_the_fix(override, message):
    with pytest.raises(RaydraError, match=message):
        validate(composed(*override.split()))


def test_a_config_composed_with_hydras_own_node_validates_as_a_launchers_job_does():
    """A launcher composes each job's config with Hydra's `hydra` node in it (raydra's checks every
    job before any starts): that node is Hydra's, not a key a `+` added."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=vit_digits_smoke"], return_hydra_config=True)
    assert "hydra" in cfg
    validate(cfg)


def test_validation_names_every_problem_of_a_config_at_once():
    """Three mistakes, one error: each in its own sentence, naming its key, in the words each one
    alone is refused with; a single mistake reads as it did alone."""
    overrides = ("trainer.precision=fp8", "checkpoint.mode=up", "scale.placement_strategy=RANDOM")
    with pytest.raises(RaydraError) as error:
        validate(composed(*overrides))
    text = str(error.value)
    alone = []
    for override in overrides:
        with pytest.raises(RaydraError) as one:
            validate(composed(override))
        alone.append(str(one.value))
        assert str(one.value) in text
    assert "trainer.precision=fp8 is not a Lightning precision" in text
    assert "checkpoint.mode=up must be min or max" in text
    assert "scale.placement_strategy=RANDOM is not a Ray placement strategy" in text
    assert text == " ".join(sorted(alone, key=text.index)) and "\n" not in text


def test_the_trainer_group_reaches_lightnings_trainer_as_it_is(tmp_path):
    """Every trainer.* key but raydra's own is a pl.Trainer argument, passed through by name."""
    import inspect

    from raydra.config.schema import RAYDRA_TRAINER_KEYS, TEMPLATE_TRAINER_KEYS, TrainerConfig, lightning_trainer_arguments
    from raydra.lightning import pl

    parameters = set(inspect.signature(pl.Trainer.__init__).parameters)
    fields = set(TrainerConfig.__dataclass_fields__)
    assert RAYDRA_TRAINER_KEYS <= fields and not RAYDRA_TRAINER_KEYS & parameters
    # The template's placeholders are Trainer arguments raydra sets itself (but its _target_, the Trainer's class).
    assert set(TEMPLATE_TRAINER_KEYS) <= fields and set(TEMPLATE_TRAINER_KEYS) - {"_target_"} <= parameters
    lightnings = fields - RAYDRA_TRAINER_KEYS - set(TEMPLATE_TRAINER_KEYS)
    assert lightnings <= parameters, f"not pl.Trainer arguments: {lightnings - parameters}"
    cfg = composed(
        "trainer.max_epochs=5",
        "trainer.gradient_clip_val=1.0",
        "trainer.accumulate_grad_batches=2",
        "trainer.precision=bf16-mixed",
        "trainer.compile=true",
    )
    import dataclasses

    from raydra.run.resolve import resolve

    # As a worker gets them: resolved (precision and benchmark "auto" decided), then by name.
    arguments = lightning_trainer_arguments(dataclasses.asdict(resolve(cfg, tmp_path, "run").trainer))
    assert not (RAYDRA_TRAINER_KEYS | set(TEMPLATE_TRAINER_KEYS)) & set(arguments)
    trainer = bare_trainer(default_root_dir=str(tmp_path), **arguments)
    assert (trainer.max_epochs, trainer.gradient_clip_val, trainer.accumulate_grad_batches, trainer.precision) == (5, 1.0, 2, "bf16-mixed")


@pytest.mark.parametrize(
    "overrides, benchmark",
    [
        (["scale=gpu"], True),  # fixed-shape batches: each convolution's fastest kernel, timed once
        (["scale=gpu", "trainer.deterministic=true"], None),  # autotuning may pick other kernels run to run
        ([], None),  # CPU: torch's setting as it is
        (["scale=gpu", "trainer.benchmark=false"], False),
    ],
)
def test_cudnn_autotuning_is_on_for_gpu_workers_unless_asked_otherwise(tmp_path, overrides, benchmark):
    from raydra.run.resolve import resolve

    assert resolve(composed(*overrides), tmp_path, "run").trainer.benchmark is benchmark


def test_checkpoint_frequency_is_said_one_way():
    with pytest.raises(RaydraError, match=r"checkpoint.every_n_epochs=2 and checkpoint.every_n_steps=50 are both set; keep one"):
        validate(composed("checkpoint.every_n_epochs=2", "checkpoint.every_n_steps=50"))
    validate(composed("checkpoint.every_n_steps=50"))
    validate(composed("checkpoint.every_n_epochs=2"))


def test_prepare_brings_in_what_the_invocation_says_on_a_copy_and_nothing_writes_into_its_config_after():
    cfg = composed("experiment=vit_digits_smoke")
    prepared = prepare(cfg, Invocation(job_ray_address="127.0.0.1:6380", continues="/runs/earlier"))
    assert (prepared.config.ray.address, prepared.config.resume) == ("127.0.0.1:6380", "/runs/earlier")
    assert (cfg.ray.address, cfg.resume) == (None, None)  # the composed config, as it was
    with pytest.raises(ReadonlyConfigError):
        prepared.config.trainer.max_epochs = 5
    with pytest.raises(ReadonlyConfigError):
        prepared.config.model.optimizer.lr = 0.1
    # What resolving and a sweep's trials change, they change on a copy of their own.
    changed = writable(prepared.config)
    changed.trainer.max_epochs = 5
    assert prepared.config.trainer.max_epochs != 5


def test_resolved_config_is_plain_data_for_workers():
    cfg = composed()
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert plain["model"]["num_classes"] == 10  # ${data.num_classes} resolved
    assert isinstance(plain["model"]["optimizer"], dict)


def test_help_lists_groups_and_cfg_job_prints_the_config():
    help_text = subprocess.run([sys.executable, "train.py", "--help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    groups = dict(line.split(": ", 1) for line in help_text.splitlines() if line.startswith(tuple("delmst")) and ": " in line)
    for group, option in [
        ("model", "vit"),
        ("data", "digits"),
        ("data", "cifar10"),
        ("strategy", "ddp"),
        ("scale", "gpu"),
        ("logger", "wandb"),
        ("logger", "none"),
        ("experiment", "vit_digits_smoke"),
    ]:
        assert option in groups[group].split(", ")
    job = subprocess.run(
        [sys.executable, "train.py", "--cfg", "job", "scale.num_workers=4"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert OmegaConf.create(job).scale.num_workers == 4


def test_help_lists_only_the_groups_a_user_can_pick():
    """The schemas the option files extend live in Hydra's ConfigStore too; --help must not offer
    them as groups (`schema/strategy: ddp, ...` once did)."""
    help_text = subprocess.run([sys.executable, "train.py", "--help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    section = help_text.split("== Config groups", 1)[1].split("\n== ", 1)[0]
    groups = {line.split(": ", 1)[0] for line in section.splitlines()[1:] if ": " in line}
    assert not [group for group in groups if "schema" in group]
    assert {"model", "data", "strategy", "scale", "trainer", "logger", "tune", "experiment"} <= groups
    # Every group offered is a folder of option files under conf/ (hydra/ is Hydra's own, under
    # --hydra-help; __pycache__ appears if anything imports the package raydra.conf, and Hydra skips it).
    assert groups == {path.name for path in CONF_DIR.iterdir() if path.is_dir() and path.name not in ("hydra", "__pycache__")}


def test_launches_in_the_same_second_each_get_their_own_run_directory(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from helpers import run_dirs, run_train

    # Refused before Ray starts, so three launches land within the same second.
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: run_train(f"resume={tmp_path}", outputs=tmp_path / "out"), range(3)))
    assert all(r.returncode == 1 and "is not a raydra run" in r.stdout for r in results)
    # A refused resume= leaves no run, only its driver.log with the refusal: one each.
    assert not run_dirs(tmp_path / "out")
    dirs = list((tmp_path / "out" / "runs").glob("*/*"))
    assert len(dirs) == 3
    for invocation in dirs:
        assert [p.name for p in invocation.iterdir()] == ["driver.log"]
        assert (invocation / "driver.log").read_text().count("is not a raydra run") == 1


def test_a_crashed_worker_group_is_reported_by_the_workers_own_exception():
    """summary.json's error names what went wrong on a worker, not Ray's "workers failed" header."""
    import traceback

    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
    from ray.train.v2.api.exceptions import WorkerGroupError

    from raydra.errors import one_line

    def crashed(message):
        try:
            try:
                raise AttributeError("'method' object has no attribute '__dict__'")
            except AttributeError as inner:
                raise RuntimeError(message) from inner
        except RuntimeError as error:
            # What Ray sends back: the exception with its traceback text, plus the hint lines
            # libraries such as dynamo print after it.
            return UserExceptionWithTraceback(error, traceback.format_exc() + "\nSet TORCHDYNAMO_VERBOSE=1 for more\n")

    error = WorkerGroupError("[Rank 0,1 Error Snippet]: ...", {1: crashed("rank one"), 0: crashed("rank zero")})
    assert one_line(error) == "worker 0: RuntimeError: rank zero (the whole trace is in logs/worker_0.log)"
    assert one_line(ValueError("first line\nsecond")) == "ValueError: first line"
    # What Ray 2.60's poll hands the driver: each worker's exception itself, without its trace.
    bare = WorkerGroupError("...", {1: KeyError("x"), 0: ValueError("bad shape (3, 4)\nmore")})
    assert one_line(bare) == "worker 0: ValueError: bad shape (3, 4) (the whole trace is in logs/worker_0.log)"


def test_group_options_set_only_what_they_change_from_the_schema():
    """The schema dataclasses are the one home of the fixed groups' defaults: an option file that
    repeats one would leave two places to change it, and they drift."""
    from raydra.config import schema

    def leaves(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict) and value and key != "space":  # tune.space is one open value
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    options = {
        "train.yaml": schema.RaydraConfig,
        "trainer/default.yaml": schema.TrainerConfig,
        "scale/cpu.yaml": schema.ScaleConfig,
        "scale/gpu.yaml": schema.ScaleConfig,
        "strategy/ddp.yaml": schema.DDPConfig,
        "strategy/fsdp.yaml": schema.FSDPConfig,
        "strategy/deepspeed.yaml": schema.DeepSpeedConfig,
        "tune/asha.yaml": schema.TuneConfig,
        "tune/optuna.yaml": schema.TuneConfig,
        "tune/random.yaml": schema.TuneConfig,
        "tune/pbt.yaml": schema.TuneConfig,
    }
    # Every option of the typed groups is checked, including ones added later.
    found = {f"{group}/{p.name}" for group in ("scale", "strategy", "trainer", "tune") for p in (CONF_DIR / group).glob("*.yaml")}
    assert found | {"train.yaml"} == set(options)
    for path, dataclass in options.items():
        option = OmegaConf.to_container(OmegaConf.load(CONF_DIR / path))
        option.pop("defaults", None)
        defaults = OmegaConf.to_container(OmegaConf.structured(dataclass))
        repeated = [key for key, value in leaves(option) if OmegaConf.select(OmegaConf.create(defaults), key, default="<absent>") == value]
        assert not repeated, f"conf/{path} repeats the schema's defaults for {repeated}"


DRIVER_SIDE_SCRIPT = """
import sys
from pathlib import Path
from hydra import compose, initialize_config_dir
import ray.cloudpickle
from raydra import worker
from raydra.run import resolve
from raydra.entry import CONF_DIR
from raydra.config.schema import register_schemas

register_schemas()
with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    cfg = compose(config_name="train", overrides=sys.argv[1:])
config = resolve.resolve(cfg, Path("/tmp/unused"), "run")
function = ray.cloudpickle.dumps(worker.train_loop)
print(resolve.data_to_describe(cfg), b"raydra.worker" in function, "lightning.pytorch" in sys.modules, "torchmetrics" in sys.modules)
"""


@pytest.mark.parametrize("data", ["data=digits", "data=cifar10 data.root=/tmp", "data=synthetic"])
def test_the_driver_of_a_run_whose_data_states_its_classes_never_imports_lightning(data):
    """Lightning with torchmetrics is ~3 s of CPU the driver spent before every fit (the workers
    import it anyway): the driver resolves the config and hands Ray Train a training function that
    pickles by reference to a module without them."""
    done = subprocess.run([sys.executable, "-c", DRIVER_SIDE_SCRIPT, *data.split()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["None", "True", "False", "False"]


def test_a_data_root_without_the_data_is_refused_on_the_driver_before_the_workers_start(train_here, tmp_path, monkeypatch):
    """data=cifar10 data.root=/nonexistent was refused by the workers, 31 s after the run started; the
    driver checks it as it resolves the run (local mode, and a local Ray: the workers read this
    disk), before the record says running, and without importing the data module."""
    from raydra.cluster import ray_cluster
    from raydra.run import fit
    from raydra.run.resolve import check_data_paths

    # Ray is not started: the lifecycle connects through raydra.cluster.ray_cluster.connect.
    monkeypatch.setattr(ray_cluster, "connect", lambda *args, **kwargs: None)
    monkeypatch.setattr(fit, "fit_and_record", lambda *args, **kwargs: pytest.fail("a refused run reached the fit"))
    sentence = (
        "error: data.root=/nonexistent does not exist on this machine, whose disk the workers read; point it at your data, "
        "or set data.download=true to fetch it there."
    )
    for n, workers in enumerate((0, 1)):
        done = train_here("data=cifar10", "data.root=/nonexistent", f"scale.num_workers={workers}", "logger=csv", outputs=tmp_path / str(n))
        assert done.returncode == 1 and sentence in done.stdout and "Traceback" not in done.stdout + done.stderr, done.stdout
        assert summary_of(run_dirs(tmp_path / str(n))[0])["status"] == "failed"
    with pytest.raises(RaydraError, match=r"^data.root=/nonexistent does not exist on this machine, .*; point it at your data.$"):
        check_data_paths(composed("data=image_captions", "data.root=/nonexistent", "model=sd_tiny"))
    # On a cluster the workers' disks are their own: the driver leaves the check to them; so does
    # data.download=true, which fetches the files there.
    check_data_paths(composed("data=cifar10", "data.root=/nonexistent", "ray.address=auto"))
    check_data_paths(composed("data=cifar10", "data.root=/nonexistent", "data.download=true"))


def test_data_whose_classes_are_left_null_is_asked_to_describe_itself():
    from raydra.run.resolve import data_to_describe

    assert data_to_describe(composed("data=imagefolder", "data.root=/x")) == "raydra.data.imagefolder.ImageFolderDataModule"
    # A stated count is still checked against the data: class_names is left null.
    assert data_to_describe(composed("data=imagefolder", "data.root=/x", "data.num_classes=3")) is not None
    assert data_to_describe(composed("data=hf", "data.name=x")) == "raydra.data.hf.HFImageDataModule"
    assert data_to_describe(composed()) is None
