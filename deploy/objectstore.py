"""A small S3-compatible object store on local disk: the embedded broker's durable storage.

Tansu (the embedded Kafka broker) keeps its log in an object store; on `s3://` it speaks the S3 API
and relies on conditional writes (`If-None-Match: *` to create an object only once, `If-Match: <etag>`
to replace exactly the version it read) for its optimistic concurrency (tansu-storage's dynostore).
No S3 server installable here from PyPI, Debian or npm both keeps objects on disk and honours those
preconditions (s3rver ignores them; moto's server keeps objects in memory), so herdfence serves the
subset Tansu uses itself:

  PUT /bucket/key          (If-None-Match: * → 412 when it exists; If-Match: etag → 412 unless equal)
  GET / HEAD /bucket/key   (Range, If-Match / If-None-Match on reads)
  DELETE /bucket/key
  GET /bucket?list-type=2  (prefix, delimiter, start-after, continuation-token, max-keys)

Durability: an object is written to a temporary file and renamed over its key, so a reader or a
crash never sees half an object; a kill -9 of this server or of the broker loses nothing that was
acknowledged (the data is in the OS). HERDFENCE_OBJECTSTORE_FSYNC=1 also fsyncs every write (and its
directory) before answering, for a power cut; it costs a disk flush per produce request.

Every request is handled to completion on one event loop thread, so a precondition check and the
rename that follows it are atomic without locks. Loopback only, no authentication (it binds
127.0.0.1; the signature headers a client sends are ignored).
"""
from __future__ import annotations

import argparse
import asyncio
import bisect
import email.utils
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

TMP_DIR = ".tmp"
MAX_KEYS = 1000


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


def _etag(st: os.stat_result) -> str:
    # A new inode on every write (tmp file + rename): inode, time and size identify the version.
    return f'"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"'


