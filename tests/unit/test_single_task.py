"""fencing.stream.single_task: which micro-batches the source plans as one task; and how that task's
input is split back into its routed partitions, as the shuffle would split it (fencing.stream.stages)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from fencing.stream.routing import partition_salts
from fencing.stream.rows import PING, SHUFFLED, split_by_route
from fencing.stream import stages
from fencing.stream.single_task import is_single_task, planned_records


def test_planned_records_counts_each_partition_and_new_ones_from_zero():
    assert planned_records({"0": 10, "1": 5}, {"0": 15, "1": 5}) == 5
    assert planned_records({"0": 10}, {"0": 12, "1": 3}) == 5        # partition 1 is new: from 0
    assert is_single_task({"0": 0}, {"0": 100}, 100)
    assert not is_single_task({"0": 0}, {"0": 101}, 100)
    assert not is_single_task({"0": 0}, {"0": 1}, 0)                  # 0 turns it off


def _rows(routes: list[int], tag: str, kind: int = 0) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"kind": pa.array(np.full(len(routes), kind, np.int8)),
                                       "route": pa.array(routes, pa.int64()),
                                       "payload": pa.array([f"{tag}{i}".encode() for i in range(len(routes))])},
                                      schema=SHUFFLED)


def test_one_task_s_input_splits_into_its_partitions_in_order():
    salts = partition_salts(3)
    batches = [_rows([salts[2]] * 2, "a"), _rows([salts[0], salts[2], salts[0]], "b"), _rows([salts[2]], "c")]
    parts = split_by_route(batches, salts)
    payloads = [[p.decode() for b in part for p in b.column("payload").to_pylist()] for part in parts]
    assert payloads == [["b0", "b2"], [], ["a0", "a1", "b1", "c0"]]


def test_the_stage_runs_every_partition_once_even_an_empty_one(monkeypatch):
    salts = partition_salts(4)
    seen, gc_steps = [], []

    def process(ctx, given, partition):
        seen.append((partition, len(given.side)))
        yield _rows([salts[partition]], f"out{partition}-")
    monkeypatch.setattr(stages, "process_partition", process)
    monkeypatch.setattr(stages.worker_gc, "task_started", lambda: gc_steps.append(1))
    side = _rows([salts[1], salts[3], salts[3]], "p", PING)       # side rows: no IPC payload to read
    out = list(stages.single_task_stage(None, salts)(iter([side])))
    assert seen == [(0, 0), (1, 1), (2, 0), (3, 2)]
    assert len(out) == 4
    assert len(gc_steps) == 1                   # one garbage-collection step per task, not per partition


def test_a_shuffled_task_serves_its_own_partition(monkeypatch):
    seen, gc_steps = [], []

    def process(ctx, given, partition):
        seen.append((partition, len(given.side)))
        return iter(())
    monkeypatch.setattr(stages, "process_partition", process)
    monkeypatch.setattr(stages.worker_gc, "task_started", lambda: gc_steps.append(1))
    assert list(stages.shuffled_stage(None)(iter([_rows([7], "p", PING)]))) == []
    assert seen == [(0, 1)] and gc_steps == [1]      # outside a Spark task: partition 0
