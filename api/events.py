"""Fence events of a farm: filtered listing and the live Server-Sent Events stream."""
from __future__ import annotations

import asyncio

import orjson
from starlette.concurrency import run_in_threadpool

from fencing.model import keys

SCAN_CHUNK = 2000


def list_events(redis, farm_id: str, *, fence_id: str | None, device_id: str | None,
                since_ms: int | None, limit: int) -> list[dict]:
    """With `since`: the first `limit` matching events at or after it; without: the newest `limit`.
    Either way the answer is ordered oldest first (newest last)."""
    zkey, hkey = keys.events(farm_id), keys.event_data(farm_id)

    def matches(event: dict) -> bool:
        return (fence_id is None or event.get("fence_id") == fence_id) and \
               (device_id is None or event.get("device_id") == device_id)

    out: list[dict] = []
    offset = 0
    forward = since_ms is not None
    while len(out) < limit:
        if forward:
            ids = redis.zrangebyscore(zkey, since_ms, "+inf", start=offset, num=SCAN_CHUNK)
        else:
            ids = redis.zrevrangebyscore(zkey, "+inf", "-inf", start=offset, num=SCAN_CHUNK)
        if not ids:
            break
        offset += len(ids)
        for raw in redis.hmget(hkey, ids):
            if raw:
                event = orjson.loads(raw)
                if matches(event):
                    out.append(event)
                    if len(out) == limit:
                        break
    return out if forward else out[::-1]


async def stream(redis, farm_id: str, last_id: str | None, is_disconnected):
    """SSE frames for the farm's new events; `Last-Event-ID` resumes after the last one seen."""
    cursor = last_id or "$"
    if cursor == "$":
        # "$" would race with events written between two reads: pin the current end once.
        newest = await run_in_threadpool(redis.xrevrange, keys.event_stream(farm_id), "+", "-", 1)
        cursor = newest[0][0] if newest else "0-0"
    yield b": connected\n\n"
    while not await is_disconnected():
        try:
            batch = await run_in_threadpool(redis.xread, {keys.event_stream(farm_id): cursor}, 500, 2000)
        except Exception:   # a Redis failover: keep the stream open and retry
            await asyncio.sleep(1)
            continue
        if not batch:
            yield b": keep-alive\n\n"
            continue
        for entry_id, fields in batch[0][1]:
            cursor = entry_id
            yield f"id: {entry_id}\nevent: fence\ndata: {fields['event']}\n\n".encode()
