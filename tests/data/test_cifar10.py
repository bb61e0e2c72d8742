"""CIFAR-10 from real cifar-10-batches-py pickle files written on the spot (no network)."""

import math
import pickle

import numpy as np
import pytest
import torch
from helpers import run_dirs, summary_of

from raydra.data.cifar10 import TEST_FILE, TRAIN_FILES, CIFAR10DataModule, read_batches
from raydra.data.device_batches import DeviceBatches
from raydra.errors import RaydraError


def write_cifar(root, per_batch=40, seed=0):
    """The layout and pickle format torchvision reads: dicts with 'data' (N x 3072 uint8) and 'labels'."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for name in TRAIN_FILES + [TEST_FILE]:
        labels = rng.integers(0, 10, per_batch)
        # Each class has its own colour, so a model can learn it.
        data = (rng.integers(0, 60, (per_batch, 3, 32, 32)) + (labels * 20)[:, None, None, None]).astype(np.uint8)
        with open(folder / name, "wb") as file:
            pickle.dump({"data": data.reshape(per_batch, -1), "labels": labels.tolist()}, file)
    return root


def test_reads_the_pickle_batches(tmp_path):
    folder = write_cifar(tmp_path) / "cifar-10-batches-py"
    images, labels = read_batches(folder, TRAIN_FILES)
    assert images.shape == (200, 3, 32, 32) and images.dtype == np.uint8
    assert labels.shape == (200,) and set(labels) <= set(range(10))


def test_worker_shards_cover_the_split_once_and_batches_are_augmented_on_the_device():
    images = torch.arange(10, dtype=torch.uint8).repeat_interleave(3 * 32 * 32).view(10, 3, 32, 32)
    labels = torch.arange(10)
    seen = []
    for rank in range(2):
        batches = DeviceBatches(
            images,
            labels,
            batch_size=5,
            rank=rank,
            world_size=2,
            train=True,
            augment=True,
            seed=0,
            mean=(0, 0, 0),
            std=(1 / 255,) * 3,
            crop_padding=4,
            flip=True,
        )
        assert len(batches) == 1
        for x, y in batches:
            assert x.shape == (5, 3, 32, 32)
            seen.extend(y.tolist())
    assert sorted(seen) == list(range(10))  # every sample once across the two workers, none twice


def test_the_exported_image_processor_prepares_cifar_images_as_the_module_does(tmp_path):
    """A run's Hugging Face export (raydra.records.hf_export) carries this processor and CIFAR's class names."""
    from helpers import hf_processed
    from PIL import Image

    root = write_cifar(tmp_path / "cifar")
    data = CIFAR10DataModule(root=str(root), batch_size=40, augment=False)
    data.setup()
    seen, _ = next(iter(data.test_dataloader()))  # test_batch's first 40, in order
    raw, _ = read_batches(root / "cifar-10-batches-py", [TEST_FILE])
    inputs = CIFAR10DataModule.image_inputs({"root": str(root)})
    pixels = hf_processed(inputs, [Image.fromarray(image.transpose(1, 2, 0)) for image in raw[:40]], tmp_path / "hf")
    assert torch.allclose(pixels, seen, atol=1e-5)
    assert inputs.class_names[:3] == ["airplane", "automobile", "bird"] and len(inputs.class_names) == 10


def test_a_missing_root_or_a_corrupt_file_is_named(tmp_path):
    with pytest.raises(RaydraError, match="holds no CIFAR-10 batch files"):
        CIFAR10DataModule(root=str(tmp_path)).setup()
    folder = write_cifar(tmp_path / "c") / "cifar-10-batches-py"
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(RaydraError, match="data_batch_3 is not a CIFAR-10 batch file"):
        CIFAR10DataModule(root=str(tmp_path / "c")).setup()


@pytest.mark.e2e
def test_trains_from_the_files(train_here, tmp_path):
    """In local mode, in this process: what is CIFAR-10's here is reading its files and batching
    them on the device; how a worker's shard is cut is the test above's, and Ray's workers are the
    digits runs'."""
    root = write_cifar(tmp_path / "cifar", per_batch=64)
    done = train_here(
        "experiment=vit_cifar10",
        f"data.root={root}",
        "data.batch_size=32",
        "scale.num_workers=0",
        "model.num_layers=2",
        "model.hidden_size=64",
        "model.mlp_size=128",
        "model.num_heads=4",
        "trainer.max_epochs=2",
        "logger=csv",
        outputs=tmp_path / "out",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path / "out")
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["epochs_completed"] == 2
    # 320 train images less 10% validation, 32 a step: 9 steps an epoch.
    assert summary["global_step"] == 2 * (288 // 32)
    # It learns the classes' colours in 18 steps: on 64 test images, twice chance (0.1) or more, and a
    # loss below a uniform guess's ln(10) = 2.30 (0.297 and 1.81 in 8 steps on 2 workers, 2026-11-25).
    final = summary["metrics"]["final"]
    assert final["test/acc"] >= 0.2 and final["test/loss"] < math.log(10), final


def test_a_missing_root_fails_the_run_with_one_sentence(train_here, tmp_path):
    # A folder without the batch files: one that does not exist at all is refused before the run
    # resolves (test_config's data-root test), in raydra's words rather than the module's.
    (tmp_path / "nowhere").mkdir()
    done = train_here(
        "experiment=vit_cifar10", f"data.root={tmp_path}/nowhere", "scale.num_workers=0", "logger=csv", outputs=tmp_path / "out"
    )
    assert done.returncode == 1
    assert f"error: data.root={tmp_path}/nowhere holds no CIFAR-10 batch files" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    (run_dir,) = run_dirs(tmp_path / "out")
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and "holds no CIFAR-10 batch files" in summary["error"]
