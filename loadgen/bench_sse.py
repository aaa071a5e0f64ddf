"""Many open maps: N live event streams (`GET /v1/events/stream`) held while the pull mix runs.

A separate process (`python -m loadgen.bench_sse hold …`) opens the streams with asyncio (one
connection each, spread over the farms' keys), prints one line when every stream is open and then
one JSON line per event received: the stream, the event id and the wall-clock time. Meanwhile the
benchmark moves one sentinel animal per farm in and out of a fence (two reports per side, as the
debounce wants) and notes when it posted; the delay of an event at a stream is its arrival minus the
post that caused it (the job's latency included: what a farmer watching the map sees).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import numpy as np


@dataclass
class Received:
    stream: int
    event_id: str
    device_id: str
    at: float


async def _hold(base_url: str, keys: list[str], seconds: float) -> None:
    limits = httpx.Limits(max_connections=len(keys) + 8, max_keepalive_connections=0)
    opened = 0
    failed = 0
    reasons: dict[str, int] = {}
    all_open = asyncio.Event()
    out = sys.stdout

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=httpx.Timeout(30, read=None)) as c:
        async def one(i: int, key: str) -> None:
            nonlocal opened, failed
            try:
                async with c.stream("GET", "/v1/events/stream", headers={"Authorization": f"Bearer {key}"}) as r:
                    opened += r.status_code == 200
                    failed += r.status_code != 200
                    if r.status_code != 200:
                        why = f"HTTP {r.status_code}: {(await r.aread())[:80].decode(errors='replace')}"
                        reasons[why] = reasons.get(why, 0) + 1
                    if opened + failed == len(keys):
                        all_open.set()
                    if r.status_code != 200:
                        return
                    async for line in r.aiter_lines():
                        if line.startswith("data:"):
                            e = json.loads(line[5:])
                            out.write(json.dumps({"s": i, "id": e["event_id"], "d": e["device_id"],
                                                  "t": time.time()}) + "\n")
                            out.flush()
            except (httpx.HTTPError, asyncio.CancelledError) as err:
                failed += 1
                reasons[type(err).__name__] = reasons.get(type(err).__name__, 0) + 1
                if opened + failed >= len(keys):
                    all_open.set()
        tasks = [asyncio.create_task(one(i, k)) for i, k in enumerate(keys)]
        await asyncio.wait_for(all_open.wait(), 120)
        out.write(json.dumps({"open": opened, "failed": failed, "reasons": reasons}) + "\n")
        out.flush()
        await asyncio.sleep(seconds)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    out.flush()


def start_holder(base_url: str, keys: list[str], seconds: float) -> tuple[subprocess.Popen, dict]:
    """Start the holder process; returns it once every stream is open, with its first line. A thread
    drains its output from then on (a full pipe would block the holder's event loop)."""
    proc = subprocess.Popen([sys.executable, "-m", "loadgen.bench_sse", "hold", base_url, str(seconds)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdin.write("\n".join(keys) + "\n")
    proc.stdin.close()
    first = json.loads(proc.stdout.readline() or "{}")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    proc.lines, proc.reader = lines, reader          # type: ignore[attr-defined]
    return proc, first


def collect(proc: subprocess.Popen, grace_s: float = 5.0) -> list[Received]:
    """Give late events `grace_s` to arrive, stop the holder, read what it saw."""
    time.sleep(grace_s)
    proc.terminate()
    proc.wait()
    proc.reader.join(10)                              # type: ignore[attr-defined]
    out = []
    for line in proc.lines:                           # type: ignore[attr-defined]
        d = json.loads(line)
        out.append(Received(d["s"], d["id"], d["d"], d["t"]))
    return out


@dataclass
class Sentinel:
    """One animal per farm, walked in and out of one fence of its farm."""
    farm_key: str
    device_id: str
    inside: tuple[float, float]
    outside: tuple[float, float]


def walk(base_url: str, sentinels: list[Sentinel], seconds: float, step_s: float = 3.0) -> list[tuple[float, str]]:
    """Every `step_s`: each sentinel posts two reports on the other side of its fence. Returns
    (post time, device_id) per step and sentinel."""
    posts = []
    t_end = time.time() + seconds
    side = 0
    ts = int(time.time() * 1000) - 600_000
    with httpx.Client(base_url=base_url, timeout=10) as c:
        while time.time() < t_end:
            for s in sentinels:
                lon, lat = (s.inside, s.outside)[side % 2]
                body = {"reports": [{"device_id": s.device_id, "ts": ts + k * 1000, "lat": lat, "lon": lon}
                                    for k in range(2)]}
                t = time.time()
                r = c.post("/v1/reports", json=body, headers={"Authorization": f"Bearer {s.farm_key}"})
                if r.status_code == 202:
                    posts.append((t, s.device_id))
            ts += 10_000
            side += 1
            time.sleep(step_s)
    return posts


def delays(received: list[Received], posts: list[tuple[float, str]], stream_devices: dict[int, str]) -> dict:
    """Per received sentinel event: arrival − the latest post of that device before the arrival."""
    by_device: dict[str, list[float]] = {}
    for t, d in posts:
        by_device.setdefault(d, []).append(t)
    out = []
    per_stream: dict[int, int] = {}
    for r in received:
        times = by_device.get(r.device_id)
        if not times or stream_devices.get(r.stream) != r.device_id:
            continue
        i = int(np.searchsorted(times, r.at)) - 1
        if i >= 0:
            out.append(r.at - times[i])
            per_stream[r.stream] = per_stream.get(r.stream, 0) + 1
    arr = np.array(out) if out else np.array([np.nan])
    return {"events_received": len(out), "streams_with_events": len(per_stream),
            "delay_s": {"p50": round(float(np.nanpercentile(arr, 50)), 3),
                        "p99": round(float(np.nanpercentile(arr, 99)), 3),
                        "max": round(float(np.nanmax(arr)), 3)}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadgen.bench_sse")
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hold", help="hold one stream per key read from stdin (one key a line)")
    h.add_argument("base_url")
    h.add_argument("seconds", type=float)
    args = p.parse_args(argv)
    keys = [line.strip() for line in sys.stdin if line.strip()]
    asyncio.run(_hold(args.base_url, keys, args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
