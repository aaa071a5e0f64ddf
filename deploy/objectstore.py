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

Storage (deploy/objectlog.py): every write is appended to a log of segment files before it is
acknowledged, and an index in memory says where each object's current version is; a kill -9 of this
server or of the broker loses nothing that was acknowledged (the data is in the OS), and a write cut
off before its acknowledgement is dropped when the log is opened again. HERDFENCE_OBJECTSTORE_FSYNC=1
also flushes every write to the disk before answering, for a power cut.

HTTP: a small HTTP/1.1 server on httptools (keep-alive, one request at a time per connection). Every
request is handled to completion in one callback of one event loop thread, so a precondition check and
the write that follows it are atomic without locks. Loopback only, no authentication (it binds
127.0.0.1; the signature headers a client sends are ignored).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import email.utils
import logging
import time
from pathlib import Path
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

import httptools

from deploy.objectlog import DiskStore, ObjectMeta, S3Error

MAX_KEYS = 1000
MAX_BODY = 256 << 20             # a request body larger than this is refused (Tansu's batches are far smaller)
log = logging.getLogger("herdfence.objectstore")


def _http_date(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


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
    """The S3 calls over a DiskStore: (method, path, query, headers, body) → (status, headers, body)."""

    def __init__(self, store: DiskStore, stats: RequestStats | None = None) -> None:
        self.store = store
        self.stats = stats

    def respond(self, method: str, raw_path: str, query: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        started = time.perf_counter()
        path = unquote(raw_path)
        try:
            status, out_headers, out = self.handle(method, path, query, headers, body)
        except S3Error as e:
            status, out_headers, out = e.status, {"content-type": "application/xml"}, _error_xml(e, path)
        except (ValueError, UnicodeError) as e:
            err = S3Error(400, "InvalidArgument", str(e))
            status, out_headers, out = 400, {"content-type": "application/xml"}, _error_xml(err, path)
        if self.stats is not None:
            kind = "LIST" if method == "GET" and "/" not in path.lstrip("/") else method
            self.stats.add(kind, time.perf_counter() - started, len(body) + len(out))
        return status, out_headers, out

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


_REASONS = {200: "OK", 204: "No Content", 206: "Partial Content", 304: "Not Modified", 400: "Bad Request",
            404: "Not Found", 405: "Method Not Allowed", 412: "Precondition Failed", 413: "Payload Too Large",
            416: "Range Not Satisfiable", 500: "Internal Server Error", 501: "Not Implemented",
            507: "Insufficient Storage"}


class _Connection(asyncio.Protocol):
    """One client connection: httptools parses, S3App answers in the same callback, one write back."""

    def __init__(self, app: S3App, max_body: int = MAX_BODY) -> None:
        self.app, self.max_body = app, max_body
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0

    def connection_made(self, transport) -> None:  # noqa: ANN001 - asyncio's transport
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            if not isinstance(e.__context__, _TooLarge):
                raise
            err = S3Error(413, "EntityTooLarge", f"a request body is at most {self.max_body} bytes")
            self._answer(413, {"content-type": "application/xml"}, _error_xml(err, ""), keep_alive=False)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            err = S3Error(400, "BadRequest", "not an HTTP/1.1 request")
            self._answer(400, {"content-type": "application/xml"}, _error_xml(err, ""), keep_alive=False)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self.headers.get("expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.max_body:
            raise _TooLarge
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode()
        url = httptools.parse_url(self.url)
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        try:
            status, headers, out = self.app.respond(method, url.path.decode("latin-1"),
                                                    (url.query or b"").decode("latin-1"), self.headers, body)
        except Exception as e:  # noqa: BLE001 - answer 500 and keep serving; the log says why
            log.exception("request %s %s failed", method, self.url[:200])
            err = S3Error(500, "InternalError", type(e).__name__)
            status, headers, out = 500, {"content-type": "application/xml"}, _error_xml(err, "")
        length = headers.pop("content-length", None) or str(len(out))
        self._answer(status, headers, b"" if method == "HEAD" else out, self.parser.should_keep_alive(), length)

    def _answer(self, status: int, headers: dict[str, str], body: bytes, keep_alive: bool,
                length: str | None = None) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if status not in (204, 304):
            lines.append(f"content-length: {length if length is not None else len(body)}")
        if not keep_alive:
            lines.append("connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        # one write per response: a separate write for the head costs a syscall and a wake-up more
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        if not keep_alive:
            self.transport.close()


class _TooLarge(Exception):
    pass


class Compactor:
    """Compacts the log's segments on the store's own event loop, a step at a time (requests are
    served between steps), and never while a backup holds retention (deploy/broker_retention.py)."""

    def __init__(self, store: DiskStore, checkpoint: Path | None, every_s: float = 5.0) -> None:
        self.store, self.checkpoint, self.every_s = store, checkpoint, every_s

    def held(self) -> bool:
        if self.checkpoint is None:
            return False
        from deploy.broker_retention import held
        return held(self.checkpoint)

    async def run_once(self) -> int:
        """Compact what is compactable; returns the segments removed. A hold stops it between steps
        (the copies made so far stay valid: the segment they came from stays too)."""
        done = 0
        for sid in self.store.compactable():
            if self.held():
                return done
            steps = self.store.compact_steps(sid)
            for _ in steps:
                if self.held():
                    steps.close()
                    return done
                await asyncio.sleep(0)
            done += 1
        return done

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.run_once()
            except Exception:  # noqa: BLE001 - never take the store down; try again next round
                log.exception("compaction failed")


async def serve(store: DiskStore, port: int, stats: RequestStats | None = None,
                checkpoint: Path | None = None, keep_seconds: float = 600.0, max_body: int = MAX_BODY) -> None:
    """Serve `store` on 127.0.0.1:`port` until cancelled, with its retention and compaction."""
    loop = asyncio.get_running_loop()
    app = S3App(store, stats)
    server = await loop.create_server(lambda: _Connection(app, max_body), "127.0.0.1", port, backlog=256)
    tasks = [loop.create_task(Compactor(store, checkpoint).run())]
    if checkpoint is not None:
        from deploy.broker_retention import Retention
        # on the server's own loop: a sweep's deletes never interleave with a request
        tasks.append(loop.create_task(Retention(store, checkpoint, keep_seconds).run()))
    if stats is not None:
        tasks.append(loop.create_task(stats.run()))
    try:
        async with server:
            await server.serve_forever()
    finally:
        for t in tasks:
            t.cancel()


def main(argv: list[str] | None = None) -> None:
    """`python -m deploy.objectstore --root DIR --port N`: serve DIR on 127.0.0.1:N."""
    p = argparse.ArgumentParser(prog="python -m deploy.objectstore", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--checkpoint", type=Path, help="the job's checkpoint: consumed gps.reports objects are "
                                                   "deleted after --keep-seconds (deploy/broker_retention.py)")
    p.add_argument("--keep-seconds", type=float, default=600.0)
    p.add_argument("--stats-every", type=float, default=60.0, help="log request counts every N seconds")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from fencing.config import TUNING
    store = DiskStore(args.root, fsync=TUNING.objectstore_fsync)
    import uvloop
    uvloop.run(serve(store, args.port, RequestStats(args.stats_every), args.checkpoint, args.keep_seconds))


if __name__ == "__main__":
    main()
