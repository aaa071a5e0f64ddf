"""GET /v1/time-in-fence on the shared stack: stays computed from the job's real ENTER/EXIT events,
clipped to the period (an animal inside at the start counted from it), farm-scoped and validated."""
from __future__ import annotations

import time
from datetime import datetime

import pytest

from fencing.model.timeutil import iso
from tests.farmkit import Farm, square

pytestmark = pytest.mark.stack


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


@pytest.fixture(scope="module")
def grazed(stack):
    """cow-t1 enters paddock A, leaves it, comes back and stays; cow-t2 never enters."""
    farm = Farm(stack, "time in paddock")
    fence_a = farm.fence(square(8.50, 47.0), "A")
    fence_b = farm.fence(square(8.53, 47.0), "B")
    farm.device("cow-t1")
    farm.device("cow-t2")
    base = int(time.time() * 1000) - 2 * 3_600_000
    inside, outside = (8.505, 47.005), (8.52, 47.005)
    track = [(0, inside), (10, inside), (600, outside), (610, outside), (1200, inside), (1210, inside)]
    resp = farm.api.post("/v1/reports", json={"reports": [
        *({"device_id": "cow-t1", "ts": base + s * 1000, "lon": p[0], "lat": p[1]} for s, p in track),
        {"device_id": "cow-t2", "ts": base, "lon": outside[0], "lat": outside[1]}]})
    assert resp.status_code == 202, resp.text
    events = farm.wait_events(3, device_id="cow-t1")
    assert [e["type"] for e in events] == ["enter", "exit", "enter"], events
    return farm, fence_a, fence_b, base, [_ms(e["ts"]) for e in events]


def test_stays_over_a_period_come_from_enter_exit_pairs(grazed):
    farm, fence_a, _fence_b, base, (enter1, exit1, enter2) = grazed
    t0 = time.time() * 1000
    res = farm.api.get("/v1/time-in-fence", params={"from": iso(base - 60_000)})
    t1 = time.time() * 1000
    assert res.status_code == 200, res.text
    body = res.json()
    [row] = [r for r in body["items"] if r["device_id"] == "cow-t1"]
    assert row["fence_id"] == fence_a and row["stays"] == 2 and row["inside_now"] is True
    low = (exit1 - enter1) + (t0 - enter2)
    assert low / 1000 - 1 <= row["seconds"] <= ((exit1 - enter1) + (t1 - enter2)) / 1000 + 1, (row, low)
    assert all(r["device_id"] != "cow-t2" for r in body["items"]), "never inside: no row"
    assert set(body) == {"from", "to", "seconds", "items"}


def test_an_animal_inside_at_the_start_is_counted_from_the_start(grazed):
    farm, fence_a, _fence_b, _base, (enter1, exit1, enter2) = grazed
    start = (enter1 + exit1) // 2
    res = farm.api.get("/v1/time-in-fence", params={"from": start, "to": iso(enter2 - 1000),
                                                    "fence_id": fence_a, "device_id": "cow-t1"})
    assert res.status_code == 200, res.text
    [row] = res.json()["items"]
    assert row["seconds"] == pytest.approx((exit1 - start) / 1000, abs=0.01)
    assert row["stays"] == 1 and row["inside_now"] is False
    # a period after the exit and before the return: nothing
    empty = farm.api.get("/v1/time-in-fence", params={"from": exit1 + 1, "to": enter2 - 1, "device_id": "cow-t1"})
    assert empty.status_code == 200 and empty.json()["items"] == []


def test_other_farms_ids_are_not_found_and_bad_params_name_the_field(stack, grazed):
    farm, fence_a, fence_b, _base, _ = grazed
    assert farm.api.get("/v1/time-in-fence", params={"fence_id": fence_b}).json()["items"] == []
    other = Farm(stack, "neighbour")
    assert other.api.get("/v1/time-in-fence", params={"fence_id": fence_a}).status_code == 404
    assert other.api.get("/v1/time-in-fence", params={"device_id": "cow-t1"}).status_code == 404
    for params, field in [({"from": "yesterday-ish"}, "from"), ({"to": "soon"}, "to"),
                          ({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "from"),
                          ({"from": "2020-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "from"),
                          ({"from": "99999999999999999"}, "from"), ({"to": "-" + "9" * 30}, "to"),
                          ({"from": "nan"}, "from"), ({"fence_id": "f" * 300}, "fence_id")]:
        res = farm.api.get("/v1/time-in-fence", params=params)
        assert res.status_code == 422 and field in str(res.json()["detail"]), (params, res.text)
    assert stack.client(None).get("/v1/time-in-fence").status_code == 401


def test_documented_in_openapi_with_its_response_model(stack):
    spec = stack.client(None).get("/openapi.json").json()
    op = spec["paths"]["/v1/time-in-fence"]["get"]
    assert {p["name"] for p in op["parameters"]} >= {"from", "to", "fence_id", "device_id"}
    ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
    schema = spec["components"]["schemas"][ref]
    assert set(schema["properties"]) == {"from", "to", "seconds", "items"}
