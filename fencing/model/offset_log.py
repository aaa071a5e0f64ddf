"""The job's Spark checkpoint, read as plain files: which offsets a micro-batch was planned with.

`offsets/<batch id>` holds "v1", the batch's metadata and one JSON line per source (the job has one:
{"<kafka partition>": end offset}); `commits/<batch id>` exists once the batch is done. Spark writes
`offsets/N` before batch N runs, and a replay after a crash runs with the same file. Readers: the
driver (fencing.stream.batch_shape) and the embedded broker's retention (deploy/broker_retention.py).
"""
from __future__ import annotations

import json
from pathlib import Path

Offsets = dict[str, int]


def logged_offsets(checkpoint: str | Path, batch_id: int) -> Offsets | None:
    """The end offsets logged for `batch_id`, or None (not logged, torn, or not a local path)."""
    try:
        lines = (Path(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
        return {str(k): int(v) for k, v in json.loads(lines[2]).items()}
    except (OSError, IndexError, ValueError, AttributeError, TypeError):
        return None


def committed_ends(checkpoint: str | Path) -> Offsets | None:
    """The end offsets of the newest committed batch (the highest N with commits/N and offsets/N)."""
    try:
        done = sorted((int(p.name) for p in (Path(checkpoint) / "commits").iterdir() if p.name.isdigit()),
                      reverse=True)
    except OSError:
        return None
    for batch in done:
        ends = logged_offsets(checkpoint, batch)
        if ends is not None:
            return ends
    return None
