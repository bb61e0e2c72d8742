"""metrics.csv read back: a restarted or resumed run keeps its rows up to its checkpoint
(raydra.worker.loggers), and resume= reads it the same way before it takes the run over
(raydra.run.resume), so that a damaged file is refused there, naming it, before anything of the run is
changed, rather than failing the run on its worker once it has been taken over (a
UnicodeDecodeError's 52 lines, and the run left `failed`).

Only the standard library: the driver reads it without Lightning or torch.
"""

import csv
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from raydra.errors import RaydraError

# The columns a kept row is placed by (raydra.worker.loggers): each must be a number, or empty.
POSITION = ("epoch", "step")


def read(path: Path) -> Tuple[Optional[Sequence[str]], List[Dict[str, str]]]:
    """metrics.csv's columns (None for an empty file) and rows. A file that is not UTF-8 text, not
    CSV, or whose epoch or step is not a number is refused in one sentence naming it (RaydraError)."""
    try:
        with Path(path).open(newline="", encoding="utf-8") as file:
            reader = csv.DictReader(file)
            rows = list(reader)
            fields = reader.fieldnames
    except UnicodeDecodeError as error:
        raise _damaged(path, f"not UTF-8 text: {error.reason}") from None
    except csv.Error as error:
        raise _damaged(path, f"not CSV: {error}") from None
    for number, row in enumerate(rows, start=2):  # the header is line 1
        for column in POSITION:
            value = row.get(column)
            if value not in (None, "") and not _is_number(value):
                raise _damaged(path, f"row {number}'s {column} is {value[:40]!r}, not a number")
    return fields, rows


def _is_number(value: str) -> bool:
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


def _damaged(path: Path, why: str) -> RaydraError:
    return RaydraError(
        f"{path} cannot be read back as the run's metrics ({why}); move it aside (e.g. to {Path(path).name}.damaged) and "
        "resume again: the run logs its metrics anew from its checkpoint on, the earlier ones staying in the moved file."
    )
