"""API workers cache "who is inside" answers and secrets (api/answers.py, api/auth.py); the cache must
never show a farmer something the herd has already left behind. Every check asks several times over
fresh connections, so both uvicorn workers answer and both caches are exercised."""
from __future__ import annotations

import httpx

from tests.conftest import wait_for
from tests.farmkit import Farm, square

INSIDE = (8.505, 47.005)
INSIDE_MOVED = (8.507, 47.003)
OUTSIDE = (8.505, 47.05)
ASKS = 8


def _ask(farm: Farm, method: str, path: str, json: dict | None = None, key: str | None = None) -> list[httpx.Response]:
    """The same request on ASKS new connections (each may land on either worker)."""
    out = []
    for _ in range(ASKS):
        with farm.stack.client(key or farm.key) as fresh:
            out.append(fresh.request(method, path, json=json))
    return out


def _members(farm: Farm, fence_id: str) -> list[list[tuple]]:
    answers = _ask(farm, "GET", f"/v1/fences/{fence_id}/devices")
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    return [[(d["device_id"], d["lon"], d["lat"]) for d in r.json()["devices"]] for r in answers]


def _within(farm: Farm, area: dict) -> list[list[tuple]]:
    answers = _ask(farm, "POST", "/v1/query/within", json={"geometry": area})
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    return [[(d["device_id"], d["lon"], d["lat"]) for d in r.json()["devices"]] for r in answers]


def test_cached_answers_follow_moves_exits_and_deletes(stack):
    farm = Farm(stack, "cache farm")
    area = square(8.50, 47.00)
    fence_id = farm.fence(area)
    token = farm.device("cache-cow")
    farm.report("cache-cow", INSIDE, INSIDE, token=token)
    farm.wait_events(1, device_id="cache-cow")
    here = [("cache-cow", *INSIDE)]
    assert _members(farm, fence_id) == [here] * ASKS          # asked enough times to be cached
    assert _within(farm, area) == [here] * ASKS

    # a move inside the fence makes no event, but the answers must show the new position
    [ts] = farm.report("cache-cow", INSIDE_MOVED, token=token)
    farm.wait_seen("cache-cow", ts)
    moved = [("cache-cow", *INSIDE_MOVED)]
    assert _members(farm, fence_id) == [moved] * ASKS
    assert _within(farm, area) == [moved] * ASKS

    farm.report("cache-cow", OUTSIDE, OUTSIDE, token=token)
    farm.wait_events(2, device_id="cache-cow")
    assert _members(farm, fence_id) == [[]] * ASKS
    assert _within(farm, area) == [[]] * ASKS

    assert farm.api.delete(f"/v1/fences/{fence_id}").status_code == 204
    assert [r.status_code for r in _ask(farm, "GET", f"/v1/fences/{fence_id}/devices")] == [404] * ASKS


def test_cached_answers_are_per_farm(stack):
    """Two farms asking the same area and the same fence id path never share a cached answer."""
    mine, theirs = Farm(stack, "cache farm a"), Farm(stack, "cache farm b")
    area = square(8.60, 47.10)
    fence_id = mine.fence(area)
    token = mine.device("private-cow")
    mine.report("private-cow", (8.605, 47.105), (8.605, 47.105), token=token)
    mine.wait_events(1, device_id="private-cow")
    assert _within(mine, area) == [[("private-cow", 8.605, 47.105)]] * ASKS
    assert _within(theirs, area) == [[]] * ASKS
    assert [r.status_code for r in _ask(theirs, "GET", f"/v1/fences/{fence_id}/devices")] == [404] * ASKS


def test_replaced_device_token_stops_working_at_once(stack):
    farm = Farm(stack, "token farm")
    old = farm.device("token-cow")
    report = {"reports": [{"device_id": "token-cow", "ts": farm.base_ts, "lon": 8.5, "lat": 47.0}]}
    assert [r.status_code for r in _ask(farm, "POST", "/v1/reports", json=report, key=old)] == [202] * ASKS
    new = farm.device("token-cow")          # registering again replaces the token
    assert [r.status_code for r in _ask(farm, "POST", "/v1/reports", json=report, key=old)] == [401] * ASKS
    assert [r.status_code for r in _ask(farm, "POST", "/v1/reports", json=report, key=new)] == [202] * ASKS


def test_metrics_count_answer_cache_hits(stack):
    farm = Farm(stack, "metrics cache farm")
    fence_id = farm.fence(square(8.70, 47.20))
    for _ in range(5):
        assert farm.api.get(f"/v1/fences/{fence_id}/devices").status_code == 200   # one connection: one worker
    text = wait_for(lambda: (lambda t: t if "herdfence_api_answer_cache_hits_total" in t else None)(
        farm.api.get("/metrics").text), timeout=10, what="cache metrics")
    hits = [float(line.split()[-1]) for line in text.splitlines()
            if line.startswith("herdfence_api_answer_cache_hits_total")]
    assert hits and hits[0] >= 1, text
