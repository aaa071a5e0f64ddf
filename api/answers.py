"""The two hot pull queries, rendered to JSON bytes and cached per API worker until the farm changes.

"Who is inside this paddock?" is asked far more often than the answer changes: a collar reports every
few minutes, dashboards poll every few seconds. So a worker keeps each rendered answer until a change
notice for its farm arrives (fencing/model/notify.py: the job's tasks publish the farms they wrote after each
micro-batch, fence edits publish their farm). Answers are cached only while the worker hears notices,
and a per-farm generation stops an answer computed before a notice from being stored after it.
A client that sends `Cache-Control: no-cache` gets an answer read from Redis for its request.
"""
from __future__ import annotations

from collections import defaultdict

import orjson
import shapely

from api import invalidation, live, metrics
from fencing.model import notify
from fencing.model.geometry import parse_fence_geometry
from fencing.model.timeutil import iso

MAX_ENTRIES = 50_000          # per worker; past it the cache starts over
MAX_BYTES = 64 * 1024 * 1024  # per worker, keys and answers; likewise

_answers: dict[str, dict[tuple[str, bytes | str], bytes]] = {}
_generation: defaultdict[str, int] = defaultdict(int)
_stats = {"entries": 0, "bytes": 0}     # kept as counts, not summed per store; hits and misses: api/metrics.py


def _drop(farms: list[str] | None) -> None:
    for farm_id in list(_answers) if farms is None else farms:
        dropped = _answers.pop(farm_id, {})
        _stats["entries"] -= len(dropped)
        _stats["bytes"] -= sum(_size(k, v) for k, v in dropped.items())
        _generation[farm_id] += 1
    _publish()


def _publish() -> None:
    metrics.CACHE_ENTRIES.set(_stats["entries"])
    metrics.CACHE_BYTES.set(_stats["bytes"])


def _size(key: tuple, body: bytes) -> int:
    return len(body) + sum(len(part) for part in key) + 64


invalidation.on(notify.LIVE, _drop)


def wants_fresh(cache_control: str) -> bool:
    return "no-cache" in cache_control.lower()


def _get(farm_id: str, key, fresh: bool) -> bytes | None:
    body = _answers.get(farm_id, {}).get(key) if invalidation.listening() and not fresh else None
    metrics.count(metrics.CACHE_HITS if body is not None else metrics.CACHE_MISSES)
    return body


def _put(farm_id: str, key, body: bytes, generation: int) -> None:
    if not invalidation.listening() or _generation[farm_id] != generation:
        return   # a notice came while we read: this answer may already be stale
    if _stats["entries"] >= MAX_ENTRIES or _stats["bytes"] + _size(key, body) > MAX_BYTES:
        _answers.clear()
        _stats["entries"] = _stats["bytes"] = 0
    farm = _answers.setdefault(farm_id, {})
    if key in farm:
        _stats["bytes"] -= _size(key, farm[key])
    _stats["entries"] += key not in farm
    _stats["bytes"] += _size(key, body)
    farm[key] = body
    _publish()


async def fence_devices(aredis, farm_id: str, fence_id: str, fresh: bool = False) -> bytes | None:
    """GET /v1/fences/{fence_id}/devices as JSON bytes; None when the farm has no such fence.
    `fresh`: the client sent `Cache-Control: no-cache` — read Redis whatever the cache holds."""
    key = ("fence", fence_id)
    body = _get(farm_id, key, fresh)
    if body is None:
        generation = _generation[farm_id]
        members = await live.fence_members(aredis, farm_id, fence_id)
        if members is None:
            return None
        body = orjson.dumps({"fence_id": fence_id, "devices": members.devices})
        if not members.windowed:         # a windowed fence's answer changes with the clock: not cached
            _put(farm_id, key, body, generation)
    return body


async def devices_within(aredis, farm_id: str, geometry, fresh: bool = False) -> bytes:
    """POST /v1/query/within as JSON bytes; FenceError when the geometry is not a valid area."""
    area = parse_fence_geometry(geometry)
    # keyed on the parsed geometry: unknown members, spacing or key order cost no cache space
    key = ("within", shapely.to_wkb(area))
    body = _get(farm_id, key, fresh)
    if body is None:
        generation = _generation[farm_id]
        found = await live.devices_within(aredis, farm_id, area)
        body = orjson.dumps({"fence_id": None, "devices": [
            {"device_id": d, "lat": p["lat"], "lon": p["lon"], "ts": iso(p["ts"]), "inside_since": None}
            for d, p in sorted(found.items())]})
        _put(farm_id, key, body, generation)
    return body
