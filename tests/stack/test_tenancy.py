"""Tenancy: for every route, a farm's key never reads, changes or streams another farm's objects
(404 or empty), and a device token cannot use farm routes."""
from __future__ import annotations

import json
import subprocess
import threading
import time

import httpx
import pytest

from tests.conftest import HERDFENCE, ROOT
from tests.farmkit import Farm, dead_letters_matching, square

INSIDE, INSIDE2, OUTSIDE = (8.505, 47.005), (8.506, 47.006), (8.505, 47.05)
AREA = square(8.50, 47.00)
BBOX = "8.4,46.9,8.6,47.1"


@pytest.fixture(scope="module")
def world(stack):
    """Farm A with a fence, a device inside it (enter event), a webhook and history; farm B with a
    device of the same id and nothing else; A's device token."""
    a, b = Farm(stack, "tenant A"), Farm(stack, "tenant B")
    fence = a.fence(AREA, "A paddock")
    token = a.device("twin-cow")
    b.device("twin-cow")                                  # the same device id in farm B
    a.device("a-only")
    stamps = a.report("twin-cow", INSIDE, INSIDE2, token=token)
    a.report("a-only", INSIDE, INSIDE2)
    a.wait_events(2)
    a.wait_seen("twin-cow", stamps[-1])
    hook = a.api.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"})
    assert hook.status_code == 201, hook.text
    return {"a": a, "b": b, "fence": fence, "token": token, "hook": hook.json()["id"], "stamps": stamps}


def test_other_farm_reads_nothing(world):
    a, b, fence = world["a"], world["b"], world["fence"]
    assert b.api.get("/v1/fences").json()["features"] == []
    assert a.api.get("/v1/fences").json()["features"][0]["id"] == fence
    for path in (f"/v1/fences/{fence}", f"/v1/fences/{fence}/devices", "/v1/devices/a-only"):
        resp = b.api.get(path)
        assert resp.status_code == 404 and "not found" in resp.json()["detail"], path
        assert a.api.get(path).status_code == 200, path
    # the twin id exists in B but has no position there: A's position never shows through
    twin_b = b.api.get("/v1/devices/twin-cow").json()
    assert twin_b["lat"] is None and twin_b["fences"] == []
    assert a.api.get("/v1/devices/twin-cow").json()["fences"] == [fence]
    for params in ({}, {"bbox": BBOX}, {"bbox": "-180,-90,180,90"}, {"herd": "north"}):
        assert b.api.get("/v1/positions", params=params).json()["features"] == [], params
        assert len(a.api.get("/v1/positions", params=params).json()["features"]) == 2, params
    assert b.api.post("/v1/query/within", json={"geometry": AREA}).json()["devices"] == []
    assert len(a.api.post("/v1/query/within", json={"geometry": AREA}).json()["devices"]) == 2
    for params in ({}, {"fence_id": fence}, {"device_id": "twin-cow"}, {"device_id": "a-only"}, {"since": 0}):
        assert b.api.get("/v1/events", params=params).json()["events"] == [], params
    assert len(a.api.get("/v1/events", params={"fence_id": fence}).json()["events"]) == 2


def test_other_farm_history_is_empty(world):
    a, b = world["a"], world["b"]
    for params in ({}, {"device_id": "twin-cow"}, {"device_id": "a-only"}, {"herd": "north"}):
        assert b.api.get("/v1/positions/history", params=params).json()["features"] == [], params
    found = a.api.get("/v1/positions/history", params={"device_id": "a-only"}).json()["features"]
    assert found, "A sees its own history"


