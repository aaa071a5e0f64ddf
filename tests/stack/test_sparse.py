"""Sparse and late fixes, approach warnings and active windows through the API and the job: what
CONTRACT.md promises for fence properties, inferred crossings and late uploads."""
from __future__ import annotations

import time

import pytest

from fencing.model.timeutil import iso, to_ms
from tests.conftest import wait_for
from tests.farmkit import Farm, square

MIN = 60_000
DEG_PER_M_LON = 1 / (111_320.0 * 0.6820)        # at 47° north
DEG_PER_M_LAT = 1 / 110_574.0


def post(farm: Farm, device: str, fixes: list[tuple[int, float, float]], token: str | None = None) -> None:
    client = farm.stack.client(token) if token else farm.api
    resp = client.post("/v1/reports", json={"reports": [{"device_id": device, "ts": t, "lon": lon, "lat": lat}
                                                         for t, lon, lat in fixes]})
    assert resp.status_code == 202 and resp.json()["accepted"] == len(fixes), resp.text


def test_two_fixes_either_side_of_a_strip_give_inferred_enter_and_exit(stack):
    farm = Farm(stack)
    strip = farm.fence({"type": "Polygon", "coordinates": [[[8.5010, 46.99], [8.5014, 46.99], [8.5014, 47.01],
                                                            [8.5010, 47.01], [8.5010, 46.99]]]}, "road")
    token = farm.device("collar-1")
    t0 = farm.base_ts
    post(farm, "collar-1", [(t0, 8.5000, 47.0)], token=token)
    post(farm, "collar-1", [(t0 + 10 * MIN, 8.5024, 47.0)], token=token)     # 10 min later, past the road
    events = farm.wait_events(2, device_id="collar-1")
    assert [(e["type"], e["fence_id"], e.get("inferred"), "late" in e) for e in events] == [
        ("enter", strip, True, False), ("exit", strip, True, False)]
    enter, exit_ = (to_ms(e["ts"]) for e in events)
    assert t0 < enter < exit_ < t0 + 10 * MIN
    assert abs(enter - (t0 + 10 * MIN * 10 / 24)) < 2_000          # interpolated along the segment
    assert farm.api.get(f"/v1/fences/{strip}/devices").json()["devices"] == []
    assert farm.api.get("/v1/devices/collar-1").json()["fences"] == []


def test_a_buffered_night_upload_gives_late_exit_and_enter_once(stack):
    farm = Farm(stack)
    paddock = farm.fence(square(8.50, 47.00), "night paddock")
    farm.device("collar-2")
    t0 = farm.base_ts - 12 * 3600_000
    inside, out = (8.505, 47.005), (8.505, 47.02)
    evening = [(t0 + i * 15 * MIN, *inside) for i in range(3)]
    night = [(t0 + (3 + i) * 15 * MIN, *p) for i, p in enumerate([inside, out, out, out, inside, inside])]
    morning = [(t0 + 12 * 15 * MIN, 8.506, 47.006)]
    post(farm, "collar-2", evening)
    farm.wait_events(1, device_id="collar-2")
    post(farm, "collar-2", morning)
    farm.wait_seen("collar-2", morning[0][0])
    post(farm, "collar-2", night)                       # the collar's buffer, uploaded in the morning
    events = farm.wait_events(3, device_id="collar-2")
    post(farm, "collar-2", night)                       # uploaded again (a retry)
    marker = farm.report("collar-2", (8.506, 47.006))   # a fresh fix: the job has read past the retry
    farm.wait_seen("collar-2", marker[-1])
    events = farm.events(device_id="collar-2")
    assert [(e["type"], e.get("late"), "inferred" in e, to_ms(e["ts"])) for e in events] == [
        ("enter", None, False, t0 + 15 * MIN),
        ("exit", True, False, t0 + 5 * 15 * MIN),
        ("enter", True, False, t0 + 8 * 15 * MIN)]
    device = farm.api.get("/v1/devices/collar-2").json()
    assert device["fences"] == [paddock] and device["ts"] == iso(marker[-1])
    assert [d["device_id"] for d in farm.api.get(f"/v1/fences/{paddock}/devices").json()["devices"]] == ["collar-2"]


