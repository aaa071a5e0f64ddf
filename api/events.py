"""Fence events of a farm: the filtered listing (the live stream is api/event_hub.py)."""
from __future__ import annotations

import orjson

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
