"""Pull benchmark clients: wrk (C, keep-alive, a Lua script cycling through a prepared request mix) when
installed — a Python client cannot saturate the API on 2 cores — else an asyncio httpx client."""
from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import shapely

from loadgen.bench_stack import say

PERCENTILES = (1, 10, 25, 50, 75, 90, 95, 99, 99.9)

_LUA = r"""
local reqs, n, i = {}, 0, 0
function init(args)
  for line in io.lines("@REQS@") do
    local m, p, k, b = line:match("^(%S+)\t(%S+)\t(%S+)\t(.*)$")
    local h = {["Authorization"] = "Bearer " .. k}
    if @NOCACHE@ then h["Cache-Control"] = "no-cache" end
    if m == "POST" then h["Content-Type"] = "application/json" else b = nil end
    n = n + 1
    reqs[n] = wrk.format(m, p, h, b)
  end
  i = math.random(n)
end
function request()
  i = i % n + 1
  return reqs[i]
end
function done(summary, latency, requests)
  local f = io.open("@OUT@", "w")
  local e = summary.errors
  f:write(string.format('{"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, ' ..
    '"status": %d, "timeout": %d, "percentiles_us": {', summary.requests, summary.duration, e.connect,
    e.read, e.write, e.status, e.timeout))
  local ps = {@PCTS@}
  for j, q in ipairs(ps) do
    if j > 1 then f:write(", ") end
    f:write(string.format('"%s": %d', tostring(q), latency:percentile(q)))
  end
  f:write("}}")
  f:close()
end
"""


def build_requests(sim, loaded, n: int = 4_000, seed: int = 0) -> list[tuple[str, str, str, str]]:
    """(method, path, key, body) — half fence-membership reads, half query-within on an area around a
    random fence (its envelope grown by ~50 m), each with its farm's key."""
    rng = random.Random(seed)
    fences = sim.fences
    out = []
    for k in range(n):
        f = fences[rng.randrange(len(fences))]
        farm, fence_id = loaded.fence_real[f.fence_id]
        key = loaded.farm_keys[farm]
        if k % 2 == 0:
            out.append(("GET", f"/v1/fences/{fence_id}/devices", key, ""))
        else:
            minx, miny, maxx, maxy = shapely.bounds(f.geometry).tolist()
            dx, dy = 0.0007, 0.00045
            ring = [[minx - dx, miny - dy], [maxx + dx, miny - dy], [maxx + dx, maxy + dy],
                    [minx - dx, maxy + dy], [minx - dx, miny - dy]]
            ring = [[round(x, 7), round(y, 7)] for x, y in ring]
            out.append(("POST", "/v1/query/within", key,
                        json.dumps({"geometry": {"type": "Polygon", "coordinates": [ring]}}, separators=(",", ":"))))
    return out


def run(base_url: str, requests: list, seconds: float, connections: int, client: str = "auto",
        progress: bool = True, no_cache: bool = False) -> dict:
    """`no_cache`: every request says `Cache-Control: no-cache`, so each answer is read from Redis
    (the API's per-worker answer cache is bypassed): the cost of a query when the herd keeps moving."""
    # a quick check that every kind of request works before measuring
    import httpx
    with httpx.Client(base_url=base_url, timeout=30) as c:
        for m, p, k, b in requests[:4]:
            r = c.request(m, p, headers={"Authorization": f"Bearer {k}", "Content-Type": "application/json"},
                          content=b or None)
            if r.status_code != 200:
                say(f"warning: {m} {p} answered {r.status_code}: {r.text[:200]}")
    if client in ("auto", "wrk") and not shutil.which("wrk"):
        # a Python client saturates itself long before the server (648 q/s measured that way, 33k with
        # wrk): never report that silently as the server's figure
        raise SystemExit("herdfence bench pull: wrk is not installed (make setup installs it); "
                         "--client httpx measures with a Python client instead, far below the server's capacity")
    use_wrk = client in ("auto", "wrk")
    if use_wrk:
        return _run_wrk(base_url, requests, seconds, connections, no_cache)
    return asyncio.run(_run_httpx(base_url, requests, seconds, connections, progress, no_cache))


def _run_wrk(base_url: str, requests: list, seconds: float, connections: int, no_cache: bool = False) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="herdfence-wrk-"))
    reqs, out, script = tmp / "requests.tsv", tmp / "out.json", tmp / "mix.lua"
    reqs.write_text("".join(f"{m}\t{p}\t{k}\t{b}\n" for m, p, k, b in requests))
    script.write_text(_LUA.replace("@REQS@", str(reqs)).replace("@OUT@", str(out))
                      .replace("@PCTS@", ", ".join(str(q) for q in PERCENTILES))
                      .replace("@NOCACHE@", "true" if no_cache else "false"))
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{int(round(seconds))}s", "--timeout", "5s", "-s", str(script), base_url]
    say("running " + " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    say(done.stdout.strip().replace("\n", "\n  "))
    res = json.loads(out.read_text())
    shutil.rmtree(tmp, ignore_errors=True)
    dur = res["duration_us"] / 1e6
    errors = res["connect"] + res["read"] + res["write"] + res["status"] + res["timeout"]
    pct = {str(q): round(v / 1000.0, 2) for q, v in zip(PERCENTILES, res["percentiles_us"].values())}
    return {"client": "wrk 4.1 (1 thread, keep-alive, Lua request mix)", "queries_per_s": round(res["requests"] / dur, 1),
            "p50": pct["50"], "p99": pct["99"], "errors": errors, "requests": res["requests"], "seconds": round(dur, 2),
            "percentiles": pct, "error_detail": {k: res[k] for k in ("connect", "read", "write", "status", "timeout")}}


async def _run_httpx(base_url: str, requests: list, seconds: float, connections: int, progress: bool,
                     no_cache: bool = False) -> dict:
    import httpx
    lat: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)

    async with httpx.AsyncClient(base_url=base_url, timeout=5, limits=limits) as c:
        async def worker(w: int) -> None:
            nonlocal errors
            i = w * 97
            while time.perf_counter() < deadline:
                m, p, k, b = requests[i % len(requests)]
                i += 1
                t = time.perf_counter()
                try:
                    headers = {"Authorization": f"Bearer {k}", "Content-Type": "application/json"}
                    if no_cache:
                        headers["Cache-Control"] = "no-cache"
                    r = await c.request(m, p, headers=headers, content=b or None)
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                lat.append((time.perf_counter() - t) * 1000)
                errors += not ok
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(connections)))
        dur = time.perf_counter() - t0
    arr = np.array(lat)
    pct = {str(q): round(float(np.percentile(arr, q)), 2) for q in PERCENTILES} if len(arr) else {}
    return {"client": f"httpx asyncio ({connections} keep-alive connections)", "queries_per_s": round(len(arr) / dur, 1),
            "p50": pct.get("50"), "p99": pct.get("99"), "errors": errors, "requests": len(arr),
            "seconds": round(dur, 2), "percentiles": pct}