def test_walking_toward_the_edge_with_warn_m_20_gives_one_approach(stack):
    farm = Farm(stack)
    paddock = farm.fence(square(8.50, 47.00), "warned", warn_m=20)
    assert farm.api.get(f"/v1/fences/{paddock}").json()["properties"]["warn_m"] == 20
    farm.device("cow-w")
    east = 8.51                                                  # the east edge
    metres = [300, 200, 100, 50, 30, 15, 12, 8, 15]              # from the edge, walking toward it
    fixes = [(farm.base_ts + i * MIN, east - m * DEG_PER_M_LON, 47.005) for i, m in enumerate(metres)]
    post(farm, "cow-w", fixes)
    farm.wait_seen("cow-w", fixes[-1][0])
    events = farm.events(device_id="cow-w")
    assert [(e["type"], to_ms(e["ts"])) for e in events] == [("enter", fixes[1][0]), ("approach", fixes[5][0])]


def test_active_windows_no_events_and_no_members_outside_them(stack):
    farm = Farm(stack)
    now = int(time.time() * 1000)
    bad = farm.api.post("/v1/fences", json={"type": "Feature", "geometry": square(8.50, 47.00),
                                            "properties": {"name": "x", "active_from": now, "active_to": now - 1}})
    assert bad.status_code == 422 and "active_to" in bad.json()["detail"]
    bad = farm.api.post("/v1/fences", json={"type": "Feature", "geometry": square(8.50, 47.00),
                                            "properties": {"name": "x", "warn_m": -3}})
    assert bad.status_code == 422 and "warn_m" in bad.json()["detail"]
    # strip 3 closes in 15 s (its ENTER comes first), strip 1 was grazed an hour ago, strip 2 opens tomorrow
    closing = farm.fence(square(8.54, 47.00), "strip 3", active_from=now - 2 * 3600_000, active_to=now + 15_000)
    past = farm.fence(square(8.50, 47.00), "strip 1", active_from=iso(now - 2 * 3600_000),
                      active_to=iso(now - 30 * MIN))
    future = farm.fence(square(8.52, 47.00), "strip 2", active_from=now + 24 * 3600_000)
    assert farm.api.get(f"/v1/fences/{past}").json()["properties"]["active_to"] == iso(now - 30 * MIN)
    for device in ("s1", "s2", "s3"):
        farm.device(device)
    t = now - 60 * MIN
    post(farm, "s3", [(t, 8.545, 47.005), (t + MIN, 8.545, 47.005)])
    farm.wait_events(1, device_id="s3")
    assert [d["device_id"] for d in farm.api.get(f"/v1/fences/{closing}/devices").json()["devices"]] == ["s3"]
    assert farm.api.get("/v1/devices/s3").json()["fences"] == [closing]
    post(farm, "s1", [(t, 8.505, 47.005), (t + MIN, 8.505, 47.005), (now - 10 * MIN, 8.505, 47.005),
                      (now - 9 * MIN, 8.506, 47.005)])
    post(farm, "s2", [(t, 8.525, 47.005), (t + MIN, 8.525, 47.005), (now - MIN, 8.526, 47.005)])
    farm.wait_seen("s1", now - 9 * MIN)
    farm.wait_seen("s2", now - MIN)
    assert [(e["type"], e["fence_id"]) for e in farm.events(device_id="s1")] == [("enter", past)]   # no exit
    assert farm.events(device_id="s2") == []
    assert farm.api.get(f"/v1/fences/{past}/devices").json()["devices"] == []
    assert farm.api.get(f"/v1/fences/{future}/devices").json()["devices"] == []
    assert farm.api.get("/v1/devices/s1").json()["fences"] == []
    # by wall clock: once strip 3's window has passed it lists nobody, without any new report
    wait_for(lambda: farm.api.get(f"/v1/fences/{closing}/devices").json()["devices"] == [], timeout=90,
             what="strip 3 empty after its window")
    assert farm.api.get("/v1/devices/s3").json()["fences"] == []
    assert [e["type"] for e in farm.events(device_id="s3")] == ["enter"]


