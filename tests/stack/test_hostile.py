"""Hostile input: fuzzing against the OpenAPI spec finds no 5xx; oversized, deep, malformed, huge,
non-finite, mistyped, unicode and injection-looking input gets a clear 4xx naming the problem; rate
limits answer 429 with Retry-After; secrets are stored hashed; malformed records written straight
onto Kafka land in the DLQ while valid reports after them are processed."""
from __future__ import annotations

import json
import os
import math
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest

from tests.farmkit import Farm, dead_letters_matching, square

# The fuzz: every operation in both generation modes, FUZZ_EXAMPLES cases each (a few by default, many
# with HYPOTHESIS_PROFILE=full), within FUZZ_SECONDS at most (a cap for a slow machine, not a length).
_FULL = os.environ.get("HYPOTHESIS_PROFILE") == "full"
FUZZ_EXAMPLES = int(os.environ.get("HERDFENCE_FUZZ_EXAMPLES", 40 if _FULL else 5))
FUZZ_SECONDS = float(os.environ.get("HERDFENCE_FUZZ_SECONDS", 600 if _FULL else 120))


@pytest.fixture(scope="module")
def farm(stack) -> Farm:
    return Farm(stack, "hostile")


def _raw(farm: Farm, method: str, path: str, content: bytes | str, **kw):
    return farm.api.request(method, path, content=content, headers={"content-type": "application/json"}, **kw)


def _detail(resp) -> str:
    body = resp.json()
    assert isinstance(body.get("detail"), (str, list)) and body["detail"], body
    return json.dumps(body["detail"]).lower()


