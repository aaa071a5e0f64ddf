"""Retention of the embedded broker's `gps.reports` log: objects the job has consumed are deleted.

Tansu's disk engine keeps one object per produced record batch and lists a partition's whole
records/ folder on every fetch, so a fetch costs O(objects in the partition): an API producing small
batches at 2,000 reports/s added ~1,000 objects per partition in a few minutes and pushed a fetch past
100 ms; left alone it grows without bound. `gps.reports` is a transport buffer (the reports' system of
record is the job's history), so once the job has committed a batch the objects wholly below its end
offsets are only kept for `keep_s` more seconds, then deleted. The window bounds what every fetch
lists: at 2,000 reports/s a 600 s window grew a partition's listing to ~10,000 objects, the store
served 1.6 GB of listings a minute, and the job's reads and log-end listings slowed minute after
minute. A replay never needs a deleted object (Spark replays only uncommitted batches), and a
backup holds retention while it copies (`hold`): it copies the checkpoint first and the broker last.

Deleting the oldest objects is what Tansu expects of retention: its low watermark follows the first
listed object, and a fetch below it starts at the first one that remains (checked on Tansu 0.6).
Nothing the job has not committed is ever deleted, nor the newest object of a partition.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from fencing.model import offset_log

log = logging.getLogger("herdfence.broker")

TOPIC = "gps.reports"
_RECORDS = re.compile(r"^clusters/[^/]+/topics/" + re.escape(TOPIC) + r"/partitions/(\d+)/records/(\d+)\.batch$")


def committed_ends(checkpoint: Path) -> dict[int, int] | None:
    """The end offset per partition of the newest batch the job committed, or None when there is none
    (no checkpoint yet, or unreadable)."""
    ends = offset_log.committed_ends(checkpoint)
    return None if ends is None else {int(p): o for p, o in ends.items()}


@dataclass(frozen=True)
class Swept:
    deleted: int
    kept: int


def sweep(store, bucket: str, ends: dict[int, int], keep_s: float, now: float | None = None) -> Swept:
    """Delete the `gps.reports` objects of `store` (a deploy.objectstore.DiskStore) whose records are
    all below the committed end of their partition and that are older than `keep_s`."""
    now = time.time() if now is None else now
    by_partition: dict[int, list[tuple[int, object]]] = {}
    for meta in store.list(bucket, "clusters/"):
        m = _RECORDS.match(meta.key)
        if m:
            by_partition.setdefault(int(m.group(1)), []).append((int(m.group(2)), meta))
    deleted = kept = 0
    for partition, objects in by_partition.items():
        objects.sort(key=lambda o: o[0])
        end = ends.get(partition)
        for (_, meta), (next_base, _) in zip(objects, objects[1:]):
            # the object holds offsets [its base, next base): consumed when next base <= end
            if end is not None and next_base <= end and meta.mtime < now - keep_s:
                store.delete(bucket, meta.key)
                deleted += 1
            else:
                kept += 1
        kept += 1                                          # the newest object of the partition stays
    return Swept(deleted, kept)


HOLD_FILE = "broker_retention.hold"      # in HERDFENCE_HOME/run while a backup copies
HOLD_MAX_S = 3600.0                     # a hold left by a killed backup lapses after this long


def hold_path(checkpoint: Path) -> Path:
    """The hold file beside the job's checkpoint (HERDFENCE_HOME/run), never inside the broker's data."""
    return Path(checkpoint).parent / "run" / HOLD_FILE


def held(checkpoint: Path, now: float | None = None) -> bool:
    try:
        return (time.time() if now is None else now) - hold_path(checkpoint).stat().st_mtime < HOLD_MAX_S
    except OSError:
        return False


class Retention:
    """Runs `sweep` every `every_s` on the object store's own event loop (so it is atomic with the
    requests it serves) against the job's checkpoint, unless a backup holds it."""

    def __init__(self, store, checkpoint: Path, keep_s: float, bucket: str = "tansu", every_s: float = 10.0):
        self.store, self.checkpoint, self.keep_s = store, Path(checkpoint), keep_s
        self.bucket, self.every_s = bucket, every_s

    def run_once(self) -> Swept | None:
        if held(self.checkpoint):
            return None
        ends = committed_ends(self.checkpoint)
        if ends is None:
            return None
        swept = sweep(self.store, self.bucket, ends, self.keep_s)
        if swept.deleted:
            log.info("retention: deleted %d consumed %s objects (%d kept)", swept.deleted, TOPIC, swept.kept)
        return swept

    async def run(self) -> None:
        import asyncio
        while True:
            await asyncio.sleep(self.every_s)
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - never take the store down; try again next round
                log.exception("retention sweep failed")