@pytest.mark.parametrize("buffer_last", [True, False], ids=["buffer last", "buffer first"])
def test_a_night_escape_whose_return_is_seen_live_gives_one_exit_and_enter(stack, buffer_last):
    """Evening fixes inside a paddock, the morning's back inside, and the night's buffer (04:00-05:00,
    every 10 min) in the neighbour's paddock: one EXIT at the departure and one ENTER at the return for
    the paddock, one ENTER and EXIT for the neighbour's, at the same times whichever came first, `late`
    when the buffer came after the morning. Default debounce (2 fixes): the departure is 04:10, the
    return the second fix back; a paddock with debounce_reports 1 gives 04:00 and the first fix back.
    A retried upload adds nothing; the current state is what the morning's fixes say."""
    farm = Farm(stack)
    paddock = farm.fence(square(8.50, 47.00), "home paddock")
    neighbour = farm.fence(square(8.52, 47.00), "neighbour's paddock")
    quick = farm.fence(square(8.56, 47.00), "quick paddock", debounce_reports=1)
    evening_at = farm.base_ts - 11 * 3600_000                  # 21:00 the day before, as the clock goes
    night_at = evening_at + 7 * 3600_000                         # 04:00
    fixes = {}
    for device, home, away in (("collar-p", (8.505, 47.005), (8.525, 47.005)),
                               ("collar-q", (8.565, 47.005), (8.565, 47.02))):
        farm.device(device)
        fixes[device] = (
            [(evening_at + i * 10 * MIN, home[0] + i * 1e-4, home[1]) for i in range(3)],
            [(night_at + i * 10 * MIN, away[0] + i * 1e-4, away[1]) for i in range(7)],
            [(night_at + (70 + i * 10) * MIN, home[0] + i * 1e-4, home[1] + 1e-4) for i in range(3)])
    for device, (evening, _, _) in fixes.items():
        post(farm, device, evening)
    for device in fixes:
        farm.wait_events(1, device_id=device)
    first, then = (2, 1) if buffer_last else (1, 2)           # the morning (processed), then the buffer; or in order
    for device, parts in fixes.items():
        post(farm, device, parts[first])
    for device, parts in fixes.items():
        farm.wait_seen(device, parts[first][-1][0])
    for device, parts in fixes.items():
        post(farm, device, parts[then])
    want = {"collar-p": 5, "collar-q": 3}
    for device, count in want.items():
        farm.wait_events(count, device_id=device)
    for device, (_, night, _) in fixes.items():
        post(farm, device, night)                                # the upload again (a retry)
    markers = {device: farm.report(device, (fixes[device][2][-1][1], fixes[device][2][-1][2]))[-1] for device in fixes}
    for device, ts in markers.items():
        farm.wait_seen(device, ts)                               # the job has read past the retry
    late = True if buffer_last else None
    p_night, p_morning = fixes["collar-p"][1], fixes["collar-p"][2]
    got = [(e["type"], e["fence_id"], to_ms(e["ts"]), e.get("late")) for e in farm.events(device_id="collar-p")]
    assert sorted(got, key=lambda e: (e[2], e[1])) == sorted([
        ("enter", paddock, fixes["collar-p"][0][1][0], None),
        ("exit", paddock, p_night[1][0], late), ("enter", neighbour, p_night[1][0], late),
        ("exit", neighbour, p_morning[1][0], late), ("enter", paddock, p_morning[1][0], late)],
        key=lambda e: (e[2], e[1]))
    q_night, q_morning = fixes["collar-q"][1], fixes["collar-q"][2]
    got = [(e["type"], e["fence_id"], to_ms(e["ts"]), e.get("late")) for e in farm.events(device_id="collar-q")]
    assert sorted(got, key=lambda e: e[2]) == [
        ("enter", quick, fixes["collar-q"][0][0][0], None), ("exit", quick, q_night[0][0], late),
        ("enter", quick, q_morning[0][0], late)]
    for device, fence in (("collar-p", paddock), ("collar-q", quick)):
        now = farm.api.get(f"/v1/devices/{device}").json()
        assert now["fences"] == [fence] and now["ts"] == iso(markers[device])
        assert device in [d["device_id"] for d in farm.api.get(f"/v1/fences/{fence}/devices").json()["devices"]]
    assert farm.api.get(f"/v1/fences/{neighbour}/devices").json()["devices"] == []
