"""Analyst and integration features on the embedded stack: history, GeoParquet export, webhooks,
SSE, metrics, rate limits, docs."""
from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import geopandas

from tests.conftest import wait_for
from tests.farmkit import Farm, square

INSIDE, INSIDE2, OUTSIDE = (8.505, 47.005), (8.506, 47.006), (8.505, 47.05)


def test_history_and_geoparquet_export(stack, tmp_path):
    farm = Farm(stack)
    farm.device("cow-h1", herd="south")
    farm.device("cow-h2", herd="west")
    stamps = farm.report("cow-h1", INSIDE, INSIDE2, OUTSIDE)
    farm.report("cow-h2", INSIDE)
    farm.wait_seen("cow-h1", stamps[-1])
    history = wait_for(lambda: (lambda r: r if len(r["features"]) == 3 else None)(
        farm.api.get("/v1/positions/history", params={"herd": "south"}).json()), what="history of herd south")
    assert [f["geometry"]["coordinates"] for f in history["features"]] == [list(INSIDE), list(INSIDE2), list(OUTSIDE)]
    window = farm.api.get("/v1/positions/history", params={"device_id": "cow-h1", "from": stamps[1], "to": stamps[1]})
    assert len(window.json()["features"]) == 1
    out = tmp_path / "south.parquet"
    stack.cli("export", "--key", farm.key, "--herd", "south", str(out))
    frame = geopandas.read_parquet(out)
    assert len(frame) == 3 and set(frame["device_id"]) == {"cow-h1"} and frame.crs.to_epsg() == 4326
    other = Farm(stack, "other")
    assert other.api.get("/v1/positions/history", params={"herd": "south"}).json()["features"] == []


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[bytes, str]] = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["content-length"]))
        _Receiver.received.append((body, self.headers.get("x-herdfence-signature", "")))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_webhook_delivers_signed_events_and_sse_streams_them(stack):
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    farm = Farm(stack)
    fence_id = farm.fence(square(8.50, 47.00))
    hook = farm.api.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{server.server_port}/hook"}).json()
    assert farm.api.post("/v1/webhooks", json={"url": "ftp://nope"}).status_code == 422
    farm.device("cow-w")
    with farm.api.stream("GET", "/v1/events/stream", timeout=30) as sse:
        lines = sse.iter_lines()
        assert next(lines).startswith(":")
        farm.report("cow-w", INSIDE, INSIDE2)
        data = next(line for line in lines if line.startswith("data:"))
    event = json.loads(data[len("data:"):])
    assert (event["type"], event["fence_id"], event["device_id"]) == ("enter", fence_id, "cow-w")
    body, signature = wait_for(lambda: _Receiver.received and _Receiver.received[0], what="webhook delivery")
    assert json.loads(body)["event_id"] == event["event_id"]
    assert hmac.compare_digest(signature, "sha256=" + hmac.new(hook["secret"].encode(), body, hashlib.sha256).hexdigest())
    server.shutdown()


def test_metrics_docs_and_rate_limit(stack):
    farm = Farm(stack)
    text = stack.client(None).get("/metrics").text
    assert "herdfence_reports_accepted_total" in text and "herdfence_job_up 1" in text
    used = [line for line in text.splitlines() if line.startswith("herdfence_redis_used_memory_bytes{")]
    assert len(used) == 3 and all(int(line.rsplit(" ", 1)[1]) > 0 for line in used), used
    assert 'herdfence_redis_maxmemory_bytes{' in text
    # the worker's full garbage collections are counted (the worker froze its start-up heap)
    assert "herdfence_api_gc_full_seconds_count " in text and "herdfence_api_gc_full_seconds_max " in text
    spec = stack.client(None).get("/openapi.json").json()
    for path in ("/v1/fences", "/v1/fences/{fence_id}", "/v1/reports", "/v1/fences/{fence_id}/devices",
                 "/v1/query/within", "/v1/devices/{device_id}", "/v1/positions", "/v1/events",
                 "/v1/events/stream", "/v1/positions/history", "/v1/webhooks"):
        assert path in spec["paths"], path
    token = farm.device("cow-r")
    device = stack.client(token)
    codes = [device.post("/v1/reports", json={"reports": []}).status_code for _ in range(120)]
    assert 429 in codes and codes[0] == 202
