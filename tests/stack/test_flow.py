"""The contract's flow end to end on the embedded stack: report → enter → query → exit → query,
event semantics (debounce, holes, multipolygons, overlaps, out-of-order), fence edits, tenancy."""
from __future__ import annotations

from tests.farmkit import Farm, square

INSIDE = (8.505, 47.005)
INSIDE2 = (8.506, 47.006)
OUTSIDE = (8.505, 47.05)


def test_enter_query_exit_query(stack):
    farm = Farm(stack)
    fence_id = farm.fence(square(8.50, 47.00))
    token = farm.device("cow-1")
    farm.report("cow-1", INSIDE, INSIDE2, token=token)
    [enter] = farm.wait_events(1, device_id="cow-1")
    assert (enter["type"], enter["fence_id"], enter["device_id"]) == ("enter", fence_id, "cow-1")

    members = farm.api.get(f"/v1/fences/{fence_id}/devices").json()
    assert [d["device_id"] for d in members["devices"]] == ["cow-1"]
    assert members["devices"][0]["inside_since"] == enter["ts"]
    device = farm.api.get("/v1/devices/cow-1").json()
    assert device["fences"] == [fence_id] and device["lat"] == INSIDE2[1] and device["battery"] == 80
    within = farm.api.post("/v1/query/within", json={"geometry": square(8.50, 47.00)}).json()
    assert [d["device_id"] for d in within["devices"]] == ["cow-1"]

    farm.report("cow-1", OUTSIDE, OUTSIDE, token=token)
    events = farm.wait_events(2, device_id="cow-1")
    assert [e["type"] for e in events] == ["enter", "exit"]
    assert farm.api.get(f"/v1/fences/{fence_id}/devices").json()["devices"] == []
    assert farm.api.post("/v1/query/within", json={"geometry": square(8.50, 47.00)}).json()["devices"] == []
    positions = farm.api.get("/v1/positions", params={"bbox": "8.4,47.0,8.6,47.1"}).json()
    assert [f["id"] for f in positions["features"]] == ["cow-1"]
    assert positions["features"][0]["geometry"]["coordinates"] == list(OUTSIDE)


def test_single_stray_report_is_jitter(stack):
    farm = Farm(stack)
    fence_id = farm.fence(square(8.50, 47.00))
    farm.device("cow-j")
    farm.report("cow-j", OUTSIDE, INSIDE, OUTSIDE, OUTSIDE)
    stamps = farm.report("cow-j", OUTSIDE)
    farm.wait_seen("cow-j", stamps[-1])
    assert farm.events(device_id="cow-j") == []
    assert farm.api.get(f"/v1/fences/{fence_id}/devices").json()["devices"] == []


def test_hole_multipolygon_and_overlaps(stack):
    farm = Farm(stack)
    with_hole = {"type": "Polygon", "coordinates": [
        [[8.50, 47.00], [8.52, 47.00], [8.52, 47.02], [8.50, 47.02], [8.50, 47.00]],
        [[8.505, 47.005], [8.515, 47.005], [8.515, 47.015], [8.505, 47.015], [8.505, 47.005]]]}
    holed = farm.fence(with_hole, "holed")
    multi = farm.fence({"type": "MultiPolygon", "coordinates": [square(8.60, 47.00)["coordinates"],
                                                                square(8.70, 47.00)["coordinates"]]}, "multi")
    overlaps = [farm.fence(square(8.80 + i * 0.001, 47.00), f"o{i}") for i in range(3)]
    for device in ("in-hole", "part-a", "part-b", "overlap"):
        farm.device(device)
    farm.report("in-hole", (8.51, 47.01), (8.511, 47.011))
    farm.report("part-a", (8.605, 47.005), (8.606, 47.006))
    farm.report("part-b", (8.705, 47.005), (8.706, 47.006))
    farm.report("overlap", (8.8055, 47.005), (8.8056, 47.006))
    farm.wait_events(5)
    stamps = farm.report("in-hole", (8.512, 47.012))
    farm.wait_seen("in-hole", stamps[-1])
    events = farm.events()
    assert not [e for e in events if e["device_id"] == "in-hole"]
    assert {(e["device_id"], e["fence_id"]) for e in events if e["type"] == "enter"} == {
        ("part-a", multi), ("part-b", multi), *(("overlap", f) for f in overlaps)}
    assert len(events) == 5
    assert farm.api.get(f"/v1/fences/{holed}/devices").json()["devices"] == []


