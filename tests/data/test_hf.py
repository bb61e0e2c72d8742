"""data=hf on datasets written on the spot with save_to_disk and as parquet (no network), and
data.loader=ray_data streaming them (and CIFAR-10 pickles, image folders) through Ray Data."""

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import composed, run_dirs, run_train, summary_of
from PIL import Image
from probe import seen_per_epoch

from raydra.data import hf
from raydra.data.device_batches import crop_flip
from raydra.data.hf import HFImageDataModule
from raydra.data.ray_data import Preprocess, ShardBatches
from raydra.errors import RaydraError

COLOURS = ("red", "green", "blue")


def dataset(n=240, size=8, seed=0):
    """n distinct random images whose class shifts their brightness, with a ClassLabel `labels`."""
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as HFImage

    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 3
    images = [Image.fromarray((rng.integers(0, 80, (size, size, 3)) + label * 80).astype(np.uint8)) for label in labels]
    return Dataset.from_dict(
        {"image": images, "labels": labels.tolist()}, features=Features({"image": HFImage(), "labels": ClassLabel(names=list(COLOURS))})
    )


def save_to_disk(root, **kwargs):
    from datasets import DatasetDict

    DatasetDict({"train": dataset(**kwargs)}).save_to_disk(str(root))
    return root


def to_parquet(path, **kwargs):
    dataset(**kwargs).to_parquet(str(path))
    return path


def test_save_to_disk_and_parquet_give_stratified_splits_and_classlabel_names(tmp_path):
    for name in (save_to_disk(tmp_path / "disk"), to_parquet(tmp_path / "beans.parquet")):
        assert HFImageDataModule.describe(name=str(name), label_column="labels") == {"num_classes": 3, "class_names": list(COLOURS)}
        data = HFImageDataModule(name=str(name), num_classes=3, label_column="labels", image_size=8, batch_size=8)
        data.setup()
        assert data.classes == list(COLOURS)
        assert {role: len(loader.labels) for role, loader in data.loaders.items()} == {"train": 192, "val": 24, "test": 24}
        for loader in data.loaders.values():  # every class in every split, in equal shares
            assert np.bincount(loader.labels.numpy()).tolist() == [len(loader.labels) // 3] * 3
        images, labels = next(iter(data.train_dataloader()))
        assert images.shape == (8, 3, 8, 8) and labels.dtype.is_floating_point is False


def test_a_pretrained_models_image_processor_sets_size_and_normalisation(tmp_path):
    from transformers import ViTImageProcessor

    ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.2] * 3, image_std=[0.1] * 3).save_pretrained(tmp_path / "vit")
    data = HFImageDataModule(
        name=str(save_to_disk(tmp_path / "disk")),
        num_classes=3,
        label_column="labels",
        processor=str(tmp_path / "vit"),
        image_size=8,
        batch_size=8,
        augment=False,
    )
    data.setup()
    images, _ = next(iter(data.val_dataloader()))
    assert images.shape == (8, 3, 16, 16)
    raw = data.loaders["val"].images[:8].float() / 255  # the processor's resize, held as uint8
    assert torch_close(images, (raw - 0.2) / 0.1)

    # A run's Hugging Face export (raydra.records.hf_export) carries the pretrained processor, rescaling and
    # normalising as the module does: the val split's own images through it are the batch above.
    from helpers import hf_processed

    config = {"name": data.hparams.name, "label_column": "labels", "processor": str(tmp_path / "vit"), "class_names": list(COLOURS)}
    inputs = HFImageDataModule.image_inputs(config)
    parts, _ = hf.splits(config["name"], hf.load(config["name"]), "image", "labels", None, 0.1, 0.1, 0)
    assert torch_close(hf_processed(inputs, parts["val"]["image"][:8], tmp_path / "hf"), images)
    assert inputs.class_names == list(COLOURS)


def torch_close(a, b):
    import torch

    return torch.allclose(a, b, atol=1e-4)


