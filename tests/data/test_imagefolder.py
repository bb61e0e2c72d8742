"""data=imagefolder on real PNG files written on the spot."""

import numpy as np
import pytest
import torch
from helpers import bare_trainer, run_dirs, summary_of
from PIL import Image

from raydra.data.imagefolder import ImageFolderDataModule
from raydra.data.splits import stratified_split
from raydra.errors import RaydraError
from raydra.lightning import pl


def write_folder(root, classes=("circle", "square", "stripe"), per_class=20, size=16):
    rng = np.random.default_rng(0)
    for label, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 80, (size, size, 3)) + label * 80
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")
    return root


def test_stratified_split_and_class_names(tmp_path):
    data = ImageFolderDataModule(root=str(write_folder(tmp_path)), num_classes=3, image_size=8, batch_size=4)
    data.setup()
    assert data.classes == ["circle", "square", "stripe"]
    sizes = {split: len(loader.labels) for split, loader in data.loaders.items()}
    assert sizes == {"train": 48, "val": 6, "test": 6}
    for loader in data.loaders.values():  # every class in every split
        assert sorted(set(loader.labels.tolist())) == [0, 1, 2]
    images, labels = next(iter(data.train_dataloader()))
    assert images.shape == (4, 3, 8, 8) and labels.shape == (4,)


@pytest.mark.parametrize("channels", [3, 1])
def test_the_exported_image_processor_prepares_an_image_file_as_the_module_does(tmp_path, channels):
    """A run's Hugging Face export (raydra.records.hf_export) carries this processor and the class folders'
    names: 16x16 files resized to 8x8 as decode resizes them, RGB or greyscale."""
    from helpers import hf_processed

    from raydra.data.imagefolder import find_splits

    config = dict(root=str(write_folder(tmp_path / "shapes")), num_classes=3, image_size=8, num_channels=channels, augment=False)
    data = ImageFolderDataModule(**config, batch_size=6, class_names=["circle", "square", "stripe"])
    data.setup()
    seen, _ = next(iter(data.test_dataloader()))
    _, splits = find_splits(config["root"], 0.1, 0.1, 0)
    raw = [Image.open(path).convert({3: "RGB", 1: "L"}[channels]) for path in splits["test"][0]]
    inputs = ImageFolderDataModule.image_inputs({**config, "class_names": ["circle", "square", "stripe"]})
    assert torch.allclose(hf_processed(inputs, raw, tmp_path / "hf"), seen, atol=1e-5)
    assert inputs.class_names == ["circle", "square", "stripe"]


def test_stratified_splits_are_fractions_of_the_whole_and_the_same_per_seed():
    labels = np.repeat([0, 1, 2], [40, 20, 60])
    cut = stratified_split(labels, {"val": 0.1, "test": 0.2}, seed=3, where="data.root=/x")
    assert {role: len(index) for role, index in cut.items()} == {"train": 84, "val": 12, "test": 24}
    assert sorted(np.concatenate(list(cut.values())).tolist()) == list(range(120))  # each sample in one split
    for role, share in (("val", 0.1), ("test", 0.2)):  # every class in the whole's proportions
        assert np.bincount(labels[cut[role]]).tolist() == [round(40 * share), round(20 * share), round(60 * share)]
    again, other = (stratified_split(labels, {"val": 0.1, "test": 0.2}, seed, "data.root=/x") for seed in (3, 4))
    assert all(np.array_equal(cut[r], again[r]) for r in cut)
    assert not np.array_equal(np.sort(cut["val"]), np.sort(other["val"]))
    assert list(stratified_split(labels, {"val": 0.1, "test": 0.0}, 0, "data.root=/x")) == ["train", "val"]
    with pytest.raises(RaydraError, match=r"^data.root=/x cannot hold out data.val_fraction=0.1 .*add samples to the smallest class.$"):
        stratified_split(np.array([0, 0, 0, 0, 1, 2]), {"val": 0.1, "test": 0.1}, 0, "data.root=/x")


class TinyClassifier(pl.LightningModule):
    """Logs val/acc and test/acc the way raydra's models do, so a test run's figures can be told apart."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, 3)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), labels)

    def _acc(self, batch):
        images, labels = batch
        return (self.layer(images.flatten(1)).argmax(-1) == labels).float().mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/acc", self._acc(batch))

    def test_step(self, batch, batch_idx):
        self.log("test/acc", self._acc(batch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("test_fraction", [0.0, 0.1])
def test_validation_is_never_reported_as_test(tmp_path, test_fraction):
    """Data without a test split runs no test: before, test_dataloader fell back to the validation
    split and the run reported its figures as test/*."""
    from raydra.worker import loop

    data = ImageFolderDataModule(
        root=str(write_folder(tmp_path)), num_classes=3, image_size=8, batch_size=8, test_fraction=test_fraction, augment=False
    )
    model = TinyClassifier()
    trainer = bare_trainer(max_epochs=1)
    trainer.fit(model, datamodule=data)
    assert loop._has_test_split(data) is bool(test_fraction)
    metrics, skipped = loop.run_test(trainer, model, data, enabled=True, rank=0)
    if test_fraction:
        assert list(metrics) == ["test/acc"] and skipped is None
        return
    assert metrics == {} and skipped == "the data has no test split"
    assert not any(key.startswith("test/") for key in trainer.callback_metrics)
    with pytest.raises(RaydraError, match="has no test split"):
        data.test_dataloader()
    assert data.val_dataloader() is data.loaders["val"]


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("missing", "is not a folder"),
        ("empty_class", "holds no images"),
        ("corrupt", "is not a readable image"),
        ("classes", "has 3 classes (circle, square, stripe) but data.num_classes=4; set data.num_classes=3"),
    ],
)
def test_bad_folders_are_named(tmp_path, breakage, message):
    root = write_folder(tmp_path / "images")
    num_classes = 3
    if breakage == "missing":
        root = tmp_path / "nowhere"
    elif breakage == "empty_class":
        (root / "empty").mkdir()
    elif breakage == "corrupt":
        (root / "square" / "3.png").write_bytes(b"not a png")
    else:
        num_classes = 4
    with pytest.raises(RaydraError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ImageFolderDataModule(root=str(root), num_classes=num_classes, image_size=8).setup()


@pytest.mark.e2e
def test_trains_from_pngs(train_here, tmp_path):
    """In local mode, in this process: reading the folders is the data module's, and Ray's workers
    are the digits runs'."""
    root = write_folder(tmp_path / "images", per_class=40)
    done = train_here(
        "data=imagefolder",
        f"data.root={root}",
        "data.num_classes=3",
        "data.image_size=16",
        "data.batch_size=32",
        "scale.num_workers=0",
        "model.patch_size=4",
        "trainer.max_epochs=3",
        "logger=csv",
        outputs=tmp_path / "out",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = summary_of(run_dirs(tmp_path / "out")[0])
    assert summary["status"] == "completed"
    # 96 training images, 32 a step: 3 steps an epoch.
    assert summary["global_step"] == 3 * 3
    assert summary["metrics"]["final"]["test/acc"] > 0.5  # three colour classes are easy
