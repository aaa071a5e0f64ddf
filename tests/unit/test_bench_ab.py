"""`herdfence bench ab`: the medians of each commit's interleaved runs, their ratio, and the table the
report renders from them."""
from __future__ import annotations

import json

from loadgen import bench_ab
from loadgen.bench_report import write_report


def _result(pps: float, producer_s: float, lost: int = 0, drain: float | None = None) -> dict:
    return {"points_per_s": pps, "lost": lost, "duplicated": 0, "produce": {"seconds": producer_s},
            "drain_points_per_s": drain, "drain": {"points_per_s": drain} if drain else {"skipped": "paced run"},
            "time": "2026-11-27T10:00:00Z"}


def test_medians_ratio_and_report(tmp_path):
    work = tmp_path / "runs"
    work.mkdir()
    for side, values in (("main", [(90.0, 3.0), (120.0, 2.0), (100.0, 9.0)]), ("base", [(50.0, 6.0), (40.0, 7.0)])):
        for round_, (pps, producer) in enumerate(values, 1):
            (work / f"{side}-{round_}.json").write_text(json.dumps(_result(pps, producer, drain=pps * 2)))
    (work / "notes.json").write_text("{}")              # not a run: ignored
    summary = bench_ab.collect(work, None, ["--points", "1000"])
    assert summary["medians"]["main"] == {"points_per_s": 100.0, "producer_s": 3.0, "drain_points_per_s": 200.0}
    assert summary["medians"]["base"]["points_per_s"] == 45.0
    assert summary["ratio"] == round(100.0 / 45.0, 3)
    assert [r["round"] for r in sorted(summary["runs"]["main"], key=lambda r: r["round"])] == [1, 2, 3]
    assert summary["round_ratios"] == {1: 1.8, 2: 3.0}        # rounds both sides ran
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ab-test.json").write_text(json.dumps(summary))
    text = write_report(docs).read_text()
    assert "herdfence bench push --points 1000" in text and "**2.22**" in text
    assert text.count("| median |") == 2
    assert "Each round's ratio: 1.80, 3.00." in text


def test_collect_from_the_command_line(tmp_path):
    (tmp_path / "main-1.json").write_text(json.dumps(_result(10.0, 1.0)))
    (tmp_path / "base-1.json").write_text(json.dumps(_result(20.0, 1.0)))
    out = tmp_path / "ab.json"
    assert bench_ab.main(["--collect", str(tmp_path), "--json", str(out), "--", "--points", "5"]) == 0
    assert json.loads(out.read_text())["ratio"] == 0.5


def test_the_side_that_runs_first_turns_every_round():
    orders = [bench_ab.round_order(r) for r in range(1, 5)]
    assert orders == [("main", "base"), ("base", "main"), ("main", "base"), ("base", "main")]
