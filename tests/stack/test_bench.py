"""The benchmarks on the shared test stack: correctness of what they report, not speed."""
from __future__ import annotations

import json

import numpy as np
import pytest

from loadgen.herd import SimConfig, simulate

PUSH_KEYS = {"fences", "points", "devices", "points_per_s", "event_latency_ms", "vectorized_limit_points_per_s",
             "ratio_to_limit", "events", "lost", "duplicated", "drain_points_per_s"}
PULL_KEYS = {"fences", "devices", "queries_per_s", "latency_ms", "errors"}


def test_bulk_validation_matches_single_fence_validation():
    from fencing.model.fence_store import validate_feature, validate_features_bulk
    sim = simulate(SimConfig.for_totals(120, 100, 10, seed=3))
    bad = {"type": "Feature", "properties": {"name": "bow tie"},
           "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}}
    features = [f.geojson for f in sim.fences] + [bad]
    bulk = validate_features_bulk(features)
    for feature, got in zip(features[:-1], bulk):
        want = validate_feature(feature)
        assert np.array_equal(got.interior, want.interior) and np.array_equal(got.boundary, want.boundary)
        assert got.groups == want.groups and got.rules == want.rules
    with pytest.raises(Exception) as err:
        validate_feature(bad)
    assert str(bulk[-1]) == str(err.value)


def test_push_bench_is_exact(stack, tmp_path):
    out = tmp_path / "push.json"
    stack.cli("bench", "push", "--fences", "200", "--points", "5000", "--devices", "200", "--rate", "2500",
              "--json", str(out), timeout=900)
    result = json.loads(out.read_text())
    # the measured run starts with every worker's fence cache current (keep-warm brought them up to date)
    assert result["workers_warm"], result["setup_seconds"]
    assert result["offered_rate"] == 2500 and result["produce"]["seconds"] >= 1.6   # paced: 5000 at 2500/s
    assert PUSH_KEYS <= set(result)
    assert set(result["event_latency_ms"]) >= {"p50", "p99"}
    assert result["stack"]["kind"] == "running"          # it used the session's stack
    # a paced run on a stack it did not start measures no drain, and says why
    assert result["drain_points_per_s"] is None and result["drain"] == {"skipped": "paced run"}
    assert result["completed"] and result["processed_points"] == 5000
    assert result["events"] > 0
    assert result["lost"] == 0 and result["duplicated"] == 0 and result["unexpected_events"] == 0
    assert result["points_per_s"] > 0 and result["vectorized_limit_points_per_s"] > 0
    assert out.with_suffix(".png").stat().st_size > 1000
    memory = result["memory"]            # issue 23: where the memory goes, sampled from /proc
    assert memory["samples"] > 0 and memory["peak_mb"]["driver"] > 0 and memory["peak_mb"]["jvm"] > 0
    assert memory["peak_mb"]["worker_max"] > 0 and memory["peak_mb"]["redis_masters"] > 0
    redis = memory["redis"]
    assert redis["used_memory"]["run"] > redis["used_memory"]["start"]
    assert 0 < redis["family_bytes_per_device"]["state"] < 2000 and redis["event_bytes"] > 0
    cpu = result["cpu"]                  # where the CPU went over the measured window, from /proc
    assert 0 < cpu["window_s"] and 0 < cpu["busy_cores"] <= cpu["cores"]
    for role in ("workers", "jvm", "driver", "redis", "bench"):
        assert cpu["core_seconds"][role] > 0, cpu
    # the small progress record pollers read is the last heartbeat's
    from fencing.model.heartbeat import read_heartbeat, read_progress
    for _ in range(5):                   # (a batch may end between the two reads)
        progress, beat = read_progress(stack.redis), read_heartbeat(stack.redis)
        if progress == beat.progress():
            break
    assert progress == beat.progress() and progress.points_total >= 5000


def test_push_bench_with_sparse_late_collars_is_exact(stack, tmp_path):
    """--tracks sparse: fixes 5-15 min apart, 5% buffered and uploaded late; the oracle knows the
    inferred and late events, and every one of them comes out exactly once."""
    out = tmp_path / "sparse.json"
    stack.cli("bench", "push", "--fences", "200", "--points", "6000", "--devices", "150", "--tracks", "sparse",
              "--no-plot", "--json", str(out), timeout=900)
    result = json.loads(out.read_text())
    assert result["tracks"] == "sparse" and result["completed"] and result["processed_points"] == 6000
    assert result["expected_inferred"] > 0 and result["expected_late"] > 0, result
    assert result["lost"] == 0 and result["duplicated"] == 0 and result["unexpected_events"] == 0, result


def test_pull_bench_has_no_errors(stack, tmp_path):
    out = tmp_path / "pull.json"
    stack.cli("bench", "pull", "--fences", "100", "--devices", "100", "--seconds", "3", "--connections", "4",
              "--streams", "20", "--json", str(out), timeout=900)
    result = json.loads(out.read_text())
    assert PULL_KEYS <= set(result)
    assert result["errors"] == 0
    assert result["queries_per_s"] > 0 and result["latency_ms"]["p99"] >= result["latency_ms"]["p50"] > 0
    uncached = result["uncached"]        # the same mix with Cache-Control: no-cache: Redis every time
    assert uncached["errors"] == 0 and uncached["queries_per_s"] > 0
    live = result["streams"]             # 20 open maps over the farms, a sentinel walking in each
    assert live["opened"] == 20 and live["refused"] == 0, live
    assert live["events_received"] >= live["farms"] and live["delay_s"]["p50"] > 0, live


def test_report_shows_flood_paced_and_sparse_runs(tmp_path):
    from loadgen.bench_report import write_report
    base = {"fences": 100, "devices": 10, "points": 1000, "vectorized_limit_points_per_s": 1e5,
            "ratio_to_limit": 0.1, "events": 5, "lost": 0, "duplicated": 0, "batches": 2, "command": "x"}
    (tmp_path / "bench-push-a.json").write_text(json.dumps(
        {**base, "points_per_s": 9000.0, "offered_rate": None, "event_latency_ms": {"p50": 4000, "p99": 9000}}))
    (tmp_path / "bench-push-b.json").write_text(json.dumps(
        {**base, "points_per_s": 2000.0, "offered_rate": 2000.0, "event_latency_ms": {"p50": 800, "p99": 1700}}))
    (tmp_path / "bench-push-c.json").write_text(json.dumps(
        {**base, "points_per_s": 7000.0, "offered_rate": None, "tracks": "sparse",
         "event_latency_ms": {"p50": 5000, "p99": 9500}}))
    text = write_report(tmp_path).read_text()
    assert "| 1,000 | dense | flood | 9,000 |" in text and "| dense | 2,000/s | 2,000 |" in text
    assert "| 1,000 | sparse | flood | 7,000 |" in text and "1,000 points, sparse collars" in text
    assert "paced at 2,000 reports/s (100 fences): event p50 800 ms, p99 1,700 ms" in text


def test_stage_bench_times_each_step_in_cpu_against_the_stacks_redis_and_gets_the_oracles_events(stack, tmp_path):
    from loadgen.bench_report import STAGE_STEPS, write_report
    out = tmp_path / "bench-stage-small.json"
    stack.cli("bench", "stage", "--fences", "300", "--points", "12000", "--devices", "300", "--batches", "3",
              "--json", str(out), timeout=600)
    result = json.loads(out.read_text())
    assert result["stack"]["kind"] == "running"          # the session's stack: its Redis Cluster, its job's epoch
    assert result["events"] > 0
    assert (result["lost"], result["duplicated"], result["unexpected"]) == (0, 0, 0)
    assert result["points_counted"] == 8000              # the first of three batches only warms up
    assert 0 < result["device_batches_counted"] <= 2 * 300
    cpu, wall = result["cpu_us_per_device_batch"], result["wall_us_per_device_batch"]
    assert set(cpu) == set(wall) == set(STAGE_STEPS)
    for step in ("read_state", "advance", "write"):      # a thread's CPU time is at most its wall time
        assert 0 < cpu[step] <= wall[step] * 1.05 + 1, (step, cpu, wall)
    assert result["cpu_us_per_device_batch_total"] == pytest.approx(sum(cpu.values()), abs=0.1)
    report = write_report(tmp_path).read_text()
    assert "## The process stage with its Redis reads and writes" in report and "| 300 | 12,000 | 300 | 3 |" in report