class DiskStore:
    """Objects as files under `root/<bucket>/<key>`."""

    def __init__(self, root: Path, fsync: bool = False) -> None:
        self.root = Path(root)
        self.fsync = fsync
        (self.root / TMP_DIR).mkdir(parents=True, exist_ok=True)
        for stale in (self.root / TMP_DIR).iterdir():     # a write cut off by a crash
            stale.unlink(missing_ok=True)
        # Tansu lists a partition's whole records/ folder on every fetch: walking and stat-ing the
        # folder per listing made a fetch O(objects) on disk (~100 ms at 800 objects, longer than a
        # reader's fetch wait). An in-memory index per bucket (sorted keys + metadata), read from disk
        # once and kept by put/delete (the only writers: one event-loop thread), makes a listing a
        # bisect plus the entries it returns.
        self._keys: dict[str, list[str]] = {}
        self._metas: dict[str, dict[str, ObjectMeta]] = {}

    def _path(self, bucket: str, key: str) -> Path:
        parts = [bucket, *key.split("/")]
        if not bucket or bucket == TMP_DIR or any(p in ("", ".", "..") for p in parts):
            raise S3Error(400, "InvalidArgument", f"unsupported object name {bucket}/{key}")
        return self.root.joinpath(*parts)

    def meta(self, bucket: str, key: str) -> ObjectMeta | None:
        try:
            st = self._path(bucket, key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not os.path.isfile(self._path(bucket, key)):
            return None
        return ObjectMeta(key, st.st_size, _etag(st), st.st_mtime)

    def put(self, bucket: str, key: str, body: bytes, if_match: str | None,
            if_none_match: str | None) -> ObjectMeta:
        target = self._path(bucket, key)
        current = self.meta(bucket, key)
        if if_none_match == "*" and current is not None:
            raise S3Error(412, "PreconditionFailed", f"{key} exists (If-None-Match: *)")
        if if_match is not None and (current is None or if_match not in ("*", current.etag)):
            raise S3Error(412, "PreconditionFailed", f"{key} changed (If-Match)")
        tmp = self.root / TMP_DIR / uuid.uuid4().hex
        with open(tmp, "wb") as f:
            f.write(body)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, target)
        if self.fsync:
            fd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        meta = self.meta(bucket, key)
        self._indexed(bucket, key, meta)
        return meta  # type: ignore[return-value]

    def read(self, bucket: str, key: str) -> tuple[ObjectMeta, bytes]:
        path = self._path(bucket, key)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise S3Error(404, "NoSuchKey", f"{key} does not exist") from None
        return ObjectMeta(key, st.st_size, _etag(st), st.st_mtime), data

    def delete(self, bucket: str, key: str) -> None:
        path = self._path(bucket, key)
        try:
            path.unlink()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return
        self._indexed(bucket, key, None)
        bucket_dir = self.root / bucket
        parent = path.parent
        while parent != bucket_dir:       # drop empty folders so listings stay cheap
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def list(self, bucket: str, prefix: str, after: str = "", limit: int | None = None) -> list[ObjectMeta]:
        """The objects whose key starts with `prefix` and sorts after `after`, sorted by key (at most
        `limit` of them)."""
        keys, metas = self._index(bucket)
        out = []
        for i in range(bisect.bisect_right(keys, max(prefix, after)) if after >= prefix else
                       bisect.bisect_left(keys, prefix), len(keys)):
            key = keys[i]
            if not key.startswith(prefix) or (limit is not None and len(out) >= limit):
                break
            out.append(metas[key])
        return out

    def _index(self, bucket: str) -> tuple[list[str], dict[str, ObjectMeta]]:
        if bucket not in self._keys:
            metas: dict[str, ObjectMeta] = {}
            base = self.root / bucket
            if bucket != TMP_DIR and base.is_dir():
                for dirpath, _, files in os.walk(base):
                    rel_dir = os.path.relpath(dirpath, base)
                    for name in files:
                        key = name if rel_dir == "." else f"{rel_dir}/{name}"
                        st = os.stat(os.path.join(dirpath, name))
                        metas[key] = ObjectMeta(key, st.st_size, _etag(st), st.st_mtime)
            self._keys[bucket], self._metas[bucket] = sorted(metas), metas
        return self._keys[bucket], self._metas[bucket]

    def _indexed(self, bucket: str, key: str, meta: ObjectMeta | None) -> None:
        """Keep the index in step with a write (meta) or a delete (None)."""
        if bucket not in self._keys:
            return                        # not read yet: the first listing reads the disk
        keys, metas = self._keys[bucket], self._metas[bucket]
        if meta is None:
            if metas.pop(key, None) is not None:
                del keys[bisect.bisect_left(keys, key)]
            return
        if key not in metas:
            bisect.insort(keys, key)
        metas[key] = meta


