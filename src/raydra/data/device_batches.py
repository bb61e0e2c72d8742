"""Batches cut from a dataset held on the worker's own device, for datasets that fit in memory.

Indexing a device tensor per batch and augmenting the whole batch with tensor ops replaces a
DataLoader's per-sample Python and host-to-device copies, which on a GPU can cost more than the
model's step.
"""

from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch

from raydra.errors import RaydraError
from raydra.lightning import pl


def worker_placement(trainer: Any) -> Tuple[torch.device, int, int]:
    """This worker's device, rank and world size (CPU, 0, 1 outside a Trainer)."""
    if trainer is None:
        return torch.device("cpu"), 0, 1
    return trainer.strategy.root_device, trainer.global_rank, trainer.world_size


def draw(n: int, crop_padding: int, flip: bool, generator: torch.Generator) -> Tuple[Any, Any, Any]:
    """crop_flip's random draws for n images (row and column offsets, which to flip), on the CPU
    generator whatever the images' device, so a batch's draws do not depend on where it runs."""
    p = crop_padding
    dy = torch.randint(0, 2 * p + 1, (n,), generator=generator) if p else None
    dx = torch.randint(0, 2 * p + 1, (n,), generator=generator) if p else None
    flipped = torch.rand(n, generator=generator) < 0.5 if flip else None
    return dy, dx, flipped


def crop_flip(images: torch.Tensor, crop_padding: int, flip: bool, generator: torch.Generator) -> torch.Tensor:
    """Random crop with zero padding and horizontal flip, per image, as tensor ops over the (n, C, H, W)
    batch: the one training augmentation, for batches on a worker's device and for Ray Data's
    map_batches tasks alike."""
    n, _, h, w = images.shape
    dy, dx, flipped = draw(n, crop_padding, flip, generator)
    if crop_padding:
        p = crop_padding
        padded = torch.nn.functional.pad(images, (p, p, p, p))
        dy, dx = dy.to(images.device), dx.to(images.device)
        rows = (dy.view(n, 1) + torch.arange(h, device=images.device)).view(n, 1, h, 1)
        cols = (dx.view(n, 1) + torch.arange(w, device=images.device)).view(n, 1, 1, w)
        batch = torch.arange(n, device=images.device).view(n, 1, 1, 1)
        channel = torch.arange(images.shape[1], device=images.device).view(1, -1, 1, 1)
        images = padded[batch, channel, rows, cols]
    if flip:
        flipped = flipped.to(images.device).view(n, 1, 1, 1)
        images = torch.where(flipped, images.flip(-1), images)
    return images


class DeviceBatches:
    """One worker's shard as batches made on its device; reshuffled every epoch with a seeded generator.

    Lightning only re-shards DataLoaders, so the shard (every world_size-th sample of the
    shuffled order) is taken here; every worker gets the same number of batches.

    The order depends only on seed + epoch, as DistributedSampler's does: raydra's Resumable
    callback calls `set_epoch` at every epoch start, and `skip` when a run restarts from a
    mid-epoch checkpoint, so a restarted run sees exactly the batches an uninterrupted one would.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        rank: int,
        world_size: int,
        train: bool,
        augment: bool,
        seed: int,
        mean: Sequence[float],
        std: Sequence[float],
        crop_padding: int,
        flip: bool,
    ) -> None:
        self.images, self.labels = images, labels
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.train, self.augment, self.seed = train, augment, seed
        self.crop_padding, self.flip = crop_padding, flip
        self.mean = torch.tensor(mean, device=images.device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(std, device=images.device).view(1, -1, 1, 1) * 255
        self.per_worker = len(labels) // world_size
        self.epoch = 0
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def skip(self, batches: int) -> None:
        """The next iteration starts after its first `batches` batches."""
        self._skip = batches

    def __len__(self) -> int:
        full, rest = divmod(self.per_worker, self.batch_size)
        return full if self.train or not rest else full + 1

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for images, labels, _ in self.with_indices():
            yield images, labels

    def with_indices(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor, List[int]]]:
        """The batches with the indices of their samples, on the host: read from the device, the
        indices would make the host wait for the GPU's queue to drain every step."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        # Without set_epoch (outside a Trainer) every iteration still gets a new order.
        self.epoch += 1
        skip, self._skip = self._skip, 0
        order = torch.randperm(len(self.labels), generator=generator) if self.train else torch.arange(len(self.labels))
        on_host = order[self.rank : self.per_worker * self.world_size : self.world_size]
        shard = on_host.to(self.images.device)  # once an epoch
        for number, start in enumerate(range(0, len(self) * self.batch_size, self.batch_size)):
            index = shard[start : start + self.batch_size]
            if number < skip:
                if self.augment:
                    # A skipped batch still draws its augmentation, so later batches get the same draws.
                    draw(len(index), self.crop_padding, self.flip, generator)
                continue
            images = self.images[index].float()
            if self.augment:
                images = crop_flip(images, self.crop_padding, self.flip, generator)
            yield (images - self.mean) / self.std, self.labels[index], on_host[start : start + self.batch_size].tolist()


