"""Event listings through their indexes on the embedded stack: a busy paddock with hundreds of events and a
rare one with two, made by the job from reports posted through the API. Every mix of filters (fence,
device, since, limit) answers what a filter of the farm's whole log gives, the rare paddock's index
holds its two events only (what its listing reads), a deleted fence keeps its events listed, and
another farm sees none of them."""
from __future__ import annotations

import time

from fencing.model import keys
from fencing.model.timeutil import to_ms
from tests.farmkit import Farm, square

BUSY_IN, RARE_IN, OUT_NORTH = (8.505, 47.005), (8.605, 47.005), (8.505, 47.05)
RARE_OUT = (8.605, 47.05)
COWS, CROSSINGS = 20, 15          # each cow enters and leaves the busy paddock CROSSINGS times


def _post(farm: Farm, device_id: str, points: list[tuple[float, float]], t0: int) -> None:
    body = {"reports": [{"device_id": device_id, "ts": t0 + i * 1000, "lon": lon, "lat": lat}
                        for i, (lon, lat) in enumerate(points)]}
    resp = farm.api.post("/v1/reports", json=body)
    assert resp.status_code == 202 and resp.json()["accepted"] == len(points), resp.text


def _brute(log: list[dict], *, fence_id=None, device_id=None, since=None, limit=100) -> list[dict]:
    """The listing's answer from the whole log (oldest first): the contract's filters, by hand."""
    found = [e for e in log if (fence_id is None or e["fence_id"] == fence_id)
             and (device_id is None or e["device_id"] == device_id)]
    if since is None:
        return found[-limit:]
    return [e for e in found if to_ms(e["ts"]) >= to_ms(since)][:limit]


def test_filtered_listings_equal_a_filter_of_the_whole_log(stack):
    farm = Farm(stack)
    busy = farm.fence(square(8.50, 47.00), "busy paddock", debounce_reports=1)
    rare = farm.fence(square(8.60, 47.00), "rare paddock", debounce_reports=1)
    t0 = int(time.time() * 1000) - 1_800_000
    for cow in range(COWS):
        farm.device(f"cow-{cow}")
        _post(farm, f"cow-{cow}", [OUT_NORTH] + [BUSY_IN, OUT_NORTH] * CROSSINGS, t0 + cow * 37)
    farm.device("wanderer")
    _post(farm, "wanderer", [RARE_OUT, RARE_IN, RARE_OUT], t0 + 5_000)
    total = COWS * CROSSINGS * 2 + 2
    log = farm.wait_events(total)
    assert len(log) == total and [e for e in log if e["fence_id"] == rare] != []

    middle = log[len(log) // 2]["ts"]
    for fence_id in (None, busy, rare, "no-such-fence"):
        for device_id in (None, "cow-3", "wanderer", "nobody"):
            for since in (None, middle, str(to_ms(log[0]["ts"]))):
                for limit in (1, 7, 100, 10_000):
                    params = {k: v for k, v in (("fence_id", fence_id), ("device_id", device_id),
                                                ("since", since), ("limit", limit)) if v is not None}
                    resp = farm.api.get("/v1/events", params=params)
                    assert resp.status_code == 200, resp.text
                    assert resp.json()["events"] == _brute(log, fence_id=fence_id, device_id=device_id,
                                                           since=since, limit=limit), params

    # what the rare paddock's listing reads: its own two events, not the farm's log
    redis = stack.redis
    assert redis.exists(keys.events_indexed(farm.farm_id))
    assert redis.zcard(keys.fence_events(farm.farm_id, rare)) == 2
    assert redis.zcard(keys.fence_events(farm.farm_id, busy)) == total - 2
    assert redis.zcard(keys.events(farm.farm_id)) == total

    other = Farm(stack, "neighbour")
    assert other.events(fence_id=rare) == [] and other.events(device_id="wanderer") == []

    rare_events = farm.events(fence_id=rare)
    assert farm.api.delete(f"/v1/fences/{rare}").status_code == 204
    assert farm.events(fence_id=rare) == rare_events          # the log keeps a deleted fence's events
