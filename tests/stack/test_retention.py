"""Event retention on the test stack's Redis Cluster: events older than the cutoff leave both the
farm's event hash and its time index, on every master and in as many rounds as a farm needs; newer
ones stay and are still deduplicated by id."""
from __future__ import annotations

import secrets

from fencing.model import keys
from fencing.stream.retention import trim_events
from fencing.stream.sinks import event_log

CUTOFF = 1_700_000_000_000


def _events(farm: str, first: int, count: int, ts0: int) -> list[dict]:
    return [{"event_id": f"rt-{farm}-{i}", "type": "enter", "farm_id": farm, "device_id": f"cow-{i}",
             "fence_id": "f-1", "ts": ts0 + i, "lat": 47.0, "lon": 8.5} for i in range(first, first + count)]


def test_old_events_leave_hash_and_index_new_ones_stay(stack):
    redis = stack.redis
    farms = [f"retfarm-{secrets.token_hex(4)}" for _ in range(12)]      # spread over every master
    redis.sadd(keys.FARMS, *farms)
    log = event_log(redis)
    kept: dict[str, list[dict]] = {}
    for n, farm in enumerate(farms):
        old = _events(farm, 0, 7 + n, CUTOFF - 10_000)           # all before the cutoff
        kept[farm] = _events(farm, 100, 3, CUTOFF)               # at and after it
        assert len(log.add(old + kept[farm])) == len(old) + 3

    dropped = trim_events(redis, CUTOFF, per_call=5)             # several rounds for every farm
    assert dropped == sum(7 + n for n in range(len(farms)))
    for farm in farms:
        ids = sorted(e["event_id"] for e in kept[farm])
        assert sorted(redis.hkeys(keys.event_data(farm))) == ids
        assert sorted(redis.zrange(keys.events(farm), 0, -1)) == ids
    assert log.add([e for events in kept.values() for e in events]) == []     # still deduplicated
    assert trim_events(redis, CUTOFF) == 0
