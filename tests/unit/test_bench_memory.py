"""The benchmarks' memory figures come from /proc (loadgen/bench_memory.py) and their cost curve from
the runs (loadgen/bench_devices.py): checked on real processes and on made-up runs."""
from __future__ import annotations

import subprocess
import sys
import time

from loadgen import bench_devices, bench_memory


def test_a_job_tree_is_split_into_driver_and_python_workers_with_their_rss():
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; x = bytearray(50 << 20); time.sleep(30)']); "
            "time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 10
        roles = bench_memory.job_processes(parent.pid)
        while not roles["workers"] and time.time() < deadline:
            time.sleep(0.1)
            roles = bench_memory.job_processes(parent.pid)
        assert roles["driver"] == [parent.pid] and len(roles["workers"]) == 1 and roles["jvm"] == []
        sampler = bench_memory.MemorySampler(settings=None)
        now = sampler.sample(parent.pid, [])
        while now["worker_max"] < 50 and time.time() < deadline:     # the child still allocating
            time.sleep(0.1)
            now = sampler.sample(parent.pid, [])
        assert now["worker_max"] >= 50 and now["driver"] > 0 and now["bench"] > 0    # MB
    finally:
        for p in bench_memory.job_processes(parent.pid)["workers"]:
            subprocess.run(["kill", str(p)], check=False)
        parent.kill()
        parent.wait()


def _run(devices: int, us: float) -> dict:
    return {"fences": 10_000, "devices": devices, "points": 3 * devices, "points_per_s": 1e6 / us,
            "us_per_point": us, "lost": 0, "duplicated": 0, "driver_mb": 300.0, "jvm_mb": 1200.0,
            "worker_max_mb": 400.0, "redis_masters_mb": 900.0, "bench_mb": 800.0,
            "redis_run_bytes_per_device": 1500.0, "redis_state_bytes_per_device": 1100.0,
            "redis_total_bytes_per_device": 1700.0, "redis_family_bytes_per_device": {"state": 410.0}}


def test_cost_ratio_is_largest_over_smallest_per_fence_count_and_the_table_says_it(tmp_path):
    runs = [_run(1_000_000, 15.0), _run(10_000, 12.0), _run(100_000, 13.0)]
    assert bench_devices.ratios(runs) == {"10000": 1.25}
    summary = {"command": "herdfence bench devices --json x.json", "points_per_device": 3, "tracks": "dense",
               "time": "now", "machine": {"cores": 2, "memory": "23 GiB"}, "runs": runs,
               "cost_ratio": bench_devices.ratios(runs), "ratio_bar": 1.5}
    text = bench_devices.markdown(summary, "x.png")
    assert "10000 fences: 1.25" in text and "| 10,000 | 1,000,000 | 3,000,000 |" in text
    bench_devices.plot(tmp_path / "x.png", runs, "test")
    assert (tmp_path / "x.png").stat().st_size > 10_000
