"""The stage contracts (fencing.model.heartbeat): one typed record per stage, readable across versions."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import orjson

from fencing.model.heartbeat import Heartbeat, PartitionStats, ReaderTiming

ROOT = Path(__file__).resolve().parents[2]


def test_a_heartbeat_round_trips_with_its_partitions_and_readers():
    beat = Heartbeat(batch_id=7, time=1700000000.5, duration_s=1.25, points=300, events=4, routing_version=3,
                     partitions=[PartitionStats(0, points=200, groups={"g1": 200}, stage_s={"write": 0.1}),
                                 PartitionStats(1, points=100, shed=5, children={"g2": {"#0": 3.0}})],
                     points_total=1000, shed_total=5, readers=[ReaderTiming(300, 0.01, 0.02)])
    # written by orjson from the dataclasses themselves: the same JSON as their dict form, nested
    # partitions and readers included (what readers of earlier versions parse)
    assert beat.to_json() == orjson.dumps(dataclasses.asdict(beat))
    assert beat.partitions[1].to_json() == orjson.dumps(dataclasses.asdict(beat.partitions[1])).decode()
    back = Heartbeat.from_json(beat.to_json())
    assert back == beat
    assert back.handled_total == 1005
    assert back.partitions[1].children == {"g2": {"#0": 3.0}}


def test_unknown_fields_are_ignored_and_missing_ones_default():
    """A beat written by another version of the job still reads: new fields dropped, old ones defaulted."""
    raw = orjson.dumps({"batch_id": 3, "time": 5.0, "points": 10, "from_the_future": [1, 2],
                        "partitions": [{"partition": 2, "points": 10, "novel": True}]})
    beat = Heartbeat.from_json(raw)
    assert beat.points == 10 and beat.lag == 0 and beat.readers == []
    assert beat.partitions == [PartitionStats(2, points=10)]
    assert Heartbeat.from_json(b"{}").batch_id == -1


def test_heartbeat_readers_use_the_typed_record():
    """No reader of the heartbeat goes back to parsing the key's JSON itself (that is where fields
    drifted before): only fencing/model/heartbeat.py names the keys."""
    offenders = []
    for path in ROOT.glob("*/**/*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".venv", "node_modules") or rel.as_posix() in (
                "fencing/model/heartbeat.py", "fencing/model/keys.py", "tests/unit/test_heartbeat.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("JOB_HEARTBEAT", "JOB_HEARTBEAT_LOG"):
                offenders.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(("job:heartbeat", "{job}:heartbeat")):
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, offenders


def test_the_progress_record_carries_what_pollers_wait_for():
    beat = Heartbeat(batch_id=7, time=12.5, points_total=900, shed_total=100,
                     partitions=[PartitionStats(0, points=900, groups={f"g{i}": 1.0 for i in range(5000)})])
    progress = beat.progress()
    assert (progress.batch_id, progress.time, progress.handled_total) == (7, 12.5, beat.handled_total) == (7, 12.5, 1000)
    assert len(orjson.dumps(dataclasses.asdict(progress))) < 200 < len(beat.to_json())


def test_the_stored_beat_keeps_everything_but_the_per_group_loads():
    """Redis keeps beats without the per-group maps the elastic controller reads in the driver: at
    100k fences they are ~99% of a beat, and the log keeps 5,000 beats."""
    loads = {f"86{i:013x}": 3.0 for i in range(20_000)}
    beat = Heartbeat(batch_id=9, time=5.0, points=60_000, points_total=70_000, lag=12,
                     partitions=[PartitionStats(p, points=10_000, devices=900, stage_s={"write": 0.2}, groups=loads,
                                                route_groups=loads, children={"g": {"#1": 2.0}}) for p in range(6)],
                     readers=[ReaderTiming(60_000, 0.1, 0.2)])
    stored = Heartbeat.from_json(beat.stored().to_json())
    assert len(beat.stored().to_json()) < 5_000 < 1_000_000 < len(beat.to_json())
    assert [(s.partition, s.points, s.devices, s.stage_s) for s in stored.partitions] == \
        [(s.partition, s.points, s.devices, s.stage_s) for s in beat.partitions]
    assert all(not (s.groups or s.route_groups or s.children) for s in stored.partitions)
    assert (stored.points, stored.points_total, stored.lag, stored.readers) == (60_000, 70_000, 12, beat.readers)
    assert beat.partitions[0].groups is loads          # the controller's beat keeps them
