"""Held-out splits, stratified by class, by scikit-learn's `train_test_split`: one way for every
data module, so a fraction means the same thing (and the same samples, per seed) whichever
module or loader cuts it."""

from typing import Dict

import numpy as np
from sklearn.model_selection import train_test_split

from raydra.errors import RaydraError


def stratified_split(labels: np.ndarray, fractions: Dict[str, float], seed: int, where: str) -> Dict[str, np.ndarray]:
    """{"train": indices, role: indices, ...} into `labels`: each role of `fractions` ("val",
    "test") holds that fraction of all the labels, every class in the same share as in the whole;
    a role whose fraction is 0 is left out. The same seed gives the same indices.

    The held-out roles are cut from the whole together, then from each other, so each fraction is
    of the whole train split, not of what an earlier cut left. `where` names the data in errors."""
    labels = np.asarray(labels)
    held = {role: fraction for role, fraction in fractions.items() if fraction > 0}
    index = np.arange(len(labels))
    if not held:
        return {"train": index}
    roles, total = list(held), sum(held.values())
    asked = " and ".join(f"data.{role}_fraction={fraction}" for role, fraction in held.items())
    if total >= 1:
        raise RaydraError(f"{where}: {asked} leave nothing to train on; hold out less than the whole (e.g. 0.1 each).")
    # Counts, not fractions, go to sklearn: 0.1 + 0.2 is 0.30000000000000004 in floats, which it
    # would round up to one sample too many.
    counts = {role: max(1, int(round(fraction * len(labels)))) for role, fraction in held.items()}
    try:
        train, rest = train_test_split(index, test_size=sum(counts.values()), stratify=labels, random_state=seed)
        if len(roles) == 1:
            return {"train": train, roles[0]: rest}
        first, second = roles
        kept, cut = train_test_split(rest, test_size=counts[second], stratify=labels[rest], random_state=seed)
    except ValueError as error:
        reason = str(error).split(". ")[0].rstrip(".")
        reason = reason[:1].lower() + reason[1:]
        raise RaydraError(
            f"{where} cannot hold out {asked} with every class in every split ({reason}); "
            "change the fractions or add samples to the smallest class."
        ) from None
    return {"train": train, first: kept, second: cut}
