"""A ViT that writes down which training samples each worker got, for tests that check sharding.

Workers import it as `tests.probe` (Ray puts the driver's working directory, the repository, on
their path). Each worker appends one fingerprint per training sample to
<run dir>/seen/rank<r>_epoch<e>.txt; distinct images give distinct fingerprints, so a sample seen
twice in an epoch or by two workers shows as a repeat.
"""

import hashlib
from pathlib import Path

from raydra.models.vit import ViTClassifier


class RecordingViT(ViTClassifier):
    def on_train_batch_start(self, batch, batch_idx):
        images, _ = batch
        folder = Path(self.trainer.default_root_dir) / "seen"
        folder.mkdir(exist_ok=True)
        with open(folder / f"rank{self.trainer.global_rank}_epoch{self.current_epoch}.txt", "a") as file:
            for image in images.detach().cpu().numpy().round(4):
                file.write(hashlib.sha1(image.tobytes()).hexdigest() + "\n")


def seen_per_epoch(run_dir):
    """{epoch: {rank: [fingerprints]}} from a finished run."""
    out = {}
    for path in sorted(Path(run_dir, "seen").glob("rank*_epoch*.txt")):
        rank, epoch = (int(part[len(prefix) :]) for part, prefix in zip(path.stem.split("_"), ("rank", "epoch")))
        out.setdefault(epoch, {})[rank] = path.read_text().split()
    return out
