"""The object store's storage: every object version appended to a log of segment files, an index in memory.

A file per object cost the broker's disk path most of its time here (ext4, 2 cores): creating a file
takes ~250 µs and renaming one over an existing file ~500 µs (ext4 flushes the replaced file's data
on such a rename), while appending the same 30 KB to an open file takes ~15 µs. Tansu writes a record
batch object and replaces its partition's watermark.json on every produce request, so the store now
appends both to one log and keeps, in memory, where each object's current version is:

  ROOT/segments/<id>.seg   records [header | bucket | key | body], appended by one event-loop thread

A record is a put (the object's whole body), a delete (a tombstone) or a mark (the sequence number
reached, so that a version number is never issued twice). Each carries a CRC32 of everything after
the CRC field. Opening the store replays the segments in order; the first record that is cut short
or fails its CRC ends its segment, which is truncated there: only a write that was never
acknowledged can be cut short by a kill -9 (an acknowledged one has returned from write(2), so it is
in the OS). With fsync on, every write is fdatasync'ed before it is acknowledged (a power cut).

An object's ETag is its version's sequence number: unique per version across restarts, so a
conditional write (If-Match) can never succeed against a version that was replaced, even when the
same bytes come back (no ABA).

Space: a segment whose live records fill less than half of it is compacted — its live puts are
appended again (same version, same time) to the active segment, then it is deleted. A tombstone is
carried along only while an older segment may still hold a put of its key. Compaction never runs
while a backup holds retention (deploy/broker_retention.py `held`), so a backup's copy never misses
a segment that moved.

Small objects that are not record batches (watermark.json, consumer offsets: rewritten on every
request) keep their body in the index too, so reading one costs no system call.

A folder of objects as files (this store's earlier layout, ROOT/<bucket>/<key>) is moved into the log
when the store opens it.
"""
from __future__ import annotations

import bisect
import logging
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("herdfence.objectstore")

SEGMENTS = "segments"
LEGACY_TMP = ".tmp"
SEGMENT_BYTES = 32 << 20
COMPACT_BELOW = 0.5            # a segment whose live records fill less than this share is compacted
INLINE_MAX = 4096              # bodies of small non-batch objects kept in memory
MAX_KEY_BYTES = 1024           # as S3

MAGIC = 0x48464F31             # "HFO1"
# magic, crc32 (of everything after it), kind, sequence number, mtime ns, bucket length, key length, body length
HEADER = struct.Struct("<IIB3xQqHHQ")
PUT, DELETE, MARK = 1, 2, 3


