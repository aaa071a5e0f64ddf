"""`herdfence bench fences`: does the per-point membership cost stay flat from 10k to 1M fences?

For each fence count N (e.g. 10,000 and 1,000,000):
  1. simulate N paddock fences (12 per farm) over a region that grows with N — constant density, like
     real farms: more farms, not denser paddocks — and M GPS points of grazing herds over the same
     region (a few devices per farm, so most points are on or near paddocks);
  2. bulk-load the fences into Redis Cluster (fencing.model.fence_store: bulk H3 covers + pipelined writes
     into the `{g:<group>}:fences` / `:ver` group keys), in chunks; load time, fences/s and INFO memory
     of every master;
  3. do what the job's tasks do: route the points by cell group to P partitions (fencing.stream.routing,
     aligned: a partition's groups live on one Redis master), and per partition load ONLY that
     partition's groups through FenceCache.refresh from Redis (cache load time, fences cached), then
     time FenceCache.match on the partition's points (best of `repeat`; ns/point, points/s); and, for
     FenceIndex.match's own scaling, the same points against ONE FenceIndex of the partition's fences
     (`one_index_ns_per_point`: no per-group calls);
  4. the vectorized limit (H3 cell of every point + plain STRtree over ALL fences in one process) and
     a check that the partitions' matches are exactly the limit's (point, fence) pairs.
`per_point_cost_ratio` = match ns/point at the largest N / at the smallest N; the bar is 2.

Redis: HERDFENCE_REDIS when set (the bench's keys are tagged and deleted afterwards), else a private
embedded cluster (deploy.redis_cluster) on --redis-port..+2 in a temp HERDFENCE_HOME, torn down after.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import resource
import secrets
import shlex
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from loadgen.bench_stack import machine, say

DEFAULT_PORT = 11101
BAR = 2.0
LOAD_CHUNK = 25_000


def _rss_peak_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


# --- Redis ---------------------------------------------------------------------------------------
@contextmanager
def bench_redis(port: int = DEFAULT_PORT):
    """Yields (cluster client, description, private). Private: 3 masters on port..port+2 (bus +10000)."""
    from redis.cluster import RedisCluster

    from deploy import redis_cluster
    from fencing.config import load_settings

    configured = load_settings()               # HERDFENCE_REDIS: an external cluster to measure
    external = configured.redis
    if external:
        host, p = configured.redis_nodes[0]
        client = RedisCluster(host=host, port=p, decode_responses=True, socket_timeout=60)
        yield client, {"kind": "external", "redis": external}, False
        return
    home = Path(tempfile.mkdtemp(prefix="herdfence-fencebench-"))
    settings = load_settings({"HERDFENCE_HOME": str(home), "HERDFENCE_EMBEDDED_REDIS_PORT": str(port)})
    say(f"starting a private Redis Cluster on 127.0.0.1:{port}-{port + 2} (HERDFENCE_HOME={home})")
    try:
        redis_cluster.up(settings)
        client = RedisCluster(host="127.0.0.1", port=port, decode_responses=True, socket_timeout=60)
        yield client, {"kind": "private", "redis": f"127.0.0.1:{port}", "masters": 3}, True
    finally:
        say("stopping the private Redis Cluster")
        redis_cluster.down(settings)
        shutil.rmtree(home, ignore_errors=True)


def masters_memory(redis) -> dict[str, dict]:
    """INFO memory of every master, by address."""
    import redis as redis_mod

    from fencing.stream.routing import slot_map
    out = {}
    for node in slot_map(redis)[1]:
        host, _, port = node.rpartition(":")
        info = redis_mod.Redis(host=host, port=int(port), socket_timeout=30).info("memory")
        out[node] = {"used_memory": int(info["used_memory"]), "used_memory_human": info["used_memory_human"],
                     "used_memory_rss": int(info.get("used_memory_rss", 0))}
    return out


def _flush_masters(redis) -> None:
    import redis as redis_mod

    from fencing.stream.routing import slot_map
    for node in slot_map(redis)[1]:
        host, _, port = node.rpartition(":")
        redis_mod.Redis(host=host, port=int(port), socket_timeout=120).flushall()


def _delete_bench_keys(redis, group_uids: dict[str, list[str]], farm_fences: dict[str, list[str]]) -> None:
    """External Redis: remove exactly what the bench wrote (its farms are tagged)."""
    from fencing.model import keys
    items = list(group_uids.items())
    for start in range(0, len(items), 5_000):
        pipe = redis.pipeline()
        for group, uids in items[start:start + 5_000]:
            pipe.hdel(keys.group_fences(group), *uids)
            pipe.incr(keys.group_version(group))
        pipe.execute()
    farms = list(farm_fences.items())
    for start in range(0, len(farms), 2_000):
        pipe = redis.pipeline()
        for farm, fids in farms[start:start + 2_000]:
            pipe.execute_command("DEL", *[keys.fence(farm, f) for f in fids])   # one slot: the farm's tag
            pipe.delete(keys.farm_fences(farm))
        pipe.execute()


def _one_index(cache, x, y, c, repeat: int, expect) -> tuple[float, float, bool]:
    """The partition's fences in ONE FenceIndex (each fence with its cells of all the partition's
    groups), matched with the same points: FenceIndex.match's own scaling, without the per-group
    shards of FenceCache.match. Returns (best match seconds, build seconds, same pairs as `expect`)."""
    from fencing.model.membership import FenceIndex
    t = time.perf_counter()
    parts: dict[str, list] = {}
    for loaded in cache.groups.values():
        for uid, cells in loaded.cells.items():
            parts.setdefault(uid, []).append(cells)
    one = FenceIndex()
    for uid, held in parts.items():
        one.upsert(uid, cache.geometry(uid), np.concatenate([i for i, _ in held]),
                   np.concatenate([b for _, b in held]))
    one.match(np.empty(0), np.empty(0), np.empty(0, np.uint64))
    build_s = time.perf_counter() - t
    best = float("inf")
    for _ in range(max(1, repeat)):
        t = time.perf_counter()
        pi, pu = one.match(x, y, c)
        best = min(best, time.perf_counter() - t)
    agrees = sorted(zip(pi.tolist(), pu.tolist())) == sorted(zip(expect[0].tolist(), expect[1].tolist()))
    return best, build_s, agrees


# --- one fence count -----------------------------------------------------------------------------
def simulate_region(fences: int, points: int, seed: int = 0, fences_per_farm: int = 12,
                    devices_per_farm: int = 4):
    """N fences at constant density (farms on a 4 km grid, 12 paddocks each: the region grows with N)
    and M points of herds on those farms."""
    from loadgen.herd import SimConfig, simulate
    farms = max(1, math.ceil(fences / fences_per_farm))
    devices = int(max(10, min(points, devices_per_farm * farms)))
    return simulate(SimConfig.for_totals(fences, points, devices, seed=seed, fences_per_farm=fences_per_farm))


def run_one(redis, fences: int, points: int, *, seed: int = 0, partitions: int = 6, repeat: int = 3,
            fences_per_farm: int = 12, devices_per_farm: int = 4, cleanup: bool = False,
            check: bool = True) -> dict:
    from fencing.stream import routing
    from fencing.stream.fence_cache import FenceCache
    from fencing.model.fence_store import fence_uid, save_fences_bulk, validate_features_bulk
    from fencing.model.h3util import cells_for_points, cells_to_strs, parent
    from fencing.model.keys import FENCE_RES, GROUP_RES
    from fencing.model.membership import vectorized_limit

    tag = secrets.token_hex(3)
    t = time.perf_counter()
    say(f"[{fences:,} fences] simulating {fences:,} fences and {points:,} points (seed {seed})")
    # The simulation's millions of small objects (GeoJSON coordinate lists) are the bench's, not the
    # system's: the collector is off while they are made, and they are frozen out of its scans, so
    # load and cache times measure fencing code, not full collections over the simulator's heap.
    gc.disable()
    try:
        sim = simulate_region(fences, points, seed, fences_per_farm, devices_per_farm)
    finally:
        gc.enable()
    gc.freeze()
    simulate_s = time.perf_counter() - t
    lon = sim.reports["lon"].to_numpy(np.float64).copy()
    lat = sim.reports["lat"].to_numpy(np.float64).copy()
    # the job's order inside a task: by device key "farm/device", arrival order per device
    # (fencing.stream.process sorts its frame so, before FenceIndex.match)
    dkey = (sim.reports["device_id"].map(sim.device_farm) + "/" + sim.reports["device_id"]).to_numpy(object)
    dkey_code, _ = pd.factorize(dkey, sort=True)
    del dkey
    n_devices = len(sim.device_ids)
    b = np.array([f.geometry.bounds for f in sim.fences[:: max(1, len(sim.fences) // 20_000)]])
    region = {"farms": len(sim.farms), "devices": n_devices,
              "lon": [round(float(b[:, 0].min()), 3), round(float(b[:, 2].max()), 3)],
              "lat": [round(float(b[:, 1].min()), 3), round(float(b[:, 3].max()), 3)]}
    region["area_km2"] = round((region["lat"][1] - region["lat"][0]) * 110.574
                               * (region["lon"][1] - region["lon"][0]) * 111.320
                               * math.cos(math.radians(sum(region["lat"]) / 2)), 1)
    region["fences_per_km2"] = round(fences / region["area_km2"], 3) if region["area_km2"] else None
    sim.reports = None

    # -- 2. bulk load -------------------------------------------------------------------------------
    mem_before = masters_memory(redis)
    say(f"[{fences:,} fences] bulk-loading into Redis in chunks of {LOAD_CHUNK:,}")
    geoms = np.empty(len(sim.fences), dtype=object)
    uids = np.empty(len(sim.fences), dtype=object)
    group_uids: dict[str, list[str]] = {}
    farm_fences: dict[str, list[str]] = {}
    validate_s = save_s = 0.0
    cover_cells = 0
    for start in range(0, len(sim.fences), LOAD_CHUNK):
        part = sim.fences[start:start + LOAD_CHUNK]
        t = time.perf_counter()
        valid = validate_features_bulk([f.geojson for f in part])
        validate_s += time.perf_counter() - t
        triples = []
        for k, (fence, v) in enumerate(zip(part, valid)):
            if isinstance(v, Exception):
                raise v
            farm = f"fb{tag}-{fence.farm_id}"
            triples.append((farm, fence.fence_id, v))
            uid = fence_uid(farm, fence.fence_id)
            geoms[start + k], uids[start + k] = fence.geometry, uid
            for g in v.groups:
                group_uids.setdefault(g, []).append(uid)
            farm_fences.setdefault(farm, []).append(fence.fence_id)
            cover_cells += len(v.interior) + len(v.boundary)
        t = time.perf_counter()
        save_fences_bulk(redis, None, triples)
        save_s += time.perf_counter() - t
        del valid, triples
    n = len(sim.fences)
    del sim, part
    gc.unfreeze()
    gc.collect()
    load_s = validate_s + save_s
    mem_after = masters_memory(redis)
    used = sum(m["used_memory"] for m in mem_after.values()) - sum(m["used_memory"] for m in mem_before.values())
    say(f"[{n:,} fences] loaded in {load_s:.1f} s ({n / load_s:,.0f} fences/s); Redis +{used / 2**20:,.0f} MiB")

    # -- 3. route by cell group; per partition: cache load from Redis, then match ----------------------
    t = time.perf_counter()
    cells = cells_for_points(lat, lon, FENCE_RES)
    h3_s = time.perf_counter() - t
    table = routing.from_spec({"version": 0, "partitions": partitions, "routes": {}}, *routing.slot_map(redis))
    codes, code_of_point = np.unique(parent(cells, GROUP_RES), return_inverse=True)
    point_groups = cells_to_strs(codes)
    group_of_point = np.array(point_groups, dtype=object)[code_of_point]     # the job has it per point
    part_of_code = np.array([table.partition_of(g) for g in point_groups], dtype=np.int64)
    part_of_point = part_of_code[code_of_point]
    fence_groups = sorted(group_uids)
    part_of_fence_group = {g: table.partition_of(g) for g in fence_groups}
    cross_node = sum(int(table.slot_node[routing.group_slot(g)]) != table.node_of_partition(p)
                     for g, p in part_of_fence_group.items())
    per_partition = []
    match_s = arrival_s = one_index_s = 0.0
    got_point, got_uid = [], []
    for p in range(partitions):
        idx = np.flatnonzero(part_of_point == p)
        groups = sorted({g for g, q in part_of_fence_group.items() if q == p}
                        | {point_groups[c] for c in np.flatnonzero(part_of_code == p)})
        cache = FenceCache()
        gc.collect()
        t = time.perf_counter()
        commands = cache.refresh(redis, groups)
        refresh_s = time.perf_counter() - t
        for index in cache.shards.values():      # builds each shard's pair table
            index.match(np.empty(0), np.empty(0), np.empty(0, np.uint64))
        load_cache_s = time.perf_counter() - t
        arrival = float("inf")                     # points in arrival (time) order, for comparison
        for _ in range(max(1, repeat)):
            t = time.perf_counter()
            cache.match(lon[idx], lat[idx], cells[idx], group_of_point[idx])
            arrival = min(arrival, time.perf_counter() - t)
        idx = idx[np.argsort(dkey_code[idx], kind="stable")]      # the job's order
        x, y, c, g = lon[idx], lat[idx], cells[idx], group_of_point[idx]
        best = float("inf")
        for _ in range(max(1, repeat)):
            t = time.perf_counter()
            pi, pu = cache.match(x, y, c, g)
            best = min(best, time.perf_counter() - t)
        match_s += best
        arrival_s += arrival
        one_s, one_build_s, one_agrees = _one_index(cache, x, y, c, repeat, (pi, pu))
        one_index_s += one_s
        if check:
            got_point.append(idx[pi])
            got_uid.append(pu)
        row = {"partition": p, "node": table.nodes[table.node_of_partition(p)], "groups": len(groups),
               "fences_cached": len(cache), "cache_load_s": round(load_cache_s, 3),
               "cache_refresh_s": round(refresh_s, 3), "redis_commands": commands,
               "points": int(len(idx)), "pairs": int(len(pi)), "match_s": round(best, 4),
               "ns_per_point": round(best / len(idx) * 1e9, 1) if len(idx) else None,
               "arrival_order_ns_per_point": round(arrival / len(idx) * 1e9, 1) if len(idx) else None,
               "one_index_ns_per_point": round(one_s / len(idx) * 1e9, 1) if len(idx) else None,
               "one_index_build_s": round(one_build_s, 3), "one_index_agrees": one_agrees,
               "rss_mb": _rss_mb()}
        per_partition.append(row)
        say(f"[{n:,} fences] partition {p}: {row['fences_cached']:,} fences cached in {load_cache_s:.2f} s, "
            f"{row['points']:,} points matched in {best:.3f} s")
        del cache, pi, pu
        gc.collect()
    ns = match_s / len(lon) * 1e9

    # -- 4. the vectorized limit, and the check ------------------------------------------------------
    say(f"[{n:,} fences] vectorized limit (H3 + STRtree over all fences, one process)")
    limit_best, limit_pairs = float("inf"), None
    for _ in range(2):
        t = time.perf_counter()
        cells_for_points(lat, lon, FENCE_RES)
        lp, lf = vectorized_limit(list(geoms), lon, lat)
        limit_best = min(limit_best, time.perf_counter() - t)
        limit_pairs = (lp, lf)
    agrees = None
    if check:
        gp = np.concatenate(got_point) if got_point else np.empty(0, np.int64)
        gu = np.concatenate(got_uid) if got_uid else np.empty(0, object)
        gf = pd.Index(uids).get_indexer(gu).astype(np.int64)
        mine = np.sort(gp.astype(np.int64) * n + gf)
        theirs = np.sort(limit_pairs[0].astype(np.int64) * n + limit_pairs[1].astype(np.int64))
        agrees = bool((gf >= 0).all() and np.array_equal(mine, theirs))
    inside = np.zeros(len(lon), bool)
    inside[limit_pairs[0]] = True
    cached = [r["fences_cached"] for r in per_partition]

    out = {
        "fences": n, "points": int(len(lon)), "region": region,
        "simulate_s": round(simulate_s, 2),
        "load": {"seconds": round(load_s, 2), "fences_per_s": round(n / load_s, 1),
                 "validate_s": round(validate_s, 2), "save_s": round(save_s, 2),
                 "chunk": LOAD_CHUNK, "groups": len(fence_groups), "cover_cells": int(cover_cells)},
        "redis_memory": {"used_bytes": int(used), "used_mib": round(used / 2**20, 1),
                         "bytes_per_fence": round(used / n, 1),
                         "per_master_after": mem_after, "per_master_before": mem_before},
        "partitions": per_partition,
        # a fence whose cover crosses a group border routed elsewhere is cached by both partitions
        "cache": {"fences_cached_total": int(sum(cached)), "fences_cached_max": int(max(cached)),
                  "load_s_total": round(sum(r["cache_load_s"] for r in per_partition), 2),
                  "load_s_max": round(max(r["cache_load_s"] for r in per_partition), 2),
                  "fences_per_s": round(sum(cached) / max(1e-9, sum(r["cache_load_s"] for r in per_partition)), 1),
                  "cross_node_groups": int(cross_node)},
        "match": {"seconds": round(match_s, 4), "ns_per_point": round(ns, 1),
                  "points_per_s": round(len(lon) / match_s, 1), "repeat": repeat,
                  "h3_cells_ns_per_point": round(h3_s / len(lon) * 1e9, 1),
                  "ns_per_point_with_h3": round(ns + h3_s / len(lon) * 1e9, 1),
                  "order": "the job's: by farm/device key, arrival order per device",
                  "arrival_order_ns_per_point": round(arrival_s / len(lon) * 1e9, 1),
                  "one_index_ns_per_point": round(one_index_s / len(lon) * 1e9, 1)},
        "per_point_cost_ns": round(ns, 1),
        "pairs": int(len(limit_pairs[0])), "points_inside_any_fence": round(float(inside.mean()), 4),
        "vectorized_limit": {"seconds": round(limit_best, 3), "points_per_s": round(len(lon) / limit_best, 1),
                             "ns_per_point": round(limit_best / len(lon) * 1e9, 1)},
        "match_agrees_with_vectorized_limit": agrees,
        "python_rss_peak_mb": _rss_peak_mb(),
    }
    if cleanup:
        say(f"[{n:,} fences] deleting the bench's keys")
        _delete_bench_keys(redis, group_uids, farm_fences)
    gc.unfreeze()
    return out


# --- all fence counts ----------------------------------------------------------------------------
def run(fence_counts: list[int], points: int, json_path: str | None = None, *, seed: int = 0,
        partitions: int = 6, repeat: int = 3, port: int = DEFAULT_PORT, command: str = "",
        fences_per_farm: int = 12, devices_per_farm: int = 4, check: bool = True) -> dict:
    results = []
    with bench_redis(port) as (redis, redis_info, private):
        for i, n in enumerate(fence_counts):
            if private and i:
                _flush_masters(redis)
            results.append(run_one(redis, n, points, seed=seed, partitions=partitions, repeat=repeat,
                                   fences_per_farm=fences_per_farm, devices_per_farm=devices_per_farm,
                                   cleanup=not private, check=check))
            gc.collect()
    lo = min(results, key=lambda r: r["fences"])
    hi = max(results, key=lambda r: r["fences"])
    ratio = hi["per_point_cost_ns"] / lo["per_point_cost_ns"] if lo["per_point_cost_ns"] else None
    out = {
        "fence_counts": [r["fences"] for r in results], "points": points, "partitions": partitions,
        "per_point_cost_ratio": round(ratio, 3) if ratio is not None else None,
        "per_point_cost_ratio_with_h3": round(hi["match"]["ns_per_point_with_h3"]
                                              / lo["match"]["ns_per_point_with_h3"], 3),
        "per_point_cost_ratio_arrival_order": round(hi["match"]["arrival_order_ns_per_point"]
                                                    / lo["match"]["arrival_order_ns_per_point"], 3),
        "per_point_cost_ratio_one_index": round(hi["match"]["one_index_ns_per_point"]
                                                / lo["match"]["one_index_ns_per_point"], 3),
        "bar": BAR, "meets_bar": bool(ratio is not None and ratio <= BAR),
        "per_point_cost": "FenceCache.match wall time (one index per cell group) summed over the partitions / "
                          "points (best of repeat), caches already loaded, points in the job's order (farm/device "
                          "key); H3 cells of the points reported separately; one_index: the same with one "
                          "FenceIndex of each partition's fences",
        "results": results, "redis": redis_info, "machine": machine(), "command": command,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(out, indent=1) + "\n")
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="herdfence bench fences", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fences", required=True, help="comma-separated fence counts, e.g. 10000,1000000")
    p.add_argument("--points", type=int, required=True)
    p.add_argument("--json", required=True, metavar="FILE")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--repeat", type=int, default=3, help="match runs per partition (best is kept)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fences-per-farm", type=int, default=12)
    p.add_argument("--devices-per-farm", type=int, default=4)
    p.add_argument("--redis-port", type=int, default=DEFAULT_PORT,
                   help="first port of the private cluster (3 masters; bus = port+10000)")
    p.add_argument("--no-check", action="store_true", help="skip comparing match() with the limit")
    a = p.parse_args(argv)
    counts = [int(x.replace("_", "")) for x in a.fences.split(",") if x.strip()]
    out = run(counts, a.points, a.json, seed=a.seed, partitions=a.partitions, repeat=a.repeat,
              port=a.redis_port, fences_per_farm=a.fences_per_farm, devices_per_farm=a.devices_per_farm,
              check=not a.no_check,
              command="herdfence bench fences " + " ".join(shlex.quote(x) for x in argv))
    print(json.dumps({"fence_counts": out["fence_counts"], "per_point_cost_ratio": out["per_point_cost_ratio"],
                      "meets_bar": out["meets_bar"],
                      "per_point_cost_ns": [r["per_point_cost_ns"] for r in out["results"]],
                      "per_point_cost_ratio_one_index": out["per_point_cost_ratio_one_index"],
                      "one_index_ns": [r["match"]["one_index_ns_per_point"] for r in out["results"]],
                      "load_fences_per_s": [r["load"]["fences_per_s"] for r in out["results"]],
                      "redis_used_mib": [r["redis_memory"]["used_mib"] for r in out["results"]],
                      "agrees": [r["match_agrees_with_vectorized_limit"] for r in out["results"]]}, indent=1))
    return 0
