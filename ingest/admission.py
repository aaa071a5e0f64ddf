"""When the job's source plans no new records although the log has them (ingest.kafka_source's
latestOffset): while an operator or the benchmark holds its reads."""
from __future__ import annotations

import math
import time
from pathlib import Path


def hold(path: Path, seconds: float) -> None:
    """Plan no new records for `seconds` (or until `release`): a running query keeps its state, its
    workers and their caches, and finishes the batch it is in; records wait in the log. The file holds
    the time the hold ends, so a hold never outlives its writer by more than that."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{time.time() + seconds:.3f}\n")
    tmp.replace(path)


def release(path: Path) -> None:
    path.unlink(missing_ok=True)


def held(path: str | None) -> bool:
    """Whether a hold is in force: `path` names a finite time (epoch seconds) still to come. No file, a
    past or non-finite time, or anything unreadable: no hold."""
    if not path:
        return False
    try:
        with open(path) as f:
            until = float(f.read().strip())
    except (OSError, ValueError):
        return False
    return math.isfinite(until) and time.time() < until