# --- fuzzing against /openapi.json ---------------------------------------------------------------
def test_schemathesis_finds_no_5xx(stack, farm):
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    fence_id = farm.fence(square(8.50, 47.00))
    schema = schemathesis.openapi.from_url(f"{stack.api_url}/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    ops = [op for op in ops if op.path != "/v1/events/stream"]     # endless SSE: tested in test_tenancy
    assert len(ops) >= 15, [op.path for op in ops]
    deadline = time.monotonic() + FUZZ_SECONDS
    budget = FUZZ_EXAMPLES
    failures: list[str] = []
    calls = 0
    for op in ops:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if time.monotonic() > deadline:
                break

            @settings(max_examples=budget, deadline=None, database=None, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):
                nonlocal calls
                if time.monotonic() > deadline:
                    return
                if case.path_parameters and "fence_id" in case.path_parameters and calls % 3 == 0:
                    case.path_parameters["fence_id"] = fence_id           # sometimes hit a real object
                resp = case.call(headers={"Authorization": f"Bearer {farm.key}"}, timeout=20)
                calls += 1
                if resp.status_code >= 500:
                    failures.append(f"{case.method} {case.formatted_path} {case.query} "
                                    f"{str(case.body)[:300]} -> {resp.status_code} {resp.text[:300]}")
            try:
                run()
            except Unsatisfiable:      # e.g. no negative case exists for an operation without inputs
                pass
    print(f"schemathesis: {calls} calls over {len(ops)} operations")
    assert calls >= 100
    assert not failures, "\n".join(failures[:10])


# --- bodies --------------------------------------------------------------------------------------
def test_oversized_bodies_413(farm):
    big = b'{"reports": [' + b" " * (9 * 1024 * 1024) + b"]}"
    for path in ("/v1/reports", "/v1/fences", "/v1/query/within", "/v1/devices"):
        resp = _raw(farm, "POST", path, big)
        assert resp.status_code == 413 and "too large" in _detail(resp), path

    def chunks():                                       # no Content-Length: chunked, counted as it comes
        for _ in range(10):
            yield b" " * (1024 * 1024)
    resp = farm.api.post("/v1/reports", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413
    # per-route limits: one geometry needs no 8 MB, a device or a webhook no more than 64 KB
    for path, size in (("/v1/query/within", 3 * 1024 * 1024), ("/v1/fences", 3 * 1024 * 1024),
                       ("/v1/devices", 100 * 1024), ("/v1/webhooks", 100 * 1024)):
        resp = _raw(farm, "POST", path, b'{"x": "' + b"y" * size + b'"}')
        assert resp.status_code == 413 and "limit for this route" in _detail(resp), path
    a_lot = _raw(farm, "POST", "/v1/reports", b'{"reports": [], "pad": "' + b"y" * (3 * 1024 * 1024) + b'"}')
    assert a_lot.status_code != 413, a_lot.text[:200]          # reports keep their 8 MB
    many = {"reports": [{"device_id": "x", "ts": 1_700_000_000_000, "lat": 1, "lon": 1}] * 10_001}
    resp = farm.api.post("/v1/reports", json=many)
    assert resp.status_code == 413 and "10000" in _detail(resp).replace(",", "")


@pytest.mark.parametrize("depth", [64, 5_000, 200_000])
def test_deep_json_is_4xx(farm, depth):
    for path in ("/v1/reports", "/v1/fences", "/v1/query/within", "/v1/devices", "/v1/webhooks"):
        deep = '{"reports": ' + "[" * depth + "]" * depth + "}"
        resp = _raw(farm, "POST", path, deep)
        if resp.status_code == 202:                  # parsed: each report rejected with its reason
            assert path == "/v1/reports" and resp.json()["accepted"] == 0 and resp.json()["rejected"], resp.text
        else:
            assert 400 <= resp.status_code < 500, (path, depth, resp.status_code, resp.text[:200])
            _detail(resp)
        deep_obj = '{"a":' * depth + "1" + "}" * depth
        resp = _raw(farm, "POST", path, deep_obj)
        assert 400 <= resp.status_code < 500, (path, depth, resp.status_code, resp.text[:200])


def test_invalid_json_and_wrong_shapes(farm):
    for bad in (b"{not json", b"", b"\xff\xfe", b"[1,2", b"null", b"42", b'"reports"', b"[]"):
        for path in ("/v1/reports", "/v1/fences", "/v1/query/within", "/v1/devices", "/v1/webhooks"):
            resp = _raw(farm, "POST", path, bad)
            assert resp.status_code == 422, (path, bad, resp.status_code, resp.text[:200])
            _detail(resp)
    resp = farm.api.post("/v1/reports", json={"reports": "cow"})
    assert resp.status_code == 422 and "reports" in _detail(resp)


# --- reports -------------------------------------------------------------------------------------
NOW = int(time.time() * 1000)
BAD_REPORTS = [
    ({"device_id": "c1", "ts": NOW, "lat": "47", "lon": 8.5}, "lat"),
    ({"device_id": "c1", "ts": NOW, "lat": True, "lon": 8.5}, "lat"),
    ({"device_id": "c1", "ts": NOW, "lat": [47], "lon": 8.5}, "lat"),
    ({"device_id": "c1", "ts": NOW, "lat": 47, "lon": 181}, "lon"),
    ({"device_id": "c1", "ts": True, "lat": 47, "lon": 8}, "ts"),
    ({"device_id": "c1", "ts": "yesterday", "lat": 47, "lon": 8}, "ts"),
    ({"device_id": "c1", "ts": 10**30, "lat": 47, "lon": 8}, "ts"),
    ({"device_id": "c1", "ts": NOW + 3_600_000, "lat": 47, "lon": 8}, "ts"),
    ({"device_id": "c1", "ts": -1, "lat": 47, "lon": 8}, "ts"),
    ({"device_id": 17, "ts": NOW, "lat": 47, "lon": 8}, "device_id"),
    ({"device_id": "", "ts": NOW, "lat": 47, "lon": 8}, "device_id"),
    ({"device_id": "küh-1", "ts": NOW, "lat": 47, "lon": 8}, "device_id"),
    ({"device_id": "牛🐄", "ts": NOW, "lat": 47, "lon": 8}, "device_id"),
    ({"device_id": "c1\u202e", "ts": NOW, "lat": 47, "lon": 8}, "device_id"),
    ({"device_id": "c\x001", "ts": NOW, "lat": 47, "lon": 8}, "device_id"),
    ({"device_id": "1' OR '1'='1", "ts": NOW, "lat": 47, "lon": 8}, "device_id"),
    ({"device_id": "<script>alert(1)</script>", "ts": NOW, "lat": 47, "lon": 8}, "device_id"),
    ({"device_id": "x" * 65, "ts": NOW, "lat": 47, "lon": 8}, "device_id"),
    ({"device_id": "c1", "ts": NOW, "lat": 47, "lon": 8, "battery": 101}, "battery"),
    ({"device_id": "c1", "ts": NOW, "lat": 47, "lon": 8, "battery": "full"}, "battery"),
    ({"device_id": "c1", "ts": NOW, "lat": 47, "lon": 8, "accuracy_m": -1}, "accuracy"),
    ({"device_id": "c1", "ts": NOW, "lon": 8}, "lat"),
    ("not an object", "object"),
    (None, "object"),
]


def test_bad_reports_are_rejected_with_reason(farm):
    resp = farm.api.post("/v1/reports", json={"reports": [r for r, _ in BAD_REPORTS]})
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["accepted"] == 0
    reasons = {r["index"]: r["reason"].lower() for r in body["rejected"]}
    assert sorted(reasons) == list(range(len(BAD_REPORTS)))
    for i, (_, field) in enumerate(BAD_REPORTS):
        assert field in reasons[i], (BAD_REPORTS[i][0], reasons[i])


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers(farm, literal):
    body = '{"reports": [{"device_id": "c1", "ts": %d, "lat": %s, "lon": 8.5}]}' % (NOW, literal)
    resp = _raw(farm, "POST", "/v1/reports", body)
    assert resp.status_code in (202, 422), resp.text
    if resp.status_code == 202:
        assert resp.json()["accepted"] == 0 and "lat" in resp.json()["rejected"][0]["reason"].lower()
    ring = "[[8.5,47.0],[8.51,47.0],[8.51,%s],[8.5,47.01],[8.5,47.0]]" % literal
    geometry = '{"type":"Polygon","coordinates":[%s]}' % ring
    for path, payload in (("/v1/fences", '{"type":"Feature","properties":{"name":"n"},"geometry":%s}' % geometry),
                          ("/v1/query/within", '{"geometry": %s}' % geometry)):
        resp = _raw(farm, "POST", path, payload)
        assert resp.status_code == 422, (path, resp.status_code, resp.text[:200])
        _detail(resp)


# --- fences --------------------------------------------------------------------------------------
def _feature(geometry, **props) -> dict:
    return {"type": "Feature", "properties": {"name": "f", **props}, "geometry": geometry}


def _circle(n: int, r: float = 0.01, lon: float = 8.3, lat: float = 46.9) -> dict:
    ring = [[lon + r * math.cos(2 * math.pi * i / n), lat + r * math.sin(2 * math.pi * i / n)] for i in range(n)]
    return {"type": "Polygon", "coordinates": [ring + [ring[0]]]}


BAD_GEOMETRIES = [
    ({"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}, "self-intersection"),
    ({"type": "Polygon", "coordinates": [[[8.5, 47], [8.6, 47], [8.6, 47.1]]]}, ""),          # not closed / too few
    ({"type": "Polygon", "coordinates": [[[8.5, 47], [8.6, 47], [8.5, 47]]]}, ""),
    ({"type": "Polygon", "coordinates": []}, ""),
    ({"type": "Polygon", "coordinates": [[["8.5", "47"], [8.6, 47], [8.6, 47.1], [8.5, 47]]]}, ""),
    ({"type": "Polygon", "coordinates": [[[8.5, 91], [8.6, 91], [8.6, 92], [8.5, 91]]]}, ""),
    ({"type": "Polygon", "coordinates": [[[179.9, 0], [-179.9, 0], [-179.9, 0.1], [179.9, 0]]]}, ""),
    ({"type": "Point", "coordinates": [8.5, 47]}, "polygon"),
    ({"type": "LineString", "coordinates": [[8.5, 47], [8.6, 47]]}, "polygon"),
    ({"type": "GeometryCollection", "geometries": []}, "polygon"),
    ({"type": "Polygon"}, ""),
    ("POLYGON((0 0, 1 0, 1 1, 0 0))", ""),
    (None, ""),
    ({"type": "MultiPolygon", "coordinates": [[[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]]}, ""),
    (_circle(10_001), "vertices"),
    (_circle(200, r=5.0), "large"),
]


@pytest.mark.parametrize("geometry,word", BAD_GEOMETRIES, ids=range(len(BAD_GEOMETRIES)))
def test_bad_fences_are_422(farm, geometry, word):
    resp = farm.api.post("/v1/fences", json=_feature(geometry))
    assert resp.status_code == 422, resp.text[:300]
    assert word in _detail(resp)
    resp = farm.api.post("/v1/query/within", json={"geometry": geometry})
    assert resp.status_code == 422, resp.text[:300]


def test_fence_at_vertex_limit_is_accepted_and_bad_props_rejected(farm):
    resp = farm.api.post("/v1/fences", json=_feature(_circle(9_999)))
    assert resp.status_code == 201, resp.text[:300]
    fid = resp.json()["id"]
    assert farm.api.get(f"/v1/fences/{fid}").status_code == 200
    for props in ({"name": 5}, {"name": "x" * 100_000}, {"debounce_reports": -1}, {"debounce_reports": "2"},
                  {"debounce_seconds": -5}, {"dwell_seconds": "long"}):
        feature = _feature(square(8.5, 47.0))
        feature["properties"] = props
        resp = farm.api.post("/v1/fences", json=feature)
        assert resp.status_code == 422, (props, resp.status_code, resp.text[:200])
        _detail(resp)
    for feature in ({"type": "FeatureCollection", "features": []}, {"geometry": square(8.5, 47)}, [1, 2]):
        resp = farm.api.post("/v1/fences", json=feature)
        assert resp.status_code == 422, (feature, resp.text[:200])


def test_injection_looking_strings_are_data_or_4xx(farm):
    nasty = ["<script>alert(1)</script>", "'; DROP TABLE fences; --", "${jndi:ldap://x}", "../../etc/passwd",
             "{{7*7}}", "\u0000", "%00", "*", "?", "fence}:{x"]
    resp = farm.api.post("/v1/fences", json=_feature(square(8.5, 47.0), name=nasty[0]))
    assert resp.status_code == 201 and resp.json()["properties"]["name"] == nasty[0]
    assert resp.headers["content-type"].startswith("application/json")
    for s in nasty:
        q = quote(s, safe="")
        for method, path in (("GET", f"/v1/fences/{q}"), ("DELETE", f"/v1/fences/{q}"),
                             ("GET", f"/v1/fences/{q}/devices"), ("GET", f"/v1/devices/{q}")):
            resp = farm.api.request(method, path)
            assert resp.status_code in (404, 405, 422), (method, path, resp.status_code, resp.text[:200])
        for params in ({"fence_id": s}, {"device_id": s}, {"since": s}, {"limit": s}):
            resp = farm.api.get("/v1/events", params=params)
            assert resp.status_code in (200, 422), (params, resp.status_code)
            if resp.status_code == 200:
                assert resp.json()["events"] == []
        resp = farm.api.get("/v1/positions", params={"bbox": s, "herd": s})
        assert resp.status_code == 422 and "bbox" in _detail(resp)
        resp = farm.api.post("/v1/devices", json={"device_id": s})
        assert resp.status_code == 422 and "device_id" in _detail(resp)
        resp = farm.api.post("/v1/devices", json={"device_id": "ok-1", "herd": s * 20})
        assert resp.status_code in (201, 422)
        resp = farm.api.post("/v1/webhooks", json={"url": s})
        assert resp.status_code == 422 and "url" in _detail(resp)


def test_query_parameters_out_of_range(farm):
    for params in ({"limit": 0}, {"limit": 10_001}, {"limit": -1}, {"limit": "many"}, {"since": "2026-13-45"},
                   {"since": "nan"}):
        resp = farm.api.get("/v1/events", params=params)
        assert resp.status_code == 422, (params, resp.status_code, resp.text[:200])
        _detail(resp)
    for bbox in ("1,2,3", "a,b,c,d", "10,10,0,0", "-200,0,0,1", "nan,nan,nan,nan", "inf,-inf,1,2", "0,0,1,1,1"):
        resp = farm.api.get("/v1/positions", params={"bbox": bbox})
        assert resp.status_code == 422 and "bbox" in _detail(resp), bbox
    for params in ({"from": "soon"}, {"to": "later"}, {"limit": 0}, {"limit": 10**9}):
        resp = farm.api.get("/v1/positions/history", params=params)
        assert resp.status_code == 422, (params, resp.status_code)


# --- limits, secrets ---------------------------------------------------------------------------------
def test_per_device_rate_limit_429(stack, farm):
    token = farm.device("rate-dev")
    client = stack.client(token)
    body = {"reports": []}

    def hit(_):
        r = client.post("/v1/reports", json=body)
        return r.status_code, r.headers.get("retry-after")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(hit, range(300)))
    limited = [a for a in answers if a[0] == 429]
    assert limited, f"no 429 in {len(answers)} fast requests: {set(a[0] for a in answers)}"
    assert all(ra and float(ra) > 0 for _, ra in limited)
    assert {s for s, _ in answers} <= {202, 429}
    # another device of the same farm is not throttled by this one
    other = stack.client(farm.device("rate-dev-2"))
    assert other.post("/v1/reports", json=body).status_code == 202


def test_per_farm_rate_limit_429(stack, monkeypatch):
    """The farm buckets are checked in-process with small rates: the same middleware and route code,
    the running stack's Redis (where the buckets live) and broker."""
    from fastapi.testclient import TestClient
    from api import rate_limits
    for var, value in stack.env.items():
        if var.startswith("HERDFENCE_"):
            monkeypatch.setenv(var, value)
    monkeypatch.setattr(rate_limits, "FARM_REPORTS", rate_limits.TokenBucket("reports", 1, 5))
    monkeypatch.setattr(rate_limits, "FARM_REQUESTS", rate_limits.TokenBucket("farm", 5, 20))
    farm_id, key = stack.new_farm("rate farm")
    _, other_key = stack.new_farm("rate farm 2")
    from api.app import app
    with TestClient(app) as client:
        auth = {"Authorization": f"Bearer {key}"}
        codes = [client.post("/v1/reports", json={"reports": []}, headers=auth).status_code for _ in range(12)]
        assert 429 in codes and codes[0] == 202, codes
        resp = client.post("/v1/reports", json={"reports": []}, headers=auth)
        assert resp.status_code == 429 and float(resp.headers["retry-after"]) > 0 and "slow down" in resp.json()["detail"]
        reads = [client.get("/v1/fences", headers=auth).status_code for _ in range(40)]
        assert 429 in reads and reads[0] == 200
        other = client.post("/v1/reports", json={"reports": []}, headers={"Authorization": f"Bearer {other_key}"})
        assert other.status_code == 202                       # per farm: another farm is not throttled


def test_secrets_are_stored_hashed(stack):
    import hashlib
    farm_id, key = stack.new_farm("secret farm")
    client = stack.client(key)
    token = client.post("/v1/devices", json={"device_id": "secret-cow"}).json()["token"]
    redis = stack.redis
    for secret in (key, token):
        digest = hashlib.sha256(secret.encode()).hexdigest()
        assert redis.exists(f"apikey:{digest}") or redis.exists(f"devtoken:{digest}")
    seen = 0
    for name in redis.scan_iter(count=1000):
        seen += 1
        assert key not in name and token not in name
        kind = redis.type(name)
        if kind == "string":
            values = [redis.get(name) or ""]
        elif kind == "hash":
            values = list(redis.hgetall(name).values()) if farm_id in name or "apikey" in name else []
        else:
            continue
        for v in values:
            assert key not in v and token not in v, name
    assert seen > 5
    assert redis.hget(f"farm:{{{farm_id}}}", "key_hash") == hashlib.sha256(key.encode()).hexdigest()
    # a wrong key of the same length, a prefix, a hash of the key: all 401
    for wrong in (key[:-1] + ("A" if key[-1] != "A" else "B"), key[:10], hashlib.sha256(key.encode()).hexdigest()):
        assert stack.client(wrong).get("/v1/fences").status_code == 401


# --- malformed records straight onto Kafka --------------------------------------------------------
def test_malformed_kafka_records_go_to_dlq_and_valid_ones_still_flow(stack):
    from confluent_kafka import Producer

    from ingest.producer import PARTITIONER
    farm = Farm(stack, "dlq farm")
    fence_id = farm.fence(square(8.50, 47.00))
    farm.device("dlq-cow")
    marker = f"m{time.time_ns()}"
    ts = farm.base_ts
    bad = [
        (b"not json " + marker.encode(), "json"),
        (b'\xff\xfe\x00' + marker.encode(), ""),
        (json.dumps({"device_id": "dlq-cow", "ts": ts, "lat": "47", "lon": 8.5, "m": marker}).encode(), "lat"),
        (json.dumps({"device_id": "dlq-cow", "ts": ts, "lat": 95.0, "lon": 8.5, "m": marker}).encode(), "lat"),
        (json.dumps({"device_id": "dlq-cow", "ts": "soon", "lat": 47.0, "lon": 8.5, "m": marker}).encode(), "ts"),
        (json.dumps({"device_id": f"nobody-{marker}", "ts": ts, "lat": 47.0, "lon": 8.5}).encode(), "unknown"),
        (json.dumps([marker]).encode(), "object"),
    ]
    good = [{"device_id": "dlq-cow", "ts": ts + 1000 * i, "lat": lat, "lon": lon}
            for i, (lon, lat) in enumerate([(8.505, 47.005), (8.506, 47.006)], start=1)]
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, **PARTITIONER})
    for value, _ in bad:
        producer.produce("gps.reports", value=value, key=b"dlq-cow")
    for rec in good:
        producer.produce("gps.reports", value=json.dumps(rec).encode(), key=b"dlq-cow")
    assert producer.flush(15) == 0
    [enter] = farm.wait_events(1, timeout=60, device_id="dlq-cow")
    assert enter["fence_id"] == fence_id and enter["type"] == "enter"

    time.sleep(1)                 # a record dead-lettered twice would be there by now
    letters = dead_letters_matching(stack, marker, len(bad))

    def mine() -> list[dict]:
        return letters
    for d in mine():
        assert set(d) >= {"reason", "raw", "topic", "partition", "offset"}, d
        assert d["topic"] == "gps.reports" and isinstance(d["partition"], int) and isinstance(d["offset"], int)
        assert d["reason"]
    assert len(mine()) == len(bad), mine()
    reasons = " | ".join(d["reason"].lower() for d in mine())
    for _, word in bad:
        assert word in reasons, (word, reasons)
    offsets = {(d["partition"], d["offset"]) for d in mine()}
    assert len(offsets) == len(bad), "each bad record dead-lettered once"


# --- numbers, times and names no parser should choke on (issue 18) --------------------------------
HUGE = "1" + "0" * 400          # an integer literal no float can hold


def test_overflowing_numbers_and_absurd_times_are_4xx(farm):
    ring = f"[[8.5,47.0],[{HUGE},47.0],[8.51,47.01],[8.5,47.0]]"
    cases = [
        ("POST", "/v1/reports", f'{{"reports":[{{"device_id":"big","ts":1732500000000,"lat":{HUGE},"lon":8.5}}]}}'),
        ("POST", "/v1/fences", f'{{"type":"Feature","properties":{{"name":"x"}},'
                               f'"geometry":{{"type":"Polygon","coordinates":[{ring}]}}}}'),
        ("POST", "/v1/query/within", f'{{"geometry":{{"type":"Polygon","coordinates":[{ring}]}}}}'),
    ]
    for method, path, body in cases:
        resp = _raw(farm, method, path, body)
        assert resp.status_code in (202, 422), (path, resp.status_code, resp.text[:300])
        if resp.status_code == 202:            # a report batch: the report itself is rejected with a reason
            assert resp.json()["accepted"] == 0 and "lat" in resp.json()["rejected"][0]["reason"], resp.text
        else:
            assert "range" in _detail(resp) or "finite" in _detail(resp), resp.text
    for params in ({"from": "99999999999999999"}, {"to": "-99999999999999999"}, {"from": "9" * 400},
                   {"device_id": "x", "from": "99999999999999999"}):
        resp = farm.api.get("/v1/positions/history", params=params)
        assert resp.status_code == 422 and "out of range" in _detail(resp), (params, resp.text)
    for since in ("99999999999999999", "-" + "9" * 30, "10000-01-01T00:00:00Z"):
        resp = farm.api.get("/v1/events", params={"since": since})
        assert resp.status_code == 422 and "since" in _detail(resp), (since, resp.text)


def test_ids_with_trailing_newlines_or_out_of_alphabet_are_refused(farm):
    for device_id in ("cow\n", "cow\r\n", "\ncow", "cow 1", "c" * 65, "fences:{x}"):
        resp = farm.api.post("/v1/devices", json={"device_id": device_id, "herd": "n"})
        assert resp.status_code == 422 and "device_id" in _detail(resp), (device_id, resp.text)
    resp = farm.api.post("/v1/devices", json={"device_id": "ok-cow", "herd": "north\n"})
    assert resp.status_code == 422 and "herd" in _detail(resp), resp.text


def test_within_cache_keys_on_the_parsed_geometry(stack, farm):
    """A 1 MB unknown member beside a valid polygon answers like the bare polygon (and is not what
    the answer cache stores)."""
    geometry = square(8.50, 47.00)
    bare = farm.api.post("/v1/query/within", json={"geometry": geometry})
    padded = farm.api.post("/v1/query/within", json={"geometry": {**geometry, "junk": "x" * 1_000_000}})
    assert bare.status_code == padded.status_code == 200, padded.text[:200]
    assert bare.json() == padded.json()


def test_ui_has_a_content_security_policy(stack):
    page = stack.client(None).get("/")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-eval" not in csp
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "DENY"
    assert stack.client(None).get("/healthz").headers["referrer-policy"] == "no-referrer"


def test_the_hot_pull_queries_carry_the_security_headers(farm):
    """api/fastpath.py answers these itself once the worker knows the farm key: the first request on a
    connection teaches it, the following ones on the same connection take the short way."""
    from api.security_headers import COMMON
    fence_id = farm.fence(square(8.60, 47.10))
    routes = [("GET", f"/v1/fences/{fence_id}/devices", None),
              ("POST", "/v1/query/within", {"geometry": square(8.60, 47.10)})]
    for method, path, body in routes:
        for _ in range(5):
            resp = farm.api.request(method, path, json=body)
            assert resp.status_code == 200, resp.text
            for name, value in COMMON:
                assert resp.headers.get(name.decode()) == value.decode(), (path, name, dict(resp.headers))


# --- every route that takes input, case by case (issue 18, item 3) --------------------------------
def _route_inputs(fence_id: str) -> list[tuple[str, str]]:
    """(method, path) of every route that takes a body."""
    return [("POST", "/v1/reports"), ("POST", "/v1/fences"), ("PUT", f"/v1/fences/{fence_id}"),
            ("POST", "/v1/query/within"), ("POST", "/v1/devices"), ("POST", "/v1/webhooks"),
            ("POST", "/v1/events/stream-token")]


def test_invalid_utf8_and_deep_nesting_on_every_body_route(farm):
    fence_id = farm.fence(square(8.50, 47.00))
    bodies = [b'{"device_id":"\xff\xfe"}', b'{"url":"http://\xc0\x80/"}', b'\xed\xa0\x80',
              b'{"a":' * 100_000 + b"1" + b"}" * 100_000, b"[" * 100_000]
    for method, path in _route_inputs(fence_id):
        for body in bodies:
            resp = _raw(farm, method, path, body)
            assert 400 <= resp.status_code < 500 or (path == "/v1/events/stream-token" and resp.status_code == 200), \
                (method, path, body[:20], resp.status_code, resp.text[:200])


def test_invalid_utf8_in_paths_and_query_strings(farm):
    for path in ("/v1/time-in-fence?fence_id=%FF%FE", "/v1/time-in-fence?from=%FF", "/v1/events?device_id=%C3%28",
                 "/v1/positions/history?device_id=%FF", "/v1/positions?herd=%FF", "/v1/devices/%FF%FE",
                 "/v1/fences/%C3%28", "/v1/fences/%C3%28/devices"):
        resp = farm.api.get(path)
        # a filter that names nothing may answer an empty 200; an object that cannot exist is 4xx
        assert 400 <= resp.status_code < 500 or (resp.status_code == 200 and "?" in path), \
            (path, resp.status_code, resp.text[:200])
        if resp.status_code >= 400:
            _detail(resp)


def test_fence_rules_with_overflowing_numbers_name_the_property(farm):
    fence_id = farm.fence(square(8.50, 47.00))
    geometry = json.dumps(square(8.50, 47.00))
    for name in ("debounce_reports", "debounce_seconds", "dwell_seconds"):
        for value in (HUGE, "-" + HUGE, "1e400"):
            body = '{"type":"Feature","properties":{"name":"x","%s":%s},"geometry":%s}' % (name, value, geometry)
            for method, path in (("POST", "/v1/fences"), ("PUT", f"/v1/fences/{fence_id}")):
                resp = _raw(farm, method, path, body)
                assert resp.status_code == 422 and name in _detail(resp), (method, name, value, resp.text[:200])


def test_time_in_fence_refuses_absurd_times_and_ids(farm):
    fence_id = farm.fence(square(8.50, 47.00))
    for params in ({"to": "0001-01-01T00:00:00Z"}, {"to": "-62135596800000"}, {"from": "99999999999999999"},
                   {"to": "9" * 400}, {"from": "-" + "9" * 30}, {"from": "10000-01-01T00:00:00Z"},
                   {"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
                   {"from": "0001-01-01T00:00:00Z", "to": "9999-12-31T23:59:59Z"}, {"from": "nan"}, {"to": "\n"}):
        for extra in ({}, {"fence_id": fence_id}):
            resp = farm.api.get("/v1/time-in-fence", params={**params, **extra})
            assert resp.status_code == 422, (params, resp.status_code, resp.text[:200])
            assert "from" in _detail(resp) or "to" in _detail(resp), resp.text
    # the first day of the calendar is a period it can answer for
    resp = farm.api.get("/v1/time-in-fence", params={"to": "0001-01-02T00:00:00Z"})
    assert resp.status_code == 200 and resp.json()["from"].startswith("0001-01-01"), resp.text
    for ids in ({"fence_id": fence_id + "\n"}, {"device_id": "cow\n"}, {"fence_id": "x" * 201},
                {"device_id": "fences:deleted:never-registered"}):
        resp = farm.api.get("/v1/time-in-fence", params=ids)
        assert resp.status_code in (404, 422), (ids, resp.status_code, resp.text[:200])
        _detail(resp)


def test_devices_named_like_internal_keys_stay_data(stack, farm):
    """Device ids within the alphabet may look like internal keys: they are fields and members of the
    farm's own keys, never key names, so they neither reach nor break what they look like."""
    redis = stack.redis
    kinds = {k: redis.type(k) for k in ("devreg", "fences:deleted", "farms")}
    for device_id in ("devreg", "fences:deleted", "apikey:0", "farms", "routing", "..", "-1"):
        resp = farm.api.post("/v1/devices", json={"device_id": device_id})
        assert resp.status_code == 201, (device_id, resp.text)
        resp = farm.api.post("/v1/reports", json={"reports": [
            {"device_id": device_id, "ts": int(time.time() * 1000) - 1000, "lat": 47.0, "lon": 8.0}]})
        assert resp.status_code == 202 and resp.json()["accepted"] == 1, resp.text
        for path in (f"/v1/devices/{quote(device_id, safe='')}", f"/v1/devices/{quote(device_id, safe='')}%0A"):
            resp = farm.api.get(path)
            assert resp.status_code in (200, 404, 422), (path, resp.status_code, resp.text[:200])
        resp = farm.api.get("/v1/time-in-fence", params={"device_id": device_id})
        assert resp.status_code == 200, resp.text
    assert {k: redis.type(k) for k in kinds} == kinds
    for method, path in (("GET", "/v1/fences/devreg%0A"), ("GET", "/v1/fences/f-1%0A/devices"),
                         ("DELETE", "/v1/devices/devreg%0A/token"), ("DELETE", "/v1/webhooks/h%0A"),
                         ("DELETE", "/v1/fences/devreg%0A")):
        resp = farm.api.request(method, path)
        assert resp.status_code in (404, 422), (path, resp.status_code, resp.text[:200])


def test_absurd_limits_are_422(farm):
    for limit in ("99999999999999999999999", HUGE, "1e3", "nan", "inf", "1.5", "-1", "0"):
        for path, extra in (("/v1/events", {}), ("/v1/positions/history", {"device_id": "cow"})):
            resp = farm.api.get(path, params={"limit": limit, **extra})
            assert resp.status_code == 422 and "limit" in _detail(resp), (path, limit, resp.text[:200])