def test_other_farm_changes_nothing(world):
    a, b, fence = world["a"], world["b"], world["fence"]
    feature = {"type": "Feature", "properties": {"name": "hijack"}, "geometry": square(8.6, 47.0)}
    assert b.api.put(f"/v1/fences/{fence}", json=feature).status_code == 404
    assert b.api.delete(f"/v1/fences/{fence}").status_code == 404
    assert b.api.delete(f"/v1/webhooks/{world['hook']}").status_code == 404
    assert b.api.get("/v1/webhooks").json()["webhooks"] == []
    assert [h["id"] for h in a.api.get("/v1/webhooks").json()["webhooks"]] == [world["hook"]]
    got = a.api.get(f"/v1/fences/{fence}").json()
    assert got["properties"]["name"] == "A paddock" and got["geometry"]["coordinates"] == AREA["coordinates"]
    # B registering a device id that A uses does not give B A's device (token or data)
    resp = b.api.post("/v1/devices", json={"device_id": "a-only"})
    assert resp.status_code == 201
    assert b.api.get("/v1/devices/a-only").json()["lat"] is None
    assert a.api.get("/v1/devices/a-only").json()["lat"] == INSIDE2[1]
    # A's device token still works for A only
    resp = b.stack.client(world["token"]).post("/v1/reports", json={"reports": [
        {"device_id": "twin-cow", "ts": world["stamps"][-1], "lat": INSIDE2[1], "lon": INSIDE2[0]}]})
    assert resp.status_code == 202


def _sse_lines(stack, key: str, seconds: float, out: list, ready: threading.Event,
               stop: threading.Event) -> None:
    """Collect the stream's lines until `stop` is set (at most `seconds`); the API sends a keep-alive
    comment while idle, so a set `stop` is seen within that interval."""
    with httpx.Client(base_url=stack.api_url, timeout=httpx.Timeout(seconds + 10, read=seconds + 5)) as c:
        with c.stream("GET", "/v1/events/stream", headers={"Authorization": f"Bearer {key}"}) as resp:
            out.append(("status", resp.status_code))
            ready.set()
            deadline = time.monotonic() + seconds
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    out.append(("data", json.loads(line[5:])))
                if time.monotonic() > deadline or stop.is_set():
                    break


