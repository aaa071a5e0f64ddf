"""`herdfence bench core` measures the job's own core steps and gets the oracle's events: a run at a small
size reconciles every event, times every step, and renders in docs/benchmarks.md."""
from __future__ import annotations

import json

from loadgen import bench_core
from loadgen.bench_report import write_report


def test_the_core_bench_times_every_step_and_reproduces_the_oracles_events(tmp_path):
    out = bench_core.run(fences=300, points=30_000, devices=600, batches=3)
    assert out["events"] > 0
    assert (out["lost"], out["duplicated"], out["unexpected"]) == (0, 0, 0)
    assert out["points_counted"] == 20_000             # the first of three batches only warms up
    assert set(out["seconds_per_100k_points"]) == set(bench_core.STEPS)
    assert all(v > 0 for v in out["seconds_per_100k_points"].values())
    assert 0 < out["device_batches_counted"] <= 2 * 600
    (tmp_path / "bench-core-small.json").write_text(json.dumps({**out, "time": "2026-01-01T00:00:00Z",
                                                                "command": "herdfence bench core"}))
    report = write_report(tmp_path).read_text()
    assert "## The process stage's core, alone" in report and "| 300 | 30,000 | 600 | 3 |" in report