def test_plain_string_labels_become_sorted_classes(tmp_path):
    rows = dataset(n=60).to_pandas()
    rows["kind"] = [COLOURS[i] for i in rows.pop("labels")]
    rows.to_parquet(tmp_path / "plain.parquet")  # no Hugging Face metadata: a plain string column
    assert hf.describe(str(tmp_path / "plain.parquet"), label_column="kind")["class_names"] == ["blue", "green", "red"]
    data = HFImageDataModule(name=str(tmp_path / "plain.parquet"), num_classes=3, label_column="kind", image_size=8)
    data.setup()
    assert sorted(set(data.loaders["train"].labels.tolist())) == [0, 1, 2]


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("missing", "data.name={root}/nowhere does not exist"),
        ("empty", "data.name={root}/empty could not be read as a dataset"),
        ("column", "data.label_column=label is not a column of {root}/disk (columns: image, labels)"),
        ("parquet_column", "data.image_column=picture is not a column of {root}/beans.parquet (columns: image, labels"),
        ("corrupt", "data.name={root}/broken.parquet is not readable parquet"),
        ("offline", "data.name=beans is not in the local Hugging Face cache and this machine is offline (HF_HUB_OFFLINE)"),
    ],
)
def test_bad_datasets_are_named_in_one_sentence(tmp_path, monkeypatch, breakage, message):
    save_to_disk(tmp_path / "disk", n=30)
    to_parquet(tmp_path / "beans.parquet", n=30)
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    kwargs = {
        "missing": dict(name=f"{tmp_path}/nowhere", label_column="labels"),
        "empty": dict(name=f"{tmp_path}/empty", label_column="labels"),
        "column": dict(name=f"{tmp_path}/disk"),
        "parquet_column": dict(name=f"{tmp_path}/beans.parquet", label_column="labels", image_column="picture"),
        "corrupt": dict(name=f"{tmp_path}/broken.parquet", label_column="labels"),
        "offline": dict(name="beans", label_column="labels"),
    }[breakage]
    with pytest.raises(RaydraError) as error:
        hf.describe(**kwargs)
    assert message.format(root=tmp_path) in str(error.value)
    assert "\n" not in str(error.value) and str(error.value).endswith(".")


def test_ray_data_preprocess_decodes_struct_bytes_and_maps_plain_labels(tmp_path):
    rows = pd.read_parquet(to_parquet(tmp_path / "b.parquet", n=6))
    batch = {"image": np.array(list(rows["image"]), dtype=object), "labels": np.array(["b", "a", "b", "c", "a", "c"])}
    out = Preprocess("image", "labels", size=4, channels=3, mean=[0.5] * 3, std=[0.5] * 3, label_values=["a", "b", "c"])(batch)
    assert out["image"].shape == (6, 3, 4, 4) and out["image"].dtype == np.float32
    assert out["label"].tolist() == [1, 0, 1, 2, 0, 2]
    assert -1.0 <= out["image"].min() and out["image"].max() <= 1.0
    flipped = crop_flip(torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4), 2, True, torch.Generator().manual_seed(0))
    assert flipped.shape == (2, 3, 4, 4)
    # Ray Data's training preprocess augments with that same function: each image as it was or mirrored.
    plain = Preprocess("image", "labels", size=4, channels=3, mean=[0.5] * 3, std=[0.5] * 3, label_values=["a", "b", "c"])
    flips = Preprocess(
        "image", "labels", size=4, channels=3, mean=[0.5] * 3, std=[0.5] * 3, label_values=["a", "b", "c"], augment=True, flip=True
    )
    ordered, mirrored = plain(dict(batch))["image"], 0
    for _ in range(5):  # 30 coin flips: all heads 1 time in 2**30
        for before, after in zip(ordered, flips(dict(batch))["image"]):
            assert np.array_equal(after, before) or np.array_equal(after, before[..., ::-1])
            mirrored += not np.array_equal(after, before)
    assert mirrored > 0


