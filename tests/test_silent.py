"""SILENT events from the last-seen index, on the real Redis Cluster of the test stack."""
from __future__ import annotations

import orjson

from fencing import keys
from fencing.silent import forget, silent_events


def test_silent_once_per_silence(stack):
    redis = stack.redis
    farm = "farm-silent-test"
    redis.sadd(keys.FARMS, farm)
    redis.hset(keys.positions(farm), mapping={
        "quiet": orjson.dumps({"lat": 47.0, "lon": 8.5, "ts": 1_000, "fences": ["f-1"]}),
        "busy": orjson.dumps({"lat": 47.0, "lon": 8.5, "ts": 2_000, "fences": []})})
    redis.zadd(keys.last_seen(farm), {"quiet": 10_000, "busy": 95_000})
    found = [e for e in silent_events(redis, now_ms=100_000, silent_after_ms=60_000) if e["farm_id"] == farm]
    assert [(e["device_id"], e["type"], e["fence_id"], e["ts"]) for e in found] == [("quiet", "silent", "f-1", 70_000)]
    forget(redis, found, cutoff=40_000)
    assert [e for e in silent_events(redis, 100_000, 60_000) if e["farm_id"] == farm] == []
    assert redis.zscore(keys.last_seen(farm), "busy") == 95_000
