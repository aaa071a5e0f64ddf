"""Compaction of the position history (fencing.model.history): the job writes one small Parquet file per
(micro-batch, partition, day), four batches a second under load, so a day folder gains hundreds of
thousands of files and every read lists and opens them all. The driver merges them on a timer.

Only files of committed batches are merged: a batch Spark may still replay rewrites its own file (that
is what keeps the history exactly-once), so that file must still be there, alone. A merged file
(`compact-<id>.parquet`) carries the names of its sources in its metadata; it is renamed into place
before they are removed, and a pass first removes the sources of every merged file that are still
there (a crash between the rename and the removals), so rows are never kept twice for longer than
that one pass. A day that is over (older than yesterday) also gets its merged files merged, up to
`TARGET_BYTES` a file. Sources are streamed one at a time: memory stays at one source file.
"""
from __future__ import annotations

import fcntl
import os
import re
import secrets
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import orjson
import pyarrow.parquet as pq

from fencing.model.history import HISTORY_SCHEMA

BATCH_FILE = re.compile(r"^batch-(?P<run>.+)-(?P<batch>\d+)-part-(?P<part>\d+)\.parquet$")
COMPACT_PREFIX = "compact-"
SOURCES_KEY = b"herdfence.sources"
TARGET_BYTES = 128 << 20       # a merged file stops taking sources past this many source bytes
MIN_FILES = 2                  # fewer than this in a day: nothing to gain
LOCK_NAME = ".compact.lock"    # in the history root; a leading dot: dataset readers skip it


@dataclass
class Compacted:
    merged_files: int = 0       # source files merged (and removed)
    written: int = 0            # merged files written
    recovered: int = 0          # leftover sources of an interrupted pass removed


def committed(name: str, run_id: str, first_replayable: int) -> bool:
    """Is this a batch file that no replay will rewrite? (Any batch of another run is: a run's
    batches are replayed only by that run.)"""
    m = BATCH_FILE.match(name)
    if not m:
        return False
    return m["run"] != run_id or int(m["batch"]) < first_replayable


@contextmanager
def _one_pass_at_a_time(root: str) -> Iterator[None]:
    """An exclusive lock on the history root for one pass: a pass's first step drops the half-written
    merges it finds, which must never be another live pass's (the job's timer and a manual or backup
    pass ran side by side, and one lost its file mid-rename). The kernel frees it if a pass is killed."""
    with open(Path(root) / LOCK_NAME, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def compact(root: str, run_id: str, first_replayable: int, today: datetime | None = None) -> Compacted:
    if not root or not Path(root).is_dir():
        return Compacted()
    with _one_pass_at_a_time(root):
        return _compact(root, run_id, first_replayable, today)


def _compact(root: str, run_id: str, first_replayable: int, today: datetime | None) -> Compacted:
    out = Compacted()
    today = (today or datetime.now(timezone.utc)).date()
    closed_before = (today - timedelta(days=1)).isoformat()
    for folder in sorted(Path(root).glob("day=*")):
        out.recovered += _finish_interrupted(folder)
        files = sorted(p for p in folder.iterdir() if p.suffix == ".parquet")
        sources = [p for p in files if committed(p.name, run_id, first_replayable)]
        if folder.name[4:] < closed_before:      # a day that is over: its merged files too
            sources += [p for p in files if p.name.startswith(COMPACT_PREFIX)]
        if len(sources) < MIN_FILES:
            continue
        for group in _groups(sources):
            if len(group) >= MIN_FILES:
                _merge(folder, group)
                out.written += 1
                out.merged_files += len(group)
    return out


def finish_interrupted(root: str) -> int:
    """`compact`'s first step alone, on every day of `root` (a backup copied while the job compacted)."""
    if not root or not Path(root).is_dir():
        return 0
    with _one_pass_at_a_time(root):
        return sum(_finish_interrupted(folder) for folder in sorted(Path(root).glob("day=*")))


def _groups(files: list[Path]) -> list[list[Path]]:
    groups, current, size = [], [], 0
    for p in files:
        current.append(p)
        size += p.stat().st_size
        if size >= TARGET_BYTES:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


def _merge(folder: Path, sources: list[Path]) -> None:
    target = folder / f"{COMPACT_PREFIX}{secrets.token_hex(8)}.parquet"
    scratch = folder / f".{target.name}.tmp"     # a leading dot: dataset readers skip it
    schema = HISTORY_SCHEMA.with_metadata({SOURCES_KEY: orjson.dumps([p.name for p in sources])})
    with pq.ParquetWriter(scratch, schema, compression="zstd", use_dictionary=["farm_id", "device_id"]) as writer:
        for p in sources:
            writer.write_table(pq.read_table(p, schema=HISTORY_SCHEMA).replace_schema_metadata(schema.metadata))
    os.replace(scratch, target)
    for p in sources:
        p.unlink(missing_ok=True)


def _finish_interrupted(folder: Path) -> int:
    """Remove the sources a merged file lists that are still there; drop half-written merges."""
    removed = 0
    for scratch in folder.glob(f".{COMPACT_PREFIX}*.tmp"):
        scratch.unlink(missing_ok=True)
    merged = sorted(folder.glob(f"{COMPACT_PREFIX}*.parquet"))
    if len(merged) == len(list(folder.glob("*.parquet"))) == 1:
        return 0                     # a finished day: nothing it could list is left
    for p in merged:
        names = (pq.read_schema(p).metadata or {}).get(SOURCES_KEY)
        for name in orjson.loads(names) if names else []:
            source = folder / name
            if source.exists() and source != p:
                source.unlink()
                removed += 1
    return removed