def _http_date(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


def _iso(ts: float) -> str:
    import datetime
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _error_xml(err: S3Error, resource: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{err.code}</Code>'
            f"<Message>{escape(err.message)}</Message><Resource>{escape(resource)}</Resource></Error>").encode()


# Each object's <Contents> entry, rendered once per version (a listing repeats them on every fetch)
_CONTENTS: dict[ObjectMeta, str] = {}
_CONTENTS_MAX = 500_000


def _contents(m: ObjectMeta) -> str:
    if len(_CONTENTS) >= _CONTENTS_MAX:
        _CONTENTS.clear()
    _CONTENTS[m] = out = (f"<Contents><Key>{escape(m.key)}</Key><LastModified>{_iso(m.mtime)}</LastModified>"
                          f"<ETag>{escape(m.etag)}</ETag><Size>{m.size}</Size>"
                          "<StorageClass>STANDARD</StorageClass></Contents>")
    return out


def _max_keys(q: dict[str, str]) -> int:
    return max(1, min(MAX_KEYS, int(q.get("max-keys") or MAX_KEYS)))


def _list_xml(bucket: str, q: dict[str, str], objects: list[ObjectMeta]) -> bytes:
    prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
    after = q.get("continuation-token") or q.get("start-after") or ""
    max_keys = _max_keys(q)
    contents: list[ObjectMeta] = []
    prefixes: list[str] = []
    truncated, last = False, ""
    for m in objects:
        if m.key <= after:
            continue
        if delimiter and delimiter in m.key[len(prefix):]:
            common = m.key[:len(prefix) + m.key[len(prefix):].index(delimiter) + len(delimiter)]
            if prefixes and prefixes[-1] == common:
                continue
            if after and common <= after:
                continue
            entry_key: str | None = None
        else:
            common, entry_key = "", m.key
        if len(contents) + len(prefixes) >= max_keys:
            truncated = True
            break
        if entry_key is None:
            prefixes.append(common)
            last = common
        else:
            contents.append(m)
            last = m.key
    parts = ['<?xml version="1.0" encoding="UTF-8"?>',
             '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
             f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>",
             f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>",
             f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"]
    if delimiter:
        parts.append(f"<Delimiter>{escape(delimiter)}</Delimiter>")
    if truncated:
        parts.append(f"<NextContinuationToken>{escape(last)}</NextContinuationToken>")
    parts += [_CONTENTS.get(m) or _contents(m) for m in contents]
    for p in prefixes:
        parts.append(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>")
    parts.append("</ListBucketResult>")
    return "".join(parts).encode()


def _range(header: str, size: int) -> tuple[int, int] | None:
    """`bytes=a-b`, `bytes=a-`, `bytes=-n` → [start, end) or None when unsatisfiable."""
    spec = header.split("=", 1)[1].strip() if "=" in header else ""
    lo, _, hi = spec.partition("-")
    if lo == "":
        n = int(hi)
        return (max(0, size - n), size) if n > 0 else None
    start = int(lo)
    end = min(size, int(hi) + 1) if hi else size
    return (start, end) if start < end else None


class RequestStats:
    """Requests served per kind (GET, PUT, LIST, ...) and the time spent in them, logged every
    `every_s`: what the broker asks of its disk (a fetch is a listing plus a GET per record batch)."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self.count: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.bytes = 0

    def add(self, kind: str, seconds: float, size: int) -> None:
        self.count[kind] = self.count.get(kind, 0) + 1
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds
        self.bytes += size

    def take(self) -> str:
        if not self.count:
            return ""
        parts = [f"{k} {n} ({self.seconds[k] / n * 1e6:.0f} µs)" for k, n in sorted(self.count.items())]
        line = f"{', '.join(parts)}; {self.bytes / 1e6:.1f} MB in {self.every_s:.0f} s"
        self.count, self.seconds, self.bytes = {}, {}, 0
        return line

    async def run(self) -> None:
        log = logging.getLogger("herdfence.objectstore")
        while True:
            await asyncio.sleep(self.every_s)
            line = self.take()
            if line:
                log.info("requests: %s", line)


class S3App:
    """ASGI application over a DiskStore."""

    def __init__(self, store: DiskStore, stats: RequestStats | None = None) -> None:
        self.store = store
        self.stats = stats

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 - ASGI
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        path = unquote(scope["path"])
        started = time.perf_counter()
        try:
            status, out_headers, out = self.handle(scope["method"], path,
                                                   scope.get("query_string", b"").decode(), headers, body)
        except S3Error as e:
            status, out_headers, out = e.status, {"content-type": "application/xml"}, _error_xml(e, path)
        except ValueError as e:
            err = S3Error(400, "InvalidArgument", str(e))
            status, out_headers, out = 400, {"content-type": "application/xml"}, _error_xml(err, path)
        out_headers.setdefault("content-length", str(len(out)))
        if self.stats is not None:
            method = scope["method"]
            kind = "LIST" if method == "GET" and "/" not in path.lstrip("/") else method
            self.stats.add(kind, time.perf_counter() - started, len(body) + len(out))
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.encode(), v.encode()) for k, v in out_headers.items()]})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else out})

    def handle(self, method: str, path: str, query: str, headers: dict[str, str],
               body: bytes) -> tuple[int, dict[str, str], bytes]:
        bucket, _, key = path.lstrip("/").partition("/")
        q = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
        if not key:
            if method == "GET":       # ListObjectsV2 (the only bucket-level call Tansu makes)
                after = q.get("continuation-token") or q.get("start-after") or ""
                # one more than a page: the listing tells whether it is truncated (with a delimiter,
                # folded entries may need more; then the whole rest is read)
                limit = None if q.get("delimiter") else _max_keys(q) + 1
                listing = self.store.list(bucket, q.get("prefix", ""), after, limit)
                return 200, {"content-type": "application/xml"}, _list_xml(bucket, q, listing)
            if method in ("PUT", "HEAD"):     # create / probe a bucket: folders need no creation
                return 200, {}, b""
            raise S3Error(501, "NotImplemented", f"{method} on a bucket is not supported")
        if "uploads" in q or "uploadId" in q or "x-amz-copy-source" in headers:
            raise S3Error(501, "NotImplemented", "multipart uploads and copies are not supported")
        if method == "PUT":
            meta = self.store.put(bucket, key, body, headers.get("if-match"), headers.get("if-none-match"))
            return 200, {"etag": meta.etag}, b""
        if method == "DELETE":
            self.store.delete(bucket, key)
            return 204, {}, b""
        if method in ("GET", "HEAD"):
            meta, data = self.store.read(bucket, key)
            if "if-match" in headers and headers["if-match"] not in ("*", meta.etag):
                raise S3Error(412, "PreconditionFailed", f"{key} changed (If-Match)")
            if "if-none-match" in headers and headers["if-none-match"] in ("*", meta.etag):
                return 304, {"etag": meta.etag}, b""
            out = {"etag": meta.etag, "last-modified": _http_date(meta.mtime),
                   "content-type": "application/octet-stream", "accept-ranges": "bytes"}
            if "range" in headers and method == "GET":
                span = _range(headers["range"], meta.size)
                if span is None:
                    raise S3Error(416, "InvalidRange", f"range {headers['range']} of {meta.size} bytes")
                start, end = span
                out["content-range"] = f"bytes {start}-{end - 1}/{meta.size}"
                return 206, out, data[start:end]
            if method == "HEAD":
                out["content-length"] = str(meta.size)
            return 200, out, data
        raise S3Error(405, "MethodNotAllowed", f"{method} is not supported")


def main(argv: list[str] | None = None) -> None:
    """`python -m deploy.objectstore --root DIR --port N`: serve DIR on 127.0.0.1:N."""
    import uvicorn
    p = argparse.ArgumentParser(prog="python -m deploy.objectstore", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--checkpoint", type=Path, help="the job's checkpoint: consumed gps.reports objects are "
                                                   "deleted after --keep-seconds (deploy/broker_retention.py)")
    p.add_argument("--keep-seconds", type=float, default=600.0)
    p.add_argument("--stats-every", type=float, default=60.0, help="log request counts every N seconds")
    args = p.parse_args(argv)
    from fencing.config import TUNING
    store = DiskStore(args.root, fsync=TUNING.objectstore_fsync)
    stats = RequestStats(args.stats_every)
    config = uvicorn.Config(S3App(store, stats), host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                            http="httptools", loop="uvloop", lifespan="off")
    server = uvicorn.Server(config)

    async def serve() -> None:
        if args.checkpoint:
            from deploy.broker_retention import Retention
            # on the server's own loop: a sweep's deletes never interleave with a request
            asyncio.get_running_loop().create_task(Retention(store, args.checkpoint, args.keep_seconds).run())
        asyncio.get_running_loop().create_task(stats.run())
        await server.serve()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import uvloop
    uvloop.run(serve())


if __name__ == "__main__":
    main()