class OwnRayData:
    """A researcher's data module that builds its own Ray Data datasets: build must ask the class."""

    @staticmethod
    def ray_datasets(data):
        return {"train": (StandIn(), 10, "train preprocess"), "val": (StandIn(), 0, "val preprocess")}


class StandIn:
    def map_batches(self, fn, **_):
        return f"mapped with {fn}"


def test_ray_data_datasets_come_from_the_data_modules_own_class():
    from raydra.data.ray_data import build

    datasets, rows = build({"_target_": "test_hf.OwnRayData", "loader": "ray_data"}, verbose=True)
    assert datasets == {"train": "mapped with train preprocess"} and rows == {"train": 10}  # an empty split is left out
    with pytest.raises(
        RaydraError,
        match=r"^data.loader=ray_data needs raydra.data.digits.DigitsDataModule to build "
        r"Ray Data datasets .*set data.loader=dataloader or add one.$",
    ):
        build({"_target_": "raydra.data.digits.DigitsDataModule", "loader": "ray_data"}, verbose=True)


def test_ray_data_without_a_test_split_has_none_to_test():
    from raydra.data.ray_data import RayDataModule
    from raydra.worker.loop import _has_test_split

    for rows in ({"train": 96, "val": 24}, {"train": 96, "val": 24, "test": 1}):  # one row cannot feed two workers
        data = RayDataModule(rows, batch_size=16, world_size=2)
        assert not _has_test_split(data) and data.val_dataloader() is data.loaders["val"]
        with pytest.raises(RaydraError, match="has no test split"):
            data.test_dataloader()
    data = RayDataModule({"train": 96, "val": 24, "test": 24}, batch_size=16, world_size=2)
    assert _has_test_split(data) and data.test_dataloader().split == "test"


def test_shard_lengths_match_what_an_equal_split_gives_each_worker():
    assert len(ShardBatches("train", rows=195, batch_size=16, world_size=2, train=True, seed=0)) == 97 // 16
    assert len(ShardBatches("val", rows=25, batch_size=8, world_size=2, train=False, seed=0)) == 2


def test_classes_flow_from_the_data_into_the_model_and_the_beans_experiment_composes(tmp_path):
    from raydra.config.checks import validate
    from raydra.run.resolve import describe_data

    cfg = composed("data=hf", f"data.name={save_to_disk(tmp_path / 'disk', n=30)}", "data.label_column=labels")
    assert cfg.data.num_classes is None
    describe_data(cfg)
    assert (cfg.model.num_classes, list(cfg.data.class_names)) == (3, list(COLOURS))
    with pytest.raises(RaydraError, match=r"has 3 classes \(red, green, blue\) but data.num_classes=5"):
        describe_data(composed("data=hf", f"data.name={tmp_path / 'disk'}", "data.label_column=labels", "data.num_classes=5"))

    beans = composed("experiment=vit_beans")
    validate(beans)
    assert beans.model.pretrained == "google/vit-base-patch16-224-in21k"
    assert list(beans.model.conv_stem) == []  # the pretrained weights take the patches themselves
    assert beans.data.processor == beans.model.pretrained  # the model's image processor preprocesses
    assert (beans.data.name, beans.data.label_column, beans.data.batch_size) == ("beans", "labels", 16)
    assert (beans.trainer.max_epochs, beans.trainer.max_steps, beans.model.optimizer.lr) == (2, 10, 5e-5)
    assert (beans.scale.num_workers, beans.scale.use_gpu) == (2, True)


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.loader=torch", "data.loader=torch is not a loader raydra knows"),
        ("trainer.num_sanity_val_steps=2", "trainer.num_sanity_val_steps=2 with data.loader=ray_data would stall"),
    ],
)
def test_ray_data_settings_are_checked(override, message):
    from raydra.config.checks import validate

    with pytest.raises(RaydraError, match=message):
        validate(composed("data=cifar10", "data.root=/x", "data.loader=ray_data", override))


