"""CIFAR-10 from the standard `cifar-10-batches-py` pickle files (what torchvision reads), without torchvision.

The whole set is 180 MB of uint8: each worker keeps its shard on its own device and builds
batches there (random crop with padding, horizontal flip, normalisation as batched tensor ops),
so no per-image Python transform and no host-to-device copy sits on the training step.
"""

import pickle
import tarfile
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from raydra.data.device_batches import DeviceSplitsDataModule, place_splits
from raydra.data.images import ImageInputs, settings, vit_processor
from raydra.data.splits import stratified_split
from raydra.errors import RaydraError

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_FILE = "test_batch"
# The labels' names, as batches.meta lists them.
CLASS_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def read_batches(folder: Path, names: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """Images as N x 3 x 32 x 32 uint8 and labels as int64, from CIFAR's pickled batch files."""
    images: List[np.ndarray] = []
    labels: List[int] = []
    for name in names:
        path = folder / name
        try:
            with open(path, "rb") as file:
                batch = pickle.load(file, encoding="latin1")
            images.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.extend(batch["labels"])
        except FileNotFoundError:
            raise RaydraError(
                f"{path} is missing; data.root must hold the cifar-10-batches-py files (or set data.download=true)."
            ) from None
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as error:
            raise RaydraError(f"{path} is not a CIFAR-10 batch file ({error}); download it again.") from None
    return np.concatenate(images), np.asarray(labels, dtype=np.int64)


def locate(root: str, download: bool) -> Path:
    """The folder holding the batch files: root itself or root/cifar-10-batches-py."""
    base = Path(root).expanduser()
    for folder in (base, base / "cifar-10-batches-py"):
        if (folder / TEST_FILE).exists():
            return folder
    if not download:
        raise RaydraError(
            f"data.root={root} holds no CIFAR-10 batch files (cifar-10-batches-py/); point data.root at them "
            "or set data.download=true on a machine with network."
        )
    base.mkdir(parents=True, exist_ok=True)
    archive = base / "cifar-10-python.tar.gz"
    try:
        urllib.request.urlretrieve(URL, archive)
    except OSError as error:
        raise RaydraError(
            f"could not download CIFAR-10 from {URL} ({error}); this machine has no network: copy "
            "cifar-10-batches-py into data.root instead."
        ) from None
    with tarfile.open(archive) as tar:
        tar.extractall(base, filter="data")
    return base / "cifar-10-batches-py"


class CIFAR10DataModule(DeviceSplitsDataModule):
    """Train split = data_batch_1..5 less a stratified `val_fraction`; test = test_batch.

    `batch_size` is the global batch; each worker draws batch_size / world_size from its shard.
    """

    def __init__(
        self,
        root: str,
        download: bool = False,
        batch_size: int = 512,
        val_fraction: float = 0.1,
        split_seed: int = 0,
        augment: bool = True,
        crop_padding: int = 4,
        flip: bool = True,
        mean: Sequence[float] = (0.4914, 0.4822, 0.4465),
        std: Sequence[float] = (0.2470, 0.2435, 0.2616),
        image_size: int = 32,
        num_channels: int = 3,
        num_classes: int = 10,
        # data.loader, which raydra reads (RunSpec.loader): how the run feeds this module, not the module's to act on.
        loader: Optional[str] = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: Optional[str] = None) -> None:
        if self.loaders:
            return
        hp = self.hparams
        folder = locate(hp.root, hp.download)
        train_x, train_y = read_batches(folder, TRAIN_FILES)
        test_x, test_y = read_batches(folder, [TEST_FILE])
        cut = stratified_split(train_y, {"val": hp.val_fraction}, hp.split_seed, f"data.root={hp.root}")
        self.loaders = place_splits(
            self.trainer,
            [*((role, train_x[index], train_y[index]) for role, index in cut.items()), ("test", test_x, test_y)],
            hp.batch_size,
            hp.split_seed,
            hp.augment,
            hp.mean,
            hp.std,
            hp.crop_padding,
            hp.flip,
        )

    @classmethod
    def image_inputs(cls, data: Dict[str, Any]) -> ImageInputs:
        """CIFAR's class names, and the processor that normalises its 32x32 images as setup does
        (other images are resized to 32x32 first)."""
        hp = settings(cls, data)
        return ImageInputs(CLASS_NAMES, vit_processor(32, 3, hp["mean"], hp["std"]))

    @staticmethod
    def ray_datasets(data: Dict[str, Any]) -> Dict[str, Tuple[Any, int, Any]]:
        """data.loader=ray_data: {split: (ray.data.Dataset, rows, its Preprocess)} from the same
        arrays and split as setup, for raydra.data.ray_data.build."""
        from raydra.data.ray_data import from_arrays, preprocess

        folder = locate(data["root"], data["download"])
        train_x, train_y = read_batches(folder, TRAIN_FILES)
        test_x, test_y = read_batches(folder, [TEST_FILE])
        cut = stratified_split(train_y, {"val": data["val_fraction"]}, data["split_seed"], f"data.root={data['root']}")
        parts = {}
        for role, x, y in (*((role, train_x[index], train_y[index]) for role, index in cut.items()), ("test", test_x, test_y)):
            # Seeded shuffle once, so Ray's blocks are not one class after another; the local
            # shuffle buffer and a random block order then vary it per epoch.
            order = np.random.default_rng(data["split_seed"]).permutation(len(y)) if role == "train" else np.arange(len(y))
            dataset = from_arrays(x[order], y[order])
            if role == "train":
                dataset = dataset.randomize_block_order()
            parts[role] = (dataset, len(y), preprocess(data, role, "image", "label", 32, data["mean"], data["std"]))
        return parts