def test_event_stream_is_per_farm(world):
    a, b = world["a"], world["b"]
    streams = {"a": [], "b": []}
    readies = {name: threading.Event() for name in streams}
    stop = threading.Event()
    threads = [threading.Thread(target=_sse_lines, args=(a.stack, farm.key, 25, streams[name], readies[name], stop),
                                daemon=True) for name, farm in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for r in readies.values():
        assert r.wait(20)
    time.sleep(1)
    a.report("twin-cow", OUTSIDE, OUTSIDE, token=world["token"])     # exit in A
    exit_ = a.wait_events(1, device_id="twin-cow", timeout=30, **{})
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline and not [d for k, d in streams["a"] if k == "data"]:
        time.sleep(0.3)
    stop.set()          # A's stream has the event: B's, fanned out from the same publication, would too
    for t in threads:   # a reader sees `stop` at its next line (an event or a keep-alive): not waited for
        t.join(1)
    assert ("status", 200) in streams["a"] and ("status", 200) in streams["b"]
    a_events = [d for k, d in streams["a"] if k == "data"]
    assert a_events and all(e["device_id"] in ("twin-cow", "a-only") for e in a_events), a_events
    assert [d for k, d in streams["b"] if k == "data"] == [], "farm B streamed farm A's event"
    assert exit_


def test_sse_needs_a_farm_key(world):
    stack = world["a"].stack
    with httpx.Client(base_url=stack.api_url, timeout=10) as c:
        assert c.get("/v1/events/stream").status_code == 401
        assert c.get("/v1/events/stream", params={"token": "wrong"}).status_code == 401
        assert c.get("/v1/events/stream", headers={"Authorization": f"Bearer {world['token']}"}).status_code == 403
        # a key in the URL is never accepted (it would land in access logs), on any route
        farm_key = world["a"].key
        assert c.get("/v1/events/stream", params={"key": farm_key}).status_code == 401
        assert c.get("/v1/fences", params={"key": farm_key}).status_code == 401
        # the browser's way: a short-lived stream token, for the stream only, of its own farm only
        token = c.post("/v1/events/stream-token", headers={"Authorization": f"Bearer {farm_key}"}).json()["token"]
        assert c.post("/v1/events/stream-token", headers={"Authorization": f"Bearer {world['token']}"}).status_code == 403
        with c.stream("GET", "/v1/events/stream", params={"token": token}) as resp:
            assert resp.status_code == 200
        assert c.get("/v1/fences", headers={"Authorization": f"Bearer {token}"}).status_code == 401


FARM_ROUTES = [
    ("GET", "/v1/fences", None), ("POST", "/v1/fences", {"type": "Feature", "properties": {"name": "x"},
                                                        "geometry": AREA}),
    ("GET", "/v1/fences/{fence}", None), ("PUT", "/v1/fences/{fence}", {"type": "Feature", "properties": {"name": "x"},
                                                                        "geometry": AREA}),
    ("DELETE", "/v1/fences/{fence}", None), ("GET", "/v1/fences/{fence}/devices", None),
    ("POST", "/v1/devices", {"device_id": "new-one"}), ("GET", "/v1/positions", None),
    ("GET", "/v1/positions/history", None), ("GET", "/v1/events", None), ("GET", "/v1/events/stream", None),
    ("POST", "/v1/query/within", {"geometry": AREA}), ("GET", "/v1/webhooks", None),
    ("POST", "/v1/webhooks", {"url": "http://127.0.0.1:9/x"}), ("DELETE", "/v1/webhooks/{hook}", None),
    ("GET", "/v1/time-in-fence", None),
]


@pytest.mark.parametrize("method,path,body", FARM_ROUTES, ids=[f"{m} {p}" for m, p, _ in FARM_ROUTES])
def test_device_token_cannot_use_farm_routes(world, method, path, body):
    a = world["a"]
    client = a.stack.client(world["token"])
    url = path.format(fence=world["fence"], hook=world["hook"])
    resp = client.request(method, url, json=body) if body is not None else client.request(method, url)
    assert resp.status_code == 403, (method, url, resp.status_code, resp.text[:200])
    assert "device token" in resp.json()["detail"]
    # nothing changed
    assert a.api.get(f"/v1/fences/{world['fence']}").status_code == 200


def test_device_token_scope(world):
    a, b = world["a"], world["b"]
    client = a.stack.client(world["token"])
    assert client.get("/v1/devices/twin-cow").status_code == 200          # its own device
    assert client.get("/v1/devices/a-only").status_code == 404            # not a sibling
    resp = client.post("/v1/reports", json={"reports": [{"device_id": "a-only", "ts": 1_700_000_000_000,
                                                         "lat": 47, "lon": 8}]})
    assert resp.status_code == 403
    resp = client.post("/v1/reports", json={"reports": [{"ts": 1_700_000_000_000, "lat": 47, "lon": 8}]})
    assert resp.status_code == 403
    # a report body cannot move the device to another farm
    resp = client.post("/v1/reports", json={"reports": [{"device_id": "twin-cow", "farm_id": b.farm_id,
                                                         "ts": world["stamps"][-1], "lat": 47.005, "lon": 8.505}]})
    assert resp.status_code in (202, 403, 422)
    # a later report of the same device (same key, same partition) processed: the one above was too
    sentinel = a.report("twin-cow", INSIDE2, token=world["token"])[-1]
    a.wait_seen("twin-cow", sentinel)
    assert b.api.get("/v1/devices/twin-cow").json()["lat"] is None
    assert b.api.get("/v1/positions").json()["features"] == []


def test_farm_key_cannot_post_into_another_farm(world):
    a, b = world["a"], world["b"]
    resp = b.api.post("/v1/reports", json={"reports": [{"device_id": "a-only", "farm_id": a.farm_id,
                                                        "ts": world["stamps"][-1] + 1, "lat": 47.05, "lon": 8.505}]})
    assert resp.status_code in (202, 403, 422)
    if resp.status_code == 202:     # the API writes the report into the caller's farm: wait until B has it
        b.wait_seen("a-only", world["stamps"][-1] + 1)
    assert a.api.get("/v1/devices/a-only").json()["lat"] == INSIDE2[1], "farm B moved farm A's device"


def test_rotated_farm_key_and_revoked_device_token_stop_working_at_once(stack):
    farm = Farm(stack, "rotating")
    token = farm.device("rot-cow")
    assert farm.api.get("/v1/fences").status_code == 200            # both secrets cached by the API now
    dev = stack.client(token)
    body = {"reports": [{"device_id": "rot-cow", "ts": farm.base_ts, "lat": 47.0, "lon": 8.5}]}
    assert dev.post("/v1/reports", json=body).status_code == 202
    out = json.loads(stack.cli("farm", "rotate-key", farm.farm_id, "--json"))
    assert out["farm_id"] == farm.farm_id and out["api_key"] != farm.key
    assert farm.api.get("/v1/fences").status_code == 401, "the old key still works"
    new = stack.client(out["api_key"])
    assert new.get("/v1/fences").status_code == 200
    assert new.delete("/v1/devices/rot-cow/token").status_code == 204
    assert dev.post("/v1/reports", json=body).status_code == 401, "the revoked token still works"
    assert new.delete("/v1/devices/no-such-cow/token").status_code == 404
    missing = subprocess.run([HERDFENCE, "farm", "rotate-key", "farm-nope"], env=stack.env, cwd=ROOT,
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "no farm" in missing.stderr


def test_a_device_id_two_farms_registered_goes_where_the_gateway_says(stack):
    """Kafka gateways (issue 18.6): a bare record goes to the farm that registered the id first (a
    later farm registering the same id neither receives nor breaks that feed); a record naming a farm
    goes to that farm only if it registered the id; any other name is dead-lettered with the reason."""
    from confluent_kafka import Producer

    from ingest.producer import PARTITIONER

    first, second, stranger = Farm(stack, "gw first"), Farm(stack, "gw second"), Farm(stack, "gw stranger")
    device = f"gw-cow-{time.time_ns() % 10**9}"
    first.api.post("/v1/devices", json={"device_id": device}).raise_for_status()
    again = second.api.post("/v1/devices", json={"device_id": device})
    assert again.status_code == 201
    assert again.json()["gateway_must_send_farm_id"] is True and again.json()["farm_id"] == second.farm_id
    again_first = first.api.post("/v1/devices", json={"device_id": device})
    assert again_first.json()["gateway_must_send_farm_id"] is False       # still the bare id's owner

    ts = first.base_ts
    records = [({"device_id": device, "ts": ts, "lat": 47.201, "lon": 8.801}),                     # bare
               ({"device_id": device, "ts": ts + 1000, "lat": 47.302, "lon": 8.902, "farm_id": second.farm_id}),
               ({"device_id": device, "ts": ts + 2000, "lat": 47.403, "lon": 8.703, "farm_id": stranger.farm_id})]
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, **PARTITIONER})
    for record in records:
        producer.produce("gps.reports", value=json.dumps(record).encode(), key=device.encode())
    assert producer.flush(15) == 0

    seen_first = first.wait_seen(device, ts)
    seen_second = second.wait_seen(device, ts + 1000)
    assert (seen_first["lat"], seen_first["lon"]) == (47.201, 8.801)
    assert (seen_second["lat"], seen_second["lon"]) == (47.302, 8.902)
    dead_letters_matching(stack, device, 1)          # the stranger's record was refused, not applied
    assert stranger.api.get(f"/v1/devices/{device}").status_code == 404    # never registered there
    assert first.api.get(f"/v1/devices/{device}").json()["lat"] == 47.201   # nothing leaked in
    [letter] = dead_letters_matching(stack, device, 1)
    assert "not registered in the farm" in letter["reason"] and stranger.farm_id in letter["raw"]