@pytest.mark.e2e
def test_a_missing_column_fails_the_run_before_any_worker_starts_and_is_recorded(tmp_path):
    # A process of its own: the driver describes the data (its columns) once Ray has started.
    root = save_to_disk(tmp_path / "disk", n=30)
    done = run_train("data=hf", f"data.name={root}", "data.label_column=kind", "logger=csv", outputs=tmp_path / "out")
    assert done.returncode == 1
    assert f"error: data.label_column=kind is not a column of {root} (columns: image, labels)" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    summary = summary_of(run_dirs(tmp_path / "out")[0])
    assert summary["status"] == "failed" and "data.label_column=kind is not a column" in summary["error"]


def assert_each_sample_once_per_epoch(run_dir, train_rows, epochs):
    seen = seen_per_epoch(run_dir)
    assert sorted(seen) == list(range(epochs))
    for epoch, by_rank in seen.items():
        assert sorted(by_rank) == [0, 1]
        counts = [len(v) for v in by_rank.values()]
        assert counts[0] == counts[1] == train_rows // 2, (epoch, counts)
        union = set(by_rank[0]) | set(by_rank[1])
        assert len(union) == train_rows  # no sample twice, none on both workers


TINY_VIT = (
    "model._target_=tests.probe.RecordingViT",
    "model.patch_size=4",
    "model.num_layers=2",
    "model.hidden_size=32",
    "model.mlp_size=64",
    "data.augment=false",
    "trainer.max_epochs=2",
    "logger=csv",
)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "written, reading",
    [
        ("save_to_disk", ()),
        # Half a CPU per worker leaves one of the cluster's two for Ray Data's read and map tasks.
        ("parquet", ("data.loader=ray_data", "scale.cpus_per_worker=0.5")),
    ],
    ids=["save_to_disk", "parquet_through_ray_data"],
)
def test_trains_on_two_workers_from_disk_or_parquet_through_ray_data(ray_cluster, tmp_path, written, reading):
    """The same dataset, saved with save_to_disk and read by the data module, or written as parquet
    and streamed by Ray Data: every sample once an epoch on each of two workers, either way."""
    name = save_to_disk(tmp_path / "disk") if written == "save_to_disk" else to_parquet(tmp_path / "beans.parquet")
    done = run_train(
        "data=hf",
        f"data.name={name}",
        "data.label_column=labels",
        "data.image_size=8",
        "data.batch_size=32",
        *reading,
        *TINY_VIT,
        outputs=tmp_path / "out",
        address=ray_cluster,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "streaming_executor" not in done.stdout + done.stderr  # Ray Data's logs stay in the log files
    run_dir = run_dirs(tmp_path / "out")[0]
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["data"]["class_names"] == list(COLOURS)
    # Rows per split are recorded under ray_data alone (the driver counts them for Ray Data's shards).
    assert summary["data"].get("rows") == ({"train": 192, "val": 24, "test": 24} if reading else None)
    assert summary["data"]["loader"] == ("ray_data" if reading else "dataloader")
    assert summary["test_skipped"] is None
    # 240 rows less 10% val and 10% test: 192, 96 per worker, 16 per worker per step.
    assert summary["global_step"] == 2 * 6
    assert_each_sample_once_per_epoch(run_dir, 192, 2)
    assert summary["metrics"]["final"]["test/acc"] > 0.5  # three brightness classes are easy


@pytest.mark.e2e
def test_ray_data_without_a_spare_cpu_is_refused_in_one_sentence(ray_cluster, tmp_path):
    done = run_train(
        "data=hf",
        f"data.name={to_parquet(tmp_path / 'b.parquet', n=30)}",
        "data.label_column=labels",
        "data.loader=ray_data",
        "logger=csv",
        outputs=tmp_path / "out",
        address=ray_cluster,
        timeout=120,
    )
    assert done.returncode == 1
    assert "data.loader=ray_data needs at least 1 CPU beside the workers" in done.stdout + done.stderr
    assert summary_of(run_dirs(tmp_path / "out")[0])["status"] == "failed"
