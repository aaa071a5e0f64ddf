"""Real-browser test of the farmer's web UI (Debian chromium driven by playwright-core from Node).

The browser side lives in tests/ui/fence_flow.mjs; it talks to this test over stdin/stdout (one JSON
object per line). The browser signs in, draws a fence with the mouse and names it; this side checks the
fence through the API, posts GPS reports for a collar inside and then outside the fence, and the browser
must show the marker move (green -> red) and the ENTER / EXIT alerts; then rename, reshape and delete
from the UI, each checked through the API. Screenshots: test-artifacts/ui/*.png.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
UI_DIR = ROOT / "api" / "ui"
SCRIPT = ROOT / "tests" / "ui" / "fence_flow.mjs"
ARTIFACTS = ROOT / "test-artifacts" / "ui"
CHROMIUM = os.environ.get("HF_CHROMIUM", "/usr/bin/chromium")
NODE = shutil.which("node")
EVENT_WAIT_MS = 40_000

pytestmark = pytest.mark.stack


def _missing_tools() -> str | None:
    if not NODE:
        return "node is not installed"
    if not Path(CHROMIUM).exists():
        return f"chromium not found at {CHROMIUM} (make setup installs Debian's chromium)"
    if not (UI_DIR / "node_modules" / "playwright-core").is_dir():
        return "api/ui/node_modules/playwright-core missing (make setup runs npm install)"
    return None


class Browser:
    """The Node/playwright process and its line protocol."""

    def __init__(self, api_url: str, api_key: str):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, HF_API_URL=api_url, HF_API_KEY=api_key, HF_ARTIFACTS=str(ARTIFACTS),
                   HF_CHROMIUM=CHROMIUM, HF_UI_DIR=str(UI_DIR))
        self.proc = subprocess.Popen([NODE, str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
        self.started = time.time()
        self.msgs: queue.Queue = queue.Queue()
        self.logs: list = []
        self.stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self):
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                msg = {"log": "stdout", "text": line}
            if "log" in msg:
                self.logs.append(msg)
            else:
                self.msgs.put(msg)
        self.msgs.put({"error": f"browser script exited (rc={self.proc.wait()})"})

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip())

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def expect(self, step: str, timeout: float = 60.0) -> dict:
        try:
            msg = self.msgs.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"browser: no '{step}' within {timeout}s\n{self.diagnostics()}")
        if "error" in msg:
            pytest.fail(f"browser failed while waiting for '{step}': {msg['error']}\n{self.diagnostics()}")
        print(f"[ui +{time.time() - self.started:.1f}s] {json.dumps(msg)}", flush=True)
        assert msg.get("step") == step, f"expected step {step!r}, got {msg!r}"
        return msg

    def diagnostics(self) -> str:
        logs = "\n".join(json.dumps(m) for m in self.logs[-30:])
        err = "\n".join(self.stderr[-30:])
        return f"--- browser log ---\n{logs}\n--- stderr ---\n{err}\nscreenshots: {ARTIFACTS}"

    def close(self):
        try:
            if self.proc.poll() is None:
                self.send(cmd="quit")
                self.proc.wait(timeout=30)
        except Exception:
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _ring_centroid_inside(geometry: dict) -> tuple[float, float]:
    from shapely.geometry import shape

    poly = shape(geometry)
    c = poly.centroid
    if not poly.contains(c):
        c = poly.representative_point()
    return c.x, c.y


def test_farmer_draws_fence_and_sees_exit_alert(stack):
    missing = _missing_tools()
    if missing:
        pytest.skip(missing)

    api_url = stack.api_url.rstrip("/")
    _farm_id, key = stack.new_farm()
    farm = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=15)

    # The page itself and its assets are served by the API.
    r = httpx.get(api_url + "/", timeout=10)
    assert r.status_code == 200 and "herdfence" in r.text and "/ui/app.js" in r.text
    for asset in ("/ui/app.js", "/ui/style.css", "/vendor/leaflet/leaflet.js", "/vendor/geoman/leaflet-geoman.min.js"):
        assert httpx.get(api_url + asset, timeout=10).status_code == 200, asset

    fence_name = "North paddock " + uuid.uuid4().hex[:4]
    device_id = "cow-ui-" + uuid.uuid4().hex[:6]

    b = Browser(api_url, key)
    try:
        signed = b.expect("signed_in", timeout=90)
        assert signed["wrong_key_message"], "a wrong key must show an error message"
        assert signed["tile_note"], "unreachable map tiles must be reported on the map (and not break it)"

        # 1. draw the fence with the mouse and name it; the API must have it
        b.send(cmd="draw", name=fence_name)
        drawn = b.expect("fence_drawn", timeout=60)
        fences = farm.get("/v1/fences").json()["features"]
        mine = [f for f in fences if (f.get("properties") or {}).get("name") == fence_name]
        assert len(mine) == 1, f"fence not saved through the API: {fences!r}"
        fence = mine[0]
        fence_id = str(fence["id"])
        assert fence_id == drawn["fence_id"]
        assert fence["geometry"]["type"] == "Polygon"
        ring = fence["geometry"]["coordinates"][0]
        assert len(ring) == 5 and ring[0] == ring[-1], f"expected 4 clicked vertices + closing point: {ring!r}"

        lon_in, lat_in = _ring_centroid_inside(fence["geometry"])
        lons = [p[0] for p in ring]
        lats = [p[1] for p in ring]
        lon_out = max(lons) + (max(lons) - min(lons)) * 0.6   # east of the fence, still on screen
        lat_out = lat_in

        # 2. a collar reports twice inside (debounce) -> green marker + ENTER alert
        dev = farm.post("/v1/devices", json={"device_id": device_id, "herd": "north"})
        assert dev.status_code == 201, dev.text
        collar = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {dev.json()['token']}"}, timeout=15)
        t0 = int(time.time() * 1000)

        def post(points, start_ms):
            reps = [{"device_id": device_id, "ts": start_ms + i * 1000, "lat": la, "lon": lo, "battery": 81 - i}
                    for i, (lo, la) in enumerate(points)]
            res = collar.post("/v1/reports", json={"reports": reps})
            assert res.status_code == 202, res.text
            assert res.json()["accepted"] == len(reps), res.text

        post([(lon_in, lat_in), (lon_in + 1e-6, lat_in)], t0)
        b.send(cmd="wait_device", device_id=device_id, state="inside", alert="enter", tab="herd",
               timeout_ms=EVENT_WAIT_MS, screenshot="04-cow-inside")
        inside = b.expect("device_inside", timeout=EVENT_WAIT_MS / 1000 + 30)
        assert inside["alert"] and device_id in inside["alert"]

        # 3. it walks out: two reports outside -> red marker moved + EXIT alert with flash
        post([(lon_out, lat_out), (lon_out + 1e-6, lat_out)], t0 + 5000)
        b.send(cmd="wait_device", device_id=device_id, state="outside", alert="exit", tab="alerts",
               timeout_ms=EVENT_WAIT_MS, screenshot="05-cow-left-exit-alert")
        out = b.expect("device_outside", timeout=EVENT_WAIT_MS / 1000 + 30)
        assert out["moved_px"] is None or out["moved_px"] > 20, f"marker did not move: {out!r}"
        assert out["flash"] is True and out["last_exit"], f"no EXIT flash: {out!r}"
        assert device_id in out["alert"] and "left" in out["alert"]
        assert out["sse_events"] >= 1, "no fence event arrived over /v1/events/stream (only by polling)"
        events = farm.get("/v1/events", params={"device_id": device_id}).json()["events"]
        assert [e["type"] for e in events if e["fence_id"] == fence_id][-2:] == ["enter", "exit"], events

        # 4. phone-sized screen with the herd on it
        b.send(cmd="mobile")
        b.expect("mobile_ok", timeout=90)

        # 5. rename, reshape and delete from the UI, each checked through the API
        new_name = fence_name + " (spring)"
        b.send(cmd="rename", fence_id=fence_id, name=new_name)
        b.expect("renamed", timeout=60)
        got = farm.get(f"/v1/fences/{fence_id}").json()
        assert got["properties"]["name"] == new_name

        b.send(cmd="edit_shape", fence_id=fence_id)
        b.expect("shape_saved", timeout=60)
        reshaped = farm.get(f"/v1/fences/{fence_id}").json()
        assert reshaped["properties"]["name"] == new_name
        assert reshaped["geometry"]["coordinates"] != fence["geometry"]["coordinates"], "shape unchanged"

        b.send(cmd="delete", fence_id=fence_id)
        b.expect("deleted", timeout=60)
        assert farm.get(f"/v1/fences/{fence_id}").status_code == 404

        b.send(cmd="quit")
        done = b.expect("done", timeout=60)
        assert done["page_errors"] == [], f"uncaught errors in the page: {done['page_errors']}"
    finally:
        b.close()
