"""JSON bytes that are kept, made compact.

orjson (3.13 here) serializes into a fresh ~4 KB allocation and shrinks it in place: a result that
is kept pins its 4 KB of the heap, so a million of them (a batch's device states, positions or
events, a benchmark's reports) hold ~4 GB for ~150 MB of JSON, and the allocator slows down with
them (measured: 4,117 B and 10.8 µs per kept 150-byte record, 218 B and 4.6 µs copied; issue 23).
`dumps` copies the result into an object of its own size; use it for whatever outlives the next
call, plain orjson.dumps for what is written or parsed at once."""
from __future__ import annotations

import orjson


def dumps(obj, option: int | None = None) -> bytes:
    out = orjson.dumps(obj) if option is None else orjson.dumps(obj, option=option)
    return bytes(memoryview(out))