def place_splits(
    trainer: Any,
    splits: Iterable[Tuple[str, Any, Any]],
    batch_size: int,
    seed: int,
    augment: bool,
    mean: Sequence[float],
    std: Sequence[float],
    crop_padding: int,
    flip: bool,
) -> Dict[str, DeviceBatches]:
    """Each (name, images, labels) split on this worker's device as DeviceBatches; `batch_size` is
    the global batch, and only the "train" split is shuffled and augmented.

    `splits` may be a generator, so a split is decoded only once the previous one is on the device.
    A split smaller than the world is left out: some workers would have no batch of it.
    """
    device, rank, world_size = worker_placement(trainer)
    loaders = {}
    for name, images, labels in splits:
        if len(labels) < world_size:
            continue
        train = name == "train"
        loaders[name] = DeviceBatches(
            torch.as_tensor(images).to(device),
            torch.as_tensor(labels).long().to(device),
            batch_size // world_size,
            rank,
            world_size,
            train=train,
            augment=train and augment,
            seed=seed,
            mean=mean,
            std=std,
            crop_padding=crop_padding,
            flip=flip,
        )
    return loaders


class DeviceSplitsDataModule(pl.LightningDataModule):
    """A data module whose `setup` fills `self.loaders` (see place_splits; RayDataModule fills it with
    Ray Data shards instead) with a "train" split and "val" and/or "test". A data set without a validation split validates on its test split, so the
    monitored metric exists; one without a test split is never tested (`has_test_split`), so no
    other split's figures are reported as test ones."""

    def __init__(self) -> None:
        super().__init__()
        self.loaders: Dict[str, Any] = {}

    @property
    def has_test_split(self) -> bool:
        """Whether setup found a test split at least as large as the world; raydra's worker loop
        runs `trainer.test` only then."""
        return "test" in self.loaders

    def train_dataloader(self) -> Any:
        return self.loaders["train"]

    # By key, not `or`: a loader with no batches is falsy.
    def val_dataloader(self) -> Any:
        return self.loaders["val" if "val" in self.loaders else "test"]

    def test_dataloader(self) -> Any:
        if not self.has_test_split:
            raise RaydraError(
                f"{type(self).__name__} has no test split (none in the data, data.test_fraction=0, or "
                "fewer test samples than workers); add one or set trainer.test=false."
            )
        return self.loaders["test"]


class FoundSplits(NamedTuple):
    """What a FoundClassesDataModule's data holds."""

    classes: List[str]
    # Where the classes were found, as the user names it (`data.root=...`): said when
    # data.num_classes disagrees with them.
    source: str
    # (name, uint8 images, labels) per split; a generator decodes each once the previous is on the device.
    splits: Iterable[Tuple[str, Any, Any]]
    mean: Sequence[float]
    std: Sequence[float]


class FoundClassesDataModule(DeviceSplitsDataModule):
    """Images whose classes are found in the data (a folder's class subfolders, a column's label
    names), decoded once by `decoded_splits` and held on each worker's device by place_splits.

    A subclass spells out its constructor's arguments (those `data._target_` takes), including
    batch_size, split_seed, augment, crop_padding, flip and num_classes, and calls
    `super().__init__()` first: Lightning's save_hyperparameters, called here, collects the
    arguments of every __init__ down to the subclass's.
    """

    def __init__(self) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.classes: List[str] = []

    def decoded_splits(self) -> FoundSplits:
        raise NotImplementedError

    def setup(self, stage: Optional[str] = None) -> None:
        if self.loaders:
            return
        hp = self.hparams
        found = self.decoded_splits()
        self.classes = found.classes
        if len(found.classes) != hp.num_classes:
            named = ", ".join(found.classes[:5]) + (", ..." if len(found.classes) > 5 else "")
            raise RaydraError(
                f"{found.source} has {len(found.classes)} classes ({named}) but data.num_classes={hp.num_classes}; "
                f"set data.num_classes={len(found.classes)}, or null to take them from the data."
            )
        self.loaders = place_splits(
            self.trainer, found.splits, hp.batch_size, hp.split_seed, hp.augment, found.mean, found.std, hp.crop_padding, hp.flip
        )
