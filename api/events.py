"""Fence events of a farm: the filtered listing (the live stream is api/event_hub.py)."""
from __future__ import annotations

import orjson

from fencing.model import event_index


def list_events(redis, farm_id: str, *, fence_id: str | None, device_id: str | None,
                since_ms: int | None, limit: int) -> list[dict]:
    """With `since`: the first `limit` matching events at or after it; without: the newest `limit`.
    Either way the answer is ordered oldest first (newest last). A fence or device filter reads that
    fence's or device's index (fencing.model.event_index), not the farm's whole log."""
    forward = since_ms is not None
    found = [orjson.loads(raw) for _, raw in event_index.scan(
        redis, farm_id, fence_id=fence_id, device_id=device_id, forward=forward,
        lo=since_ms if forward else "-inf", want=limit)]
    return found if forward else found[::-1]
