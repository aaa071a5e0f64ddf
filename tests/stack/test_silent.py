"""SILENT events from the last-seen index, on the real Redis Cluster of the test stack."""
from __future__ import annotations

import orjson

from fencing.model import keys
from fencing.stream.silent import SEEN_STEP_MS, forget, silent_events
from tests.farmkit import Farm


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


def test_a_stale_index_entry_is_checked_against_the_position_and_catches_up(stack):
    redis = stack.redis
    farm = "farm-silent-stale"
    redis.sadd(keys.FARMS, farm)
    redis.hset(keys.positions(farm), mapping={
        "grazing": orjson.dumps({"lat": 47.0, "lon": 8.5, "ts": 3_000, "fences": [], "rx": 95_000}),
        "dead": orjson.dumps({"lat": 47.0, "lon": 8.5, "ts": 4_000, "fences": [], "rx": 20_000})})
    redis.zadd(keys.last_seen(farm), {"grazing": 10_000, "dead": 10_000})    # older than their arrivals
    found = [e for e in silent_events(redis, now_ms=100_000, silent_after_ms=60_000) if e["farm_id"] == farm]
    assert [(e["device_id"], e["ts"]) for e in found] == [("dead", 80_000)]   # silent from its last arrival
    assert redis.zscore(keys.last_seen(farm), "grazing") == 95_000


def test_the_job_rewrites_the_index_lazily_and_positions_carry_the_arrival(stack):
    farm = Farm(stack)
    farm.device("cow-lazy")
    farm.wait_seen("cow-lazy", farm.report("cow-lazy", (8.5, 47.0))[-1])
    indexed = stack.redis.zscore(keys.last_seen(farm.farm_id), "cow-lazy")
    farm.wait_seen("cow-lazy", farm.report("cow-lazy", (8.501, 47.0))[-1])
    arrived = orjson.loads(stack.redis.hget(keys.positions(farm.farm_id), "cow-lazy"))["rx"]
    now_indexed = stack.redis.zscore(keys.last_seen(farm.farm_id), "cow-lazy")
    assert indexed and arrived > indexed
    # rewritten only once the entry is SEEN_STEP_MS old (the test stack's silence: the default hour)
    assert now_indexed == (arrived if arrived - indexed >= SEEN_STEP_MS else indexed)


def test_the_map_page_flags_silence_at_the_servers_threshold_not_its_own(stack):
    """The page shows a collar as silent after HERDFENCE_SILENT_SECONDS, like the events (a collar that
    reports every 15 minutes is not flagged between its fixes)."""
    import re

    from fencing.config import load_tuning
    page = stack.client(None).get("/").text
    found = re.search(r'<meta name="herdfence-silent-seconds" content="([0-9.]+)">', page)
    assert found, "the page carries the server's silence threshold"
    assert float(found.group(1)) == load_tuning(stack.env).silent_seconds