def test_out_of_order_report_does_not_rewind(stack):
    farm = Farm(stack)
    farm.fence(square(8.50, 47.00))
    farm.device("cow-o")
    stamps = farm.report("cow-o", INSIDE, INSIDE2)
    farm.wait_events(1, device_id="cow-o")
    old = stamps[0] - 5_000   # older than everything processed: must not move the device or make events
    resp = farm.api.post("/v1/reports", json={"reports": [
        {"device_id": "cow-o", "ts": old, "lon": OUTSIDE[0], "lat": OUTSIDE[1]},
        {"device_id": "cow-o", "ts": old + 1, "lon": OUTSIDE[0], "lat": OUTSIDE[1]}]})
    assert resp.status_code == 202
    newest = farm.report("cow-o", INSIDE)
    farm.wait_seen("cow-o", newest[-1])
    assert [e["type"] for e in farm.events(device_id="cow-o")] == ["enter"]


def test_fence_delete_and_move(stack):
    farm = Farm(stack)
    moving = farm.fence(square(8.50, 47.00), "moving")
    doomed = farm.fence(square(8.50, 47.00), "doomed")
    farm.device("cow-m")
    farm.report("cow-m", INSIDE, INSIDE2)
    farm.wait_events(2, device_id="cow-m")
    assert farm.api.delete(f"/v1/fences/{doomed}").status_code == 204
    assert farm.api.get(f"/v1/fences/{doomed}").status_code == 404
    moved = farm.api.put(f"/v1/fences/{moving}", json={"type": "Feature", "properties": {"name": "moved"},
                                                         "geometry": square(8.60, 47.00)})
    assert moved.status_code == 200 and moved.json()["properties"]["version"] == 2
    farm.report("cow-m", INSIDE, INSIDE2)      # still where it was: now outside the moved fence
    events = farm.wait_events(3, device_id="cow-m")
    kinds = sorted((e["type"], e["fence_id"]) for e in events)
    assert kinds == sorted([("enter", moving), ("enter", doomed), ("exit", moving)])
    assert farm.api.get(f"/v1/fences/{moving}/devices").json()["devices"] == []


def test_errors_and_tenancy(stack):
    farm, other = Farm(stack, "a"), Farm(stack, "b")
    fence_id = farm.fence(square(8.50, 47.00))
    token = farm.device("cow-t")
    anonymous = stack.client(None)
    assert anonymous.get("/v1/fences").status_code == 401
    assert stack.client("wrong-key").get("/v1/fences").status_code == 401
    assert anonymous.get("/healthz").json() == {"status": "ok"}
    for path in (f"/v1/fences/{fence_id}", f"/v1/fences/{fence_id}/devices", "/v1/devices/cow-t"):
        assert other.api.get(path).status_code == 404, path
    assert other.api.delete(f"/v1/fences/{fence_id}").status_code == 404
    assert other.api.get("/v1/fences").json()["features"] == []
    bowtie = {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}
    resp = farm.api.post("/v1/fences", json={"type": "Feature", "properties": {"name": "x"}, "geometry": bowtie})
    assert resp.status_code == 422 and "self-intersection" in resp.json()["detail"]
    assert farm.api.post("/v1/fences", content=b"{not json", headers={"content-type": "application/json"}).status_code == 422
    resp = stack.client(token).post("/v1/reports", json={"reports": [
        {"device_id": "cow-other", "ts": 1_700_000_000_000, "lat": 47, "lon": 8}]})
    assert resp.status_code == 403
    resp = farm.api.post("/v1/reports", json={"reports": [
        {"device_id": "cow-t", "ts": "2026-01-01T00:00:00Z", "lat": 91, "lon": 8},
        {"device_id": "cow-t", "ts": "2026-01-01T00:00:00Z", "lat": 47, "lon": 8}]})
    assert resp.status_code == 202
    assert resp.json()["accepted"] == 1 and resp.json()["rejected"][0]["index"] == 0
    assert "lat" in resp.json()["rejected"][0]["reason"]
    huge = b'{"reports": [' + b",".join([b'{"device_id":"cow-t","ts":1,"lat":1,"lon":1}'] * 250_000) + b"]}"
    assert farm.api.post("/v1/reports", content=huge, headers={"content-type": "application/json"}).status_code == 413


def test_the_job_keeps_its_heartbeats_without_per_group_loads(stack):
    """A batch with points leaves a heartbeat in Redis without the per-group maps (`Heartbeat.stored`):
    the job's own beat had them, its stored copies do not."""
    from fencing.model.heartbeat import read_heartbeat, recent_heartbeats

    farm = Farm(stack)
    farm.fence(square(8.50, 47.00))
    farm.device("beat-cow")
    farm.report("beat-cow", INSIDE, INSIDE2)
    farm.wait_events(1, device_id="beat-cow")
    beats = [b for b in recent_heartbeats(stack.redis, 200) if b.points] + [read_heartbeat(stack.redis)]
    assert beats[0].points and sum(s.points for s in beats[0].partitions) == beats[0].points
    assert all(not (s.groups or s.route_groups or s.children) for b in beats for s in b.partitions)