class S3Error(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class ObjectMeta:
    key: str
    size: int
    etag: str
    mtime: float


@dataclass
class _Entry:
    """Where an object's current version is: segment, record start and length, the body's offset."""
    meta: ObjectMeta
    seq: int
    mtime_ns: int
    segment: int
    pos: int
    length: int                 # the whole record's bytes
    body: bytes | None          # kept in memory (small, hot objects)


class _Segment:
    def __init__(self, sid: int, path: Path) -> None:
        self.id, self.path = sid, path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.live = 0            # bytes of the records that hold a current version
        self.keys: set[tuple[str, str]] = set()   # every object with a record here (puts or tombstones)


@dataclass(frozen=True)
class _Record:
    kind: int
    seq: int
    mtime_ns: int
    bucket: str
    key: str
    pos: int
    length: int
    body_at: int                # offset of the body in the segment
    size: int
    body: bytes | None          # only when asked for


def _etag(seq: int) -> str:
    return f'"{seq:x}"'


def _check_name(bucket: str, key: str) -> None:
    parts = [bucket, *key.split("/")]
    if (not bucket or "/" in bucket or any(p in ("", ".", "..") for p in parts)
            or len(bucket.encode()) > 255 or len(key.encode()) > MAX_KEY_BYTES):
        raise S3Error(400, "InvalidArgument", f"unsupported object name {bucket}/{key}")


def _inline(key: str, size: int) -> bool:
    return size <= INLINE_MAX and not key.endswith(".batch")


def _records(data: memoryview, with_bodies: Callable[[str, int], bool]) -> Iterator[_Record]:
    """The whole records of a segment's bytes, in order; stops at the first cut-short or corrupt one."""
    pos, end = 0, len(data)
    while pos + HEADER.size <= end:
        magic, crc, kind, seq, mtime_ns, blen, klen, size = HEADER.unpack_from(data, pos)
        length = HEADER.size + blen + klen + size
        if magic != MAGIC or kind not in (PUT, DELETE, MARK) or pos + length > end:
            return
        if zlib.crc32(data[pos + 8:pos + length]) != crc:
            return
        names = pos + HEADER.size
        bucket = bytes(data[names:names + blen]).decode()
        key = bytes(data[names + blen:names + blen + klen]).decode()
        body_at = names + blen + klen
        body = bytes(data[body_at:body_at + size]) if kind == PUT and with_bodies(key, size) else None
        yield _Record(kind, seq, mtime_ns, bucket, key, pos, length, body_at, size, body)
        pos += length


class DiskStore:
    """Objects in an append-only log under `root` (see the module's docstring). Not thread-safe: one
    event loop thread calls it, so a precondition check and the write that follows are atomic."""

    def __init__(self, root: Path, fsync: bool = False, segment_bytes: int = SEGMENT_BYTES,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.clock = clock                # ns since the epoch: an object's LastModified (retention's age)
        self._dir = self.root / SEGMENTS
        self._dir.mkdir(parents=True, exist_ok=True)
        self._segments: dict[int, _Segment] = {}
        self._keys: dict[str, list[str]] = {}           # bucket → sorted keys (listings)
        self._entries: dict[str, dict[str, _Entry]] = {}
        self._seq = 0
        self._recover()
        self._active = self._segments[max(self._segments)] if self._segments else self._new_segment()
        self._migrate_files()

    # --- reads ---------------------------------------------------------------------------------
    def meta(self, bucket: str, key: str) -> ObjectMeta | None:
        entry = self._entries.get(bucket, {}).get(key)
        return None if entry is None else entry.meta

    def read(self, bucket: str, key: str) -> tuple[ObjectMeta, bytes]:
        entry = self._entries.get(bucket, {}).get(key)
        if entry is None:
            raise S3Error(404, "NoSuchKey", f"{key} does not exist")
        if entry.body is not None:
            return entry.meta, entry.body
        at = entry.pos + entry.length - entry.meta.size
        return entry.meta, os.pread(self._segments[entry.segment].fd, entry.meta.size, at)

    def list(self, bucket: str, prefix: str, after: str = "", limit: int | None = None) -> list[ObjectMeta]:
        """The objects whose key starts with `prefix` and sorts after `after`, sorted by key (at most
        `limit` of them)."""
        keys, entries = self._keys.get(bucket, []), self._entries.get(bucket, {})
        out = []
        start = bisect.bisect_right(keys, max(prefix, after)) if after >= prefix else bisect.bisect_left(keys, prefix)
        for i in range(start, len(keys)):
            key = keys[i]
            if not key.startswith(prefix) or (limit is not None and len(out) >= limit):
                break
            out.append(entries[key].meta)
        return out

    # --- writes --------------------------------------------------------------------------------
    def put(self, bucket: str, key: str, body: bytes, if_match: str | None,
            if_none_match: str | None) -> ObjectMeta:
        _check_name(bucket, key)
        current = self.meta(bucket, key)
        if if_none_match == "*" and current is not None:
            raise S3Error(412, "PreconditionFailed", f"{key} exists (If-None-Match: *)")
        if if_match is not None and (current is None or if_match not in ("*", current.etag)):
            raise S3Error(412, "PreconditionFailed", f"{key} changed (If-Match)")
        return self._put(bucket, key, body, self._seq + 1, self.clock())

    def delete(self, bucket: str, key: str) -> None:
        _check_name(bucket, key)
        if key not in self._entries.get(bucket, {}):
            return
        self._append(DELETE, bucket, key, b"", self._seq + 1, self.clock())
        self._drop(bucket, key)
        self._maybe_roll()

    def _put(self, bucket: str, key: str, body: bytes, seq: int, mtime_ns: int) -> ObjectMeta:
        segment, pos, length = self._append(PUT, bucket, key, body, seq, mtime_ns)
        meta = ObjectMeta(key, len(body), _etag(seq), mtime_ns / 1e9)
        self._index(bucket, key, _Entry(meta, seq, mtime_ns, segment.id, pos, length,
                                        bytes(body) if _inline(key, len(body)) else None))
        self._maybe_roll()
        return meta

    def _append(self, kind: int, bucket: str, key: str, body: bytes, seq: int,
                mtime_ns: int) -> tuple[_Segment, int, int]:
        """One record at the end of the active segment; when the write fails (a full disk) the
        segment is cut back to where it was, so the log never holds a torn record before good ones."""
        seg = self._active
        b, k = bucket.encode(), key.encode()
        tail = HEADER.pack(MAGIC, 0, kind, seq, mtime_ns, len(b), len(k), len(body))[8:]
        crc = zlib.crc32(body, zlib.crc32(k, zlib.crc32(b, zlib.crc32(tail))))
        parts = [struct.pack("<II", MAGIC, crc), tail, b, k, body]
        length = HEADER.size + len(b) + len(k) + len(body)
        pos = seg.size
        try:
            written = os.writev(seg.fd, parts)
            if written < length:                        # a short write (rare): the rest
                rest = b"".join(parts)[written:]
                while rest:
                    rest = rest[os.write(seg.fd, rest):]
            if self.fsync:
                os.fdatasync(seg.fd)
        except OSError as e:
            os.ftruncate(seg.fd, pos)
            raise S3Error(507, "InsufficientStorage", f"the object store cannot write: {e.strerror}") from e
        seg.size = pos + length
        seg.keys.add((bucket, key))
        self._seq = max(self._seq, seq)
        return seg, pos, length

    def _index(self, bucket: str, key: str, entry: _Entry) -> None:
        entries = self._entries.setdefault(bucket, {})
        old = entries.get(key)
        if old is None:
            bisect.insort(self._keys.setdefault(bucket, []), key)
        else:
            self._segments[old.segment].live -= old.length
        entries[key] = entry
        self._segments[entry.segment].live += entry.length

    def _drop(self, bucket: str, key: str) -> None:
        entries = self._entries.get(bucket, {})
        old = entries.pop(key, None)
        if old is None:
            return
        self._segments[old.segment].live -= old.length
        keys = self._keys[bucket]
        del keys[bisect.bisect_left(keys, key)]

    # --- segments ------------------------------------------------------------------------------
    def _new_segment(self) -> _Segment:
        sid = max(self._segments, default=0) + 1
        seg = self._segments[sid] = _Segment(sid, self._dir / f"{sid:012d}.seg")
        self._active = seg
        self._sync_dir()
        # the sequence number reached, in case compaction later removes every record that held it
        self._append(MARK, "", "", b"", self._seq, self.clock())
        return seg

    def _maybe_roll(self) -> None:
        if self._active.size >= self.segment_bytes:
            self._new_segment()

    def _sync_dir(self) -> None:
        if self.fsync:
            fd = os.open(self._dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _recover(self) -> None:
        for path in sorted(self._dir.glob("*.seg")):
            try:
                sid = int(path.stem)
            except ValueError:
                continue
            seg = self._segments[sid] = _Segment(sid, path)
            data = memoryview(os.pread(seg.fd, seg.size, 0))
            end = 0
            for rec in _records(data, _inline):
                end = rec.pos + rec.length
                seg.keys.add((rec.bucket, rec.key))
                self._seq = max(self._seq, rec.seq)
                if rec.kind == PUT:
                    meta = ObjectMeta(rec.key, rec.size, _etag(rec.seq), rec.mtime_ns / 1e9)
                    self._index(rec.bucket, rec.key, _Entry(meta, rec.seq, rec.mtime_ns, sid, rec.pos,
                                                            rec.length, rec.body))
                elif rec.kind == DELETE:
                    self._drop(rec.bucket, rec.key)
            if end < seg.size:
                log.warning("segment %s: %d bytes after the last whole record dropped (a write cut off "
                            "before it was acknowledged)", path.name, seg.size - end)
                os.ftruncate(seg.fd, end)
                seg.size = end

    def _migrate_files(self) -> None:
        """Objects stored as files (ROOT/<bucket>/<key>) are appended to the log, then removed."""
        moved: list[Path] = []
        for bucket_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name not in (SEGMENTS, LEGACY_TMP)):
            for dirpath, _, files in os.walk(bucket_dir):
                for name in sorted(files):
                    path = Path(dirpath) / name
                    key = path.relative_to(bucket_dir).as_posix()
                    self._put(bucket_dir.name, key, path.read_bytes(), self._seq + 1, path.stat().st_mtime_ns)
                    moved.append(path)
        legacy_tmp = self.root / LEGACY_TMP
        if not moved and not legacy_tmp.exists():
            return
        for seg in self._segments.values():
            os.fsync(seg.fd)               # the log holds them before their files go
        for path in moved + (sorted(legacy_tmp.iterdir()) if legacy_tmp.is_dir() else []):
            path.unlink()
        for p in sorted(self.root.iterdir()):
            if p.is_dir() and p.name != SEGMENTS:
                for dirpath, _, _ in sorted(os.walk(p), reverse=True):
                    try:
                        os.rmdir(dirpath)
                    except OSError:
                        pass
        log.info("moved %d objects from files into the log", len(moved))

    # --- compaction ----------------------------------------------------------------------------
    def compactable(self) -> list[int]:
        """Segments (not the active one) whose live records fill less than COMPACT_BELOW of them."""
        return [s.id for s in sorted(self._segments.values(), key=lambda s: s.id)
                if s is not self._active and s.live < s.size * COMPACT_BELOW]

    def compact(self) -> int:
        """Compact every compactable segment now; returns how many were removed."""
        done = 0
        for sid in self.compactable():
            for _ in self.compact_steps(sid):
                pass
            done += 1
        return done

    def compact_steps(self, sid: int, step_bytes: int = 4 << 20) -> Iterator[None]:
        """Compact segment `sid`, yielding after every `step_bytes` copied: the caller may serve
        requests in between (each step re-checks which records are still current)."""
        seg = self._segments[sid]
        data = memoryview(os.pread(seg.fd, seg.size, 0))
        older = [s for s in self._segments.values() if s.id < sid]
        copied = 0
        for rec in _records(data, lambda _k, _n: False):
            if rec.kind == PUT:
                entry = self._entries.get(rec.bucket, {}).get(rec.key)
                if entry is None or entry.segment != sid or entry.pos != rec.pos:
                    continue                                     # replaced or deleted since
                body = bytes(data[rec.body_at:rec.body_at + rec.size])
                self._put(rec.bucket, rec.key, body, rec.seq, rec.mtime_ns)
                copied += rec.length
            elif (rec.kind == DELETE and rec.key not in self._entries.get(rec.bucket, {})
                  and any((rec.bucket, rec.key) in s.keys for s in older)):
                # an older segment may still hold a put of this key: the tombstone must outlive it
                # (unless the key was written again since: that newer put shadows the old one)
                self._append(DELETE, rec.bucket, rec.key, b"", rec.seq, rec.mtime_ns)
                copied += rec.length
            if copied >= step_bytes:
                copied = 0
                yield
        del data
        self._append(MARK, "", "", b"", self._seq, self.clock())
        if self.fsync:
            os.fdatasync(self._active.fd)        # the copies are on disk before their source goes
        os.close(seg.fd)
        seg.path.unlink()
        del self._segments[sid]
        self._sync_dir()

    def segment_sizes(self) -> dict[int, tuple[int, int]]:
        """{segment id: (bytes, live bytes)}"""
        return {s.id: (s.size, s.live) for s in self._segments.values()}

    def close(self) -> None:
        for seg in self._segments.values():
            os.close(seg.fd)
        self._segments.clear()
