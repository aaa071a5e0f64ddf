"""The fence and device indexes of a farm's event log (fencing.model.event_index) on a Redis Cluster of
its own: written with the events (a replay adds nothing twice, an older job epoch writes nothing), dropped
with them by retention, built once for a log written before they existed; listings through them equal
the whole-log scan they replace on a mix of filters, ties and page sizes, and a rare fence's listing
reads its own events only."""
from __future__ import annotations

import os
import random

import orjson
import pytest

from api.events import list_events
from fencing.model import event_index, keys
from fencing.stream.retention import trim_events
from fencing.stream.sinks import event_log

from tests.redis_kit import own_cluster, take_over

PORT = 13221 + int(os.environ.get("HERDFENCE_TEST_PORT_OFFSET", "0"))   # bus ports 23221-23223
T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    with own_cluster(tmp_path_factory.mktemp("evindex-home"), PORT) as rc:
        yield rc


def _event(farm: str, n: int, fence: str | None, device: str, ts: int) -> dict:
    return {"event_id": f"{farm}-e{n}", "type": "enter" if n % 2 else "exit", "farm_id": farm,
            "device_id": device, "fence_id": fence, "ts": ts, "lat": 47.0, "lon": 8.5}


def _mixed(farm: str, count: int, seed: int = 7) -> list[dict]:
    """A busy fence, a rare one, fence-less (silent) events, many devices, and many events on the same
    millisecond (ties ordered by id in the log)."""
    rnd = random.Random(seed)
    out = []
    for n in range(count):
        fence = rnd.choice(["busy"] * 20 + ["quiet"] * 3 + [None]) if n % 97 else "rare"
        out.append(_event(farm, n, fence, f"cow-{rnd.randrange(12)}", T0 + rnd.randrange(count // 4) * 1000))
    return out


def _old_scan(redis, farm: str, *, fence_id, device_id, since_ms, limit) -> list[dict]:
    """The listing as it was before the indexes: the whole log in time order, filtered in Python."""
    if since_ms is None:
        ids = redis.zrevrangebyscore(keys.events(farm), "+inf", "-inf")
    else:
        ids = redis.zrangebyscore(keys.events(farm), since_ms, "+inf")
    out = []
    for raw in redis.hmget(keys.event_data(farm), ids) if ids else []:
        event = orjson.loads(raw)
        if (fence_id is None or event["fence_id"] == fence_id) and \
           (device_id is None or event["device_id"] == device_id):
            out.append(event)
    out = out[:limit]
    return out if since_ms is not None else out[::-1]


FILTERS = [{"fence_id": f, "device_id": d, "since_ms": s, "limit": n}
           for f in (None, "busy", "quiet", "rare", "none-such", "")
           for d in (None, "cow-3", "cow-11", "nobody")
           for s in (None, T0, T0 + 300_000)
           for n in (1, 7, 100, 10_000)]


def _index(redis, key: str) -> list[tuple[str, float]]:
    return redis.zrange(key, 0, -1, withscores=True)


def _expected_index(events: list[dict], field: str, value: str) -> list[tuple[str, float]]:
    return sorted(((e["event_id"], float(e["ts"])) for e in events if e[field] == value),
                  key=lambda p: (p[1], p[0]))


def test_listings_equal_the_whole_log_scan_on_a_mix_of_filters(redis):
    farm = "idx-mix"
    events = _mixed(farm, 3000)
    event_log(redis).add(events)
    for params in FILTERS:
        assert list_events(redis, farm, **params) == _old_scan(redis, farm, **params), params


@pytest.mark.parametrize("page", [1, 2, 5])
def test_small_pages_keep_ties_in_order(redis, page):
    """Pages that end inside a run of events of the same millisecond resume after the last one read."""
    farm = f"idx-ties-{page}"
    events = [_event(farm, n, "busy" if n % 3 else "rare", f"cow-{n % 4}", T0 + (n // 10) * 1000)
              for n in range(60)]
    event_log(redis).add(events)
    for fence, device, forward in [(None, None, True), (None, None, False), ("busy", None, True),
                                   ("rare", "cow-1", False), ("busy", "cow-2", True)]:
        got = [orjson.loads(raw)["event_id"] for _, raw in event_index.scan(
            redis, farm, fence_id=fence, device_id=device, forward=forward, page=page)]
        want = [e["event_id"] for e in _old_scan(redis, farm, fence_id=fence, device_id=device,
                                                 since_ms=T0 if forward else None, limit=1000)]
        assert got == (want if forward else want[::-1]), (fence, device, forward)


def test_indexes_are_written_once_and_fenced_like_the_log(redis):
    farm = "idx-once"
    events = _mixed(farm, 500, seed=3)
    node = ("127.0.0.1", PORT)
    old = take_over(redis, node, 4, "evindex")
    new = take_over(redis, node, 5, "evindex")
    log = event_log(new)
    assert len(log.add(events)) == len(events)
    assert log.add(events + events[:10]) == []                          # a replayed batch
    assert _index(redis, keys.fence_events(farm, "busy")) == _expected_index(events, "fence_id", "busy")
    assert _index(redis, keys.device_events(farm, "cow-3")) == _expected_index(events, "device_id", "cow-3")
    fenced = _event(farm, 9999, "rare", "cow-3", T0)
    with pytest.raises(Exception, match="FENCED"):
        event_log(old).add([fenced])                                    # a newer job (epoch 5) took over
    assert f"{farm}-e9999" not in dict(_index(redis, keys.fence_events(farm, "rare")))
    assert f"{farm}-e9999" not in dict(_index(redis, keys.device_events(farm, "cow-3")))
    silent = [e for e in events if e["fence_id"] is None]
    assert silent and all(e["event_id"] in dict(_index(redis, keys.device_events(farm, e["device_id"])))
                          for e in silent)


def test_retention_drops_events_from_their_indexes(redis):
    farm = "idx-trim"
    redis.sadd(keys.FARMS, farm)
    events = _mixed(farm, 2000, seed=11)
    event_log(redis).add(events)
    cutoff = T0 + 250_000
    kept = [e for e in events if e["ts"] >= cutoff]
    assert trim_events(redis, cutoff, per_call=97) == len(events) - len(kept)    # many rounds
    for fence in ("busy", "quiet", "rare"):
        assert _index(redis, keys.fence_events(farm, fence)) == _expected_index(kept, "fence_id", fence)
    for device in {e["device_id"] for e in events}:
        assert _index(redis, keys.device_events(farm, device)) == _expected_index(kept, "device_id", device)
    everything = T0 + 10**9
    assert trim_events(redis, everything) == len(kept)
    assert redis.keys(f"evfence:{{{farm}}}:*") == [] and redis.keys(f"evdev:{{{farm}}}:*") == []
    assert event_log(redis).add(kept[:5]) != []      # gone from the log: a replay writes them again


def test_a_log_written_before_the_indexes_is_indexed_on_its_first_filtered_listing(redis):
    farm = "idx-legacy"
    events = _mixed(farm, 4500, seed=5)
    for start in range(0, len(events), 1000):        # the log as the writer left it without indexes
        part = events[start:start + 1000]
        redis.hset(keys.event_data(farm), mapping={e["event_id"]: orjson.dumps(e) for e in part})
        redis.zadd(keys.events(farm), {e["event_id"]: e["ts"] for e in part})
    assert not redis.exists(keys.events_indexed(farm))
    params = {"fence_id": "rare", "device_id": None, "since_ms": None, "limit": 100}
    assert list_events(redis, farm, **params) == _old_scan(redis, farm, **params) != []
    assert redis.exists(keys.events_indexed(farm))
    assert _index(redis, keys.fence_events(farm, "busy")) == _expected_index(events, "fence_id", "busy")
    for params in FILTERS[::7]:
        assert list_events(redis, farm, **params) == _old_scan(redis, farm, **params), params


def test_the_backfill_indexes_no_event_a_trim_dropped_meanwhile(redis):
    farm = "idx-race"
    [event] = [_event(farm, 1, "rare", "cow-1", T0)]
    redis.hset(keys.event_data(farm), event["event_id"], orjson.dumps(event))
    redis.zadd(keys.events(farm), {event["event_id"]: event["ts"]})
    [read] = list(event_index.scan(redis, farm, forward=False))       # the backfill read it ...
    redis.sadd(keys.FARMS, farm)
    assert trim_events(redis, T0 + 1) == 1                            # ... a trim dropped it ...
    assert event_index.index_events(redis, farm, [read]) == 0          # ... so it indexes nothing
    assert not redis.exists(keys.fence_events(farm, "rare"), keys.device_events(farm, "cow-1"))


def _node_of(redis, farm: str):
    return redis.get_node_from_key(keys.events(farm)).redis_connection


def _calls(node, command: str) -> int:
    return int(node.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_rare_fence_listing_reads_its_own_events_only(redis):
    """20,000 events of a busy fence, 4 of a rare one: the rare fence's listing runs one index range
    and one HMGET of 4 ids on the farm's node (the whole-log scan ran an HMGET per 2,000 events)."""
    farm = "idx-rare"
    events = [_event(farm, n, "rare" if n % 5000 == 17 else "busy", f"cow-{n % 50}", T0 + n * 10)
              for n in range(20_000)]
    log = event_log(redis)
    for start in range(0, len(events), 2000):
        log.add(events[start:start + 2000])
    event_index.ensure_indexed(redis, farm)
    node = _node_of(redis, farm)
    node.config_resetstat()
    out_before = int(node.info("stats")["total_net_output_bytes"])
    found = list_events(redis, farm, fence_id="rare", device_id=None, since_ms=None, limit=100)
    assert [e["event_id"] for e in found] == [f"{farm}-e{n}" for n in (17, 5017, 10017, 15017)]
    assert _calls(node, "hmget") == 1 and _calls(node, "zrevrangebyscore") == 1
    assert _calls(node, "hgetall") == _calls(node, "zrange") == _calls(node, "hscan") == 0
    sent = int(node.info("stats")["total_net_output_bytes"]) - out_before
    assert sent < 20_000, sent        # the 4 events and the INFO replies; the log is ~3 MB
