"""Soak: sustained push through the API at a fraction (default 80%) of the measured capacity for a long
time (default 10 minutes), on the running stack (`herdfence up --detach` first). A benchmark scenario,
not part of `make test`:

    .venv/bin/python -m loadgen.soak --minutes 10 --json soak.json           # HERDFENCE_* as for `up`

1. probe: push as fast as the API takes it for --probe-seconds; capacity = the rate the job processed
   (points/s from its heartbeats) and the API accepted, whichever is lower;
2. soak: push at --fraction x capacity with --workers clients (batches of --batch reports, device order
   kept per client) while sampling every 5 s: request latency, job lag (records not yet processed),
   points processed, RSS of the job (driver + JVM + Python workers) and of the API;
3. drain, then reconcile every ENTER/EXIT against loadgen.truth (lost / duplicated).

Writes one JSON object: capacity, target rate, achieved rate, request latency p50/p99 per minute and
overall, lag per minute, RSS first/last/max per component, lost/duplicated.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import zlib
from pathlib import Path

import httpx
import numpy as np
import orjson
import pandas as pd

from fencing.model.heartbeat import Heartbeat, read_heartbeat

from loadgen.herd import SimConfig, simulate
from loadgen.records import Pacer
from loadgen.reference import expected_events  # inferred and late events too
from loadgen.truth import reconcile


def _rss_mb(pgid: int | None) -> float:
    """Resident memory of every live process in the group (a component leads its own group)."""
    if not pgid:
        return 0.0
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_bytes().rsplit(b")", 1)[1].split()
            if int(fields[2]) == pgid:
                total += int(fields[21]) * 4096
        except (OSError, IndexError, ValueError):
            continue
    return round(total / 2**20, 1)


def _pid(settings, name: str) -> int | None:
    try:
        return int((settings.run_dir / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None


class Pusher:
    """Posts laps of the simulated tracks (each lap shifted later in time) at a target rate."""

    def __init__(self, api_url: str, key: str, reports: pd.DataFrame, batch: int, workers: int):
        self.api_url, self.key, self.batch, self.workers = api_url, key, batch, workers
        self.reports = reports
        self.span_ms = int(reports["ts"].max() - reports["ts"].min()) + 60_000
        dev = reports["device_id"].to_numpy(dtype=object)
        shard = np.array([zlib.crc32(d.encode()) % workers for d in dev])
        self.rows = [np.flatnonzero(shard == w) for w in range(workers)]
        self.cols = {c: reports[c].tolist() for c in ("device_id", "ts", "lat", "lon", "battery")}
        self.latencies: list[tuple[float, float]] = []    # (wall time, seconds)
        self.sent = self.failed = 0
        self.pacer = Pacer(None)                           # None: as fast as possible (the probe)
        self.stop = threading.Event()
        self.laps_done = 0
        self._lock = threading.Lock()

    @property
    def rate(self) -> float:
        return self.pacer.rate or 0.0

    def set_rate(self, rate: float) -> None:
        self.pacer.set_rate(rate)

    def _worker(self, w: int, laps: int) -> None:
        c = self.cols
        with httpx.Client(base_url=self.api_url, headers={"Authorization": f"Bearer {self.key}",
                                                          "content-type": "application/json"}, timeout=30) as client:
            for lap in range(laps):
                shift = lap * self.span_ms
                rows = self.rows[w]
                for i in range(0, len(rows), self.batch):
                    if self.stop.is_set():
                        return
                    part = rows[i:i + self.batch]
                    body = orjson.dumps({"reports": [
                        {"device_id": c["device_id"][r], "ts": c["ts"][r] + shift, "lat": c["lat"][r],
                         "lon": c["lon"][r], "battery": c["battery"][r]} for r in part]})
                    self.pacer.admit(len(part))
                    for attempt in range(8):
                        t0 = time.perf_counter()
                        try:
                            resp = client.post("/v1/reports", content=body)
                            ok = resp.status_code == 202
                        except httpx.HTTPError:
                            ok = False
                        if ok:
                            break
                        time.sleep(0.2 * 2 ** attempt)
                    with self._lock:
                        self.latencies.append((time.time(), time.perf_counter() - t0))
                        if ok:
                            self.sent += len(part)
                        else:
                            self.failed += len(part)
            with self._lock:
                self.laps_done += 1

    def run(self, laps: int) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._worker, args=(w, laps), daemon=True) for w in range(self.workers)]
        for t in threads:
            t.start()
        return threads


def _pcts(values) -> dict:
    if not len(values):
        return {"p50": None, "p99": None}
    return {"p50": round(float(np.percentile(values, 50)) * 1000, 1),
            "p99": round(float(np.percentile(values, 99)) * 1000, 1)}


def main(argv: list[str] | None = None) -> int:
    from api import tenancy
    from fencing.model.redis_conn import connect
    from fencing.config import load_settings
    from fencing.model.timeutil import iso

    p = argparse.ArgumentParser(prog="python -m loadgen.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--fraction", type=float, default=0.8)
    p.add_argument("--capacity", type=float, default=None, help="points/s; skip the probe")
    p.add_argument("--probe-seconds", type=float, default=40.0)
    p.add_argument("--devices", type=int, default=2000)
    p.add_argument("--fences", type=int, default=24)
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--json", dest="out", default=None)
    args = p.parse_args(argv)

    settings = load_settings()
    redis = connect(settings)
    api = settings.api_url
    farm_id, key = tenancy.create_farm(redis, f"soak {time.strftime('%H:%M:%S')}")
    sim = simulate(SimConfig(seed=42, farms=2, fences_per_farm=max(1, args.fences // 2), devices=args.devices,
                             steps=120, silent_fraction=0.0))
    reports = sim.reports.copy()
    reports["device_id"] = "soak-" + reports["device_id"].astype(str)
    fences = []
    with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
        import dataclasses
        for f in sim.fences:
            r = c.post("/v1/fences", json={"type": "Feature", "properties": dict(f.geojson["properties"]),
                                           "geometry": f.geojson["geometry"]})
            r.raise_for_status()
            fences.append(dataclasses.replace(f, fence_id=r.json()["id"], farm_id=farm_id))
    ids = sorted(reports["device_id"].unique())
    tenancy.register_devices_bulk(redis, [(farm_id, d, "north") for d in ids])

    def beat() -> Heartbeat:
        return read_heartbeat(redis) or Heartbeat(batch_id=-1, time=0.0, lag=1)

    laps_total = 1000
    pusher = Pusher(api, key, reports, args.batch, args.workers)
    threads = pusher.run(laps_total)
    capacity = args.capacity
    if capacity is None:
        print(f"probe: pushing as fast as possible for {args.probe_seconds:.0f} s", file=sys.stderr)
        b0, s0, t0 = beat().points_total, pusher.sent, time.monotonic()
        time.sleep(args.probe_seconds)
        b1, s1, t1 = beat().points_total, pusher.sent, time.monotonic()
        api_rate, job_rate = (s1 - s0) / (t1 - t0), max(0, b1 - b0) / (t1 - t0)
        capacity = min(api_rate, job_rate) if job_rate > 0 else api_rate
        print(f"probe: API accepted {api_rate:.0f}/s, job processed {job_rate:.0f}/s", file=sys.stderr)
    target = args.fraction * capacity
    pusher.set_rate(target)
    time.sleep(10)             # let the probe's backlog settle a little before measuring
    start_sent, start = pusher.sent, time.time()
    pusher.latencies.clear()
    samples = []
    end = start + args.minutes * 60
    while time.time() < end:
        time.sleep(5)
        b = beat()
        samples.append({"t": round(time.time() - start, 1), "lag": b.lag, "points_total": b.points_total,
                        "batch_s": b.duration_s, "rss_job_mb": _rss_mb(_pid(settings, "job")),
                        "rss_api_mb": _rss_mb(_pid(settings, "api")), "sent": pusher.sent})
        print(f"soak {samples[-1]}", file=sys.stderr)
    pusher.stop.set()
    for t in threads:
        t.join(60)
    seconds = time.time() - start
    lat = pusher.latencies
    per_minute = {}
    for wall, s in lat:
        per_minute.setdefault(int((wall - start) // 60), []).append(s)

    # drain: the job processes everything sent, then reconcile
    sent_df = []
    laps = pusher.laps_done
    drained = False
    deadline = time.time() + 300
    while time.time() < deadline:
        b = beat()
        if b.lag == 0 and time.time() - b.time < 5:
            time.sleep(3)
            if beat().lag == 0:
                drained = True
                break
        time.sleep(2)
    result = {"capacity_points_per_s": round(capacity, 1), "target_points_per_s": round(target, 1),
              "achieved_points_per_s": round((pusher.sent - start_sent) / seconds, 1), "seconds": round(seconds, 1),
              "devices": args.devices, "fences": len(fences), "failed_reports": pusher.failed,
              "request_latency_ms": _pcts([s for _, s in lat]),
              "request_latency_ms_per_minute": {m: _pcts(v) for m, v in sorted(per_minute.items())},
              "lag_per_minute_max": {}, "rss_mb": {}, "drained": drained, "samples": samples}
    for s in samples:
        m = int(s["t"] // 60)
        result["lag_per_minute_max"][m] = max(result["lag_per_minute_max"].get(m, 0), s["lag"] or 0)
    for comp in ("job", "api"):
        values = [s[f"rss_{comp}_mb"] for s in samples]
        if values:
            result["rss_mb"][comp] = {"first": values[0], "last": values[-1], "max": max(values)}
    # reconcile only complete laps are deterministic per device order; events are checked for duplicates
    with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
        ev = c.get("/v1/events", params={"limit": 10000}).json()["events"]
    observed = pd.DataFrame(ev, columns=["event_id", "type", "device_id", "fence_id", "ts"])
    result["events_observed"] = len(observed)
    result["duplicate_event_ids"] = int(observed["event_id"].duplicated().sum())
    if laps >= 1 and len(observed) < 10000:
        frames = [reports.assign(ts=reports["ts"] + lap * pusher.span_ms) for lap in range(laps)]
        sent_df = pd.concat(frames, ignore_index=True)
        expected = expected_events(sent_df, fences, {d: farm_id for d in ids})
        from loadgen.truth import to_epoch_ms
        cutoff = reports["ts"].min() + laps * pusher.span_ms
        observed_ms = to_epoch_ms(observed["ts"]) if len(observed) else observed["ts"]
        first_laps = reconcile(expected[expected["ts"] < cutoff], observed[observed_ms < cutoff])
        result["reconcile_complete_laps"] = first_laps
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    del iso
    return 0


if __name__ == "__main__":
    sys.exit(main())
