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
PHONE_SCRIPT = ROOT / "tests" / "ui" / "phone_flow.mjs"
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

    def __init__(self, api_url: str, api_key: str, script: Path = SCRIPT):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, HF_API_URL=api_url, HF_API_KEY=api_key, HF_ARTIFACTS=str(ARTIFACTS),
                   HF_CHROMIUM=CHROMIUM, HF_UI_DIR=str(UI_DIR))
        self.proc = subprocess.Popen([NODE, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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


def _publish_screenshot(shot: str, name: str) -> None:
    """A screenshot of a flow that passed becomes the README's picture of the UI (docs/img/NAME), so
    the picture shows the UI as it is."""
    source = ARTIFACTS / f"{shot}.png"
    assert source.stat().st_size > 10_000, f"screenshot {source} is missing or empty"
    target = ROOT / "docs" / "img" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())


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
    assert r.status_code == 200 and "herdfence" in r.text and '<script type="module" src="/ui/js/main.js">' in r.text
    modules = sorted(p.name for p in (UI_DIR / "js").glob("*.js"))
    assert {"main.js", "api.js", "map.js", "fences.js", "herd.js", "alerts.js"} <= set(modules), modules
    for asset in [f"/ui/js/{m}" for m in modules] + ["/ui/style.css", "/vendor/leaflet/leaflet.js",
                                                     "/vendor/geoman/leaflet-geoman.min.js", "/vendor/axe/axe.min.js"]:
        got = httpx.get(api_url + asset, timeout=10)
        assert got.status_code == 200, asset
        if asset.endswith(".js"):   # module scripts load only with a JavaScript MIME type
            assert "javascript" in got.headers["content-type"], (asset, got.headers["content-type"])
    # the page's CSP allows only its own scripts: no inline script, no other origin
    csp = r.headers["content-security-policy"]
    assert "script-src 'self';" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert "<script>" not in r.text and " on" + "click=" not in r.text

    fence_name = "North paddock " + uuid.uuid4().hex[:4]
    device_id = "cow-ui-" + uuid.uuid4().hex[:6]

    b = Browser(api_url, key)
    try:
        signed = b.expect("signed_in", timeout=90)
        assert signed["wrong_key_message"], "a wrong key must show an error message"
        assert signed["tile_note"], "unreachable map tiles must be reported on the map (and not break it)"
        assert signed["axe_login"] == [], f"axe on the desktop sign-in page: {signed['axe_login']}"
        assert signed["axe_app"] == [], f"axe on the desktop app: {signed['axe_app']}"

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
        assert out["axe"] == [], f"axe on the desktop app with alerts: {out['axe']}"
        events = farm.get("/v1/events", params={"device_id": device_id}).json()["events"]
        assert [e["type"] for e in events if e["fence_id"] == fence_id][-2:] == ["enter", "exit"], events
        _publish_screenshot("05-cow-left-exit-alert", "ui-desktop.png")

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


def _wait_event(farm: httpx.Client, device_id: str, fence_id: str, kind: str, timeout: float) -> dict | None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for e in farm.get("/v1/events", params={"device_id": device_id}).json()["events"]:
            if e["type"] == kind and e["fence_id"] == fence_id:
                return e
        time.sleep(0.5)
    return None


def _edge_point(ring, inset_m: float) -> tuple[float, float]:
    """A point `inset_m` inside the fence from its edge due east of the centroid."""
    import math

    from shapely.geometry import LineString, Polygon

    poly = Polygon(ring)
    c = poly.representative_point()
    lon_m = 111_320.0 * math.cos(math.radians(c.y))
    ray = LineString([(c.x, c.y), (max(p[0] for p in ring) + 1, c.y)])
    edge_lon = min(pt[0] for pt in ray.intersection(poly.exterior).coords)
    return edge_lon - inset_m / lon_m, c.y


def test_farmer_phone_flow_by_touch(stack):
    """The whole flow on a 390×844 touch screen: sign in, draw a fence by tapping corners near the map's
    top and right edges (nothing may cover them), undo a corner, name it with an approach warning, see
    ENTER / APPROACH / EXIT alerts, the herd at a glance and time in paddock, plan grazing strips and
    follow them across their windows, rename and delete; axe-core finds no serious or critical issue."""
    missing = _missing_tools()
    if missing:
        pytest.skip(missing)
    api_url = stack.api_url.rstrip("/")
    farm_id, key = stack.new_farm()
    farm = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=15)
    fence_name = "Phone paddock " + uuid.uuid4().hex[:4]
    device_id = "cow-phone-" + uuid.uuid4().hex[:6]

    b = Browser(api_url, key, PHONE_SCRIPT)
    try:
        signed = b.expect("signed_in", timeout=90)
        assert signed["axe_login"] == [], f"axe on the phone sign-in page: {signed['axe_login']}"
        assert signed["axe_app"] == [], f"axe on the phone app: {signed['axe_app']}"
        assert signed["small_targets"] == [], f"touch targets under 44 px: {signed['small_targets']}"

        # 1. draw by tapping corners near the top and the right edge, undo a slip, name it with warn_m
        b.send(cmd="draw", name=fence_name, warn_m=15)
        drawn = b.expect("fence_drawn", timeout=60)
        assert drawn["hits"] == ["map"] * 5, f"a control covered the map where a corner was tapped: {drawn['hits']}"
        assert drawn["tooltips"] == [0] * 4, f"a tooltip showed while drawing by touch: {drawn['tooltips']}"
        assert (drawn["corners_before_undo"], drawn["corners_after_undo"]) == (5, 4)
        assert drawn["small_targets"] == [], f"touch targets under 44 px while drawing: {drawn['small_targets']}"
        assert drawn["axe_dialog"] == [], f"axe on the name dialog: {drawn['axe_dialog']}"
        assert "warns at 15 m" in drawn["meta"]
        fence_id = drawn["fence_id"]
        fence = farm.get(f"/v1/fences/{fence_id}").json()
        assert fence["properties"]["name"] == fence_name and fence["properties"]["warn_m"] == 15
        ring = fence["geometry"]["coordinates"][0]
        assert len(ring) == 5 and ring[0] == ring[-1], f"4 tapped corners + closing point expected: {ring!r}"

        # 2. a collar inside (ENTER), near the edge (APPROACH), then outside (EXIT)
        dev = farm.post("/v1/devices", json={"device_id": device_id, "herd": "east"})
        assert dev.status_code == 201, dev.text
        collar = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {dev.json()['token']}"}, timeout=15)
        clock = [int(time.time() * 1000) - 60_000]

        def post(lon, lat, battery=80):
            reps = []
            for i in range(2):      # twice: the fence's debounce
                clock[0] += 1000
                reps.append({"device_id": device_id, "ts": clock[0], "lat": lat, "lon": lon + i * 1e-7,
                             "battery": battery})
            res = collar.post("/v1/reports", json={"reports": reps})
            assert res.status_code == 202 and res.json()["accepted"] == 2, res.text

        lon_in, lat_in = _ring_centroid_inside(fence["geometry"])
        post(lon_in, lat_in)
        b.send(cmd="wait_alert", device_id=device_id, type="enter", timeout_ms=EVENT_WAIT_MS)
        enter = b.expect("alert_enter", timeout=EVENT_WAIT_MS / 1000 + 30)
        assert device_id in enter["text"] and "entered" in enter["text"]

        lon_edge, lat_edge = _edge_point(ring, 4.0)
        post(lon_edge, lat_edge)
        # the job's own APPROACH (warn_m 15, the point 4 m inside the edge)
        assert _wait_event(farm, device_id, fence_id, "approach", 60) is not None, "no APPROACH from the job"
        b.send(cmd="wait_alert", device_id=device_id, type="approach", timeout_ms=EVENT_WAIT_MS)
        near = b.expect("alert_approach", timeout=EVENT_WAIT_MS / 1000 + 30)
        assert "near the edge" in near["text"] and near["flash"] is False, near

        lons = [p[0] for p in ring]
        post(max(lons) + (max(lons) - min(lons)) * 0.3, lat_in, battery=12)
        b.send(cmd="wait_alert", device_id=device_id, type="exit", timeout_ms=EVENT_WAIT_MS)
        left = b.expect("alert_exit", timeout=EVENT_WAIT_MS / 1000 + 30)
        assert device_id in left["text"] and "left" in left["text"] and left["flash"] is True, left
        assert near["icon"] != left["icon"], "APPROACH must look apart from (quieter than) EXIT"
        _publish_screenshot("phone-05-alert-exit", "ui-phone.png")

        # 3. the herd at a glance and time in paddock
        b.send(cmd="herd", device_id=device_id)
        herd = b.expect("herd", timeout=60)
        assert herd["glance"]["outside"] >= 1 and herd["glance"]["battery"] >= 1, herd
        assert herd["outside_rows"] >= 1 and herd["tip_seconds"] > 0, herd
        assert herd["axe_herd"] == [], f"axe on the herd tab: {herd['axe_herd']}"

        # 4. a strip plan: 3 strips of 1 h, the first started 30 min ago
        start = time.gmtime(time.time() - 1800)
        b.send(cmd="plan", fence_id=fence_id, strips=3, hours=1, start_local=time.strftime("%Y-%m-%dT%H:%M", start))
        planned = b.expect("planned", timeout=60)
        strips = sorted((f for f in farm.get("/v1/fences").json()["features"]
                         if (f.get("properties") or {}).get("plan_of") == fence_id),
                        key=lambda f: f["properties"]["strip"])
        assert [f["properties"]["strip"] for f in strips] == [1, 2, 3], strips
        for a, nxt in zip(strips, strips[1:]):
            assert a["properties"]["active_to"] == nxt["properties"]["active_from"]
        assert "strip 1/3" in (planned["now"] or "") and "strip 2/3" in (planned["next"] or ""), planned
        assert "active" in planned["windows"] and "upcoming" in planned["windows"], planned
        assert planned["small_targets"] == [] and planned["axe_form"] == [], planned
        assert "Strip 1 · now" in planned["labels"] and fence_name not in planned["labels"], \
            "the map labels the active strip, not the paddock it was cut from"

        # ... and follow it into the next window (the clock is moved through the API, not waited for)
        past = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
        s1, s2 = strips[0], strips[1]
        for f, props in ((s1, {"active_to": past}), (s2, {"active_from": past})):
            res = farm.put(f"/v1/fences/{f['id']}", json={"type": "Feature", "geometry": f["geometry"],
                                                           "properties": {**f["properties"], **props}})
            assert res.status_code == 200, res.text
        b.send(cmd="reload_plan", want_now="strip 2/3")
        moved = b.expect("plan_reloaded", timeout=60)
        assert "past" in moved["windows"] and "strip 3/3" in (moved["next"] or ""), moved
        assert "Strip 2 · now" in moved["labels"] and "Strip 1 · now" not in moved["labels"], moved

        # 5. move a corner with a finger, rename with a new warning distance, then delete, by touch
        before = farm.get(f"/v1/fences/{fence_id}").json()["geometry"]["coordinates"]
        b.send(cmd="edit_shape", fence_id=fence_id)
        b.expect("shape_saved", timeout=60)
        assert farm.get(f"/v1/fences/{fence_id}").json()["geometry"]["coordinates"] != before, "corner not moved"
        b.send(cmd="rename", fence_id=fence_id, name=fence_name + " (spring)", warn_m=25)
        renamed = b.expect("renamed", timeout=60)
        got = farm.get(f"/v1/fences/{fence_id}").json()["properties"]
        assert got["name"] == fence_name + " (spring)" and got["warn_m"] == 25 and "25 m" in renamed["meta"]
        b.send(cmd="delete", fence_id=fence_id)
        b.expect("deleted", timeout=60)
        assert farm.get(f"/v1/fences/{fence_id}").status_code == 404

        b.send(cmd="quit")
        done = b.expect("done", timeout=60)
        assert done["page_errors"] == [], f"uncaught errors in the page: {done['page_errors']}"
    finally:
        b.close()
