"""`herdfence bench fences` with tiny counts: the JSON it writes and that the partitions' FenceIndex.match
(caches loaded from Redis per partition) finds exactly the vectorized limit's (point, fence) pairs.
Correctness only: no timing asserts. Runs its own private Redis Cluster (ports 11104-11106)."""
from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest

from deploy.redis_cluster import BUS_OFFSET
from deploy.procs import DeployError, ensure_port_free, port_open
from tests.conftest import OFFSET

PORT = 11104 + OFFSET
KEYS = {"fence_counts", "points", "partitions", "per_point_cost_ratio", "bar", "meets_bar", "results",
        "redis", "machine", "command"}
RESULT_KEYS = {"fences", "points", "region", "load", "redis_memory", "partitions", "cache", "match",
               "per_point_cost_ns", "vectorized_limit", "match_agrees_with_vectorized_limit", "pairs"}

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is required")


def _busy(ports) -> list[int]:
    busy = []
    for port in ports:
        try:
            ensure_port_free(port, None)
        except DeployError:
            busy.append(port)
    return busy


@pytest.fixture
def private_redis_only(monkeypatch):
    monkeypatch.delenv("HERDFENCE_REDIS", raising=False)
    # bus ports 35104-35106 lie in Linux's ephemeral range: an outgoing connection of another process
    # may hold one for a while (then TIME_WAIT); wait for it rather than fail
    ports = [p for base in range(PORT, PORT + 3) for p in (base, base + BUS_OFFSET)]
    deadline = time.monotonic() + 90
    while (busy := _busy(ports)) and time.monotonic() < deadline:
        time.sleep(2)
    if busy:
        pytest.skip(f"ports in use: {busy}")


def test_bench_fences_json_and_match_agrees_with_limit(private_redis_only, tmp_path):
    from loadgen import bench
    out = tmp_path / "fences.json"
    assert bench.main(["fences", "--fences", "200,2000", "--points", "5000", "--repeat", "1",
                              "--redis-port", str(PORT), "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert KEYS <= set(d)
    assert d["fence_counts"] == [200, 2000] and d["partitions"] == 6 and d["bar"] == 2.0
    assert d["per_point_cost_ratio"] > 0 and d["per_point_cost_ratio_one_index"] > 0
    assert d["command"].startswith("herdfence bench fences --fences 200,2000")
    assert d["redis"]["kind"] == "private"
    for r in d["results"]:
        assert RESULT_KEYS <= set(r)
        assert r["match_agrees_with_vectorized_limit"] is True
        # one FenceIndex over the partition's fences finds the same pairs as the per-group cache
        assert all(p["one_index_agrees"] for p in r["partitions"]) and r["match"]["one_index_ns_per_point"] > 0
        assert r["points"] == 5000 and r["pairs"] > 0
        assert sum(p["points"] for p in r["partitions"]) == 5000 and len(r["partitions"]) == 6
        # every fence is cached by at least one partition; partitions only load their own groups
        assert r["fences"] <= r["cache"]["fences_cached_total"] < 2 * r["fences"]
        assert r["cache"]["fences_cached_max"] < r["fences"]
        assert r["cache"]["cross_node_groups"] == 0
        assert r["load"]["fences_per_s"] > 0 and r["redis_memory"]["used_bytes"] > 0
        assert set(r["redis_memory"]["per_master_after"]) == {f"127.0.0.1:{p}" for p in range(PORT, PORT + 3)}
    # constant density: ten times the fences, about ten times the area
    small, big = d["results"]
    assert 5 < big["region"]["area_km2"] / small["region"]["area_km2"] < 20
    # the private cluster is gone
    assert not any(port_open(p) for p in range(PORT, PORT + 3))


def test_match_agrees_with_limit_through_cache(private_redis_only):
    """The same pipeline in-process, checked pair by pair (not just the flag in the JSON)."""
    from fencing.stream.fence_cache import FenceCache
    from fencing.model.fence_store import fence_uid, save_fences_bulk, validate_features_bulk
    from fencing.model.h3util import cells_for_points
    from fencing.model.keys import FENCE_RES
    from fencing.model.membership import vectorized_limit
    from loadgen import bench_fences

    sim = bench_fences.simulate_region(200, 3000, seed=5)
    lon, lat = sim.reports["lon"].to_numpy(float), sim.reports["lat"].to_numpy(float)
    with bench_fences.bench_redis(PORT) as (redis, info, private):
        assert private
        saved = save_fences_bulk(redis, None, [(f.farm_id, f.fence_id, f.geojson) for f in sim.fences])
        assert len(saved) == len(sim.fences)
        groups = sorted({g for v in validate_features_bulk([f.geojson for f in sim.fences]) for g in v.groups})
        cache = FenceCache()
        cache.refresh(redis, groups)
        assert len(cache) == len(sim.fences)
        point, uid = cache.match(lon, lat, cells_for_points(lat, lon, FENCE_RES))
    lp, lf = vectorized_limit([f.geometry for f in sim.fences], lon, lat)
    uids = [fence_uid(f.farm_id, f.fence_id) for f in sim.fences]
    assert sorted(zip(point.tolist(), uid.tolist())) == sorted(zip(lp.tolist(), [uids[i] for i in lf]))
    assert len(lp) > 0 and np.unique(lp).size < len(lon)        # some points outside every fence
