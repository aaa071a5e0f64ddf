"""fencing.stream.batch_shape: how the source and the driver cut a micro-batch into tasks; and how a task's
input is split back into its routed partitions, as the shuffle would split it (fencing.stream.stages)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from fencing.stream.routing import partition_salts
from fencing.stream.rows import PING, SHUFFLED, split_by_route
from fencing.stream import stages
from fencing.stream.batch_shape import is_single_task, planned_records, process_tasks


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
    out = list(stages.process_stage(None, salts, 1)(iter([side])))
    assert seen == [(0, 0), (1, 1), (2, 0), (3, 2)]
    assert len(out) == 4
    assert len(gc_steps) == 1                   # one garbage-collection step per task, not per partition


def _in_task(monkeypatch, index: int) -> None:
    """The stage runs as if in the Spark task of that partition index."""
    class Task:
        @staticmethod
        def partitionId() -> int:
            return index
    monkeypatch.setattr(stages.TaskContext, "get", staticmethod(lambda: Task))


def test_a_shuffled_task_serves_its_own_partition(monkeypatch):
    salts = partition_salts(6)
    seen, gc_steps = [], []

    def process(ctx, given, partition):
        seen.append((partition, len(given.side)))
        return iter(())
    monkeypatch.setattr(stages, "process_partition", process)
    monkeypatch.setattr(stages.worker_gc, "task_started", lambda: gc_steps.append(1))
    _in_task(monkeypatch, 4)             # the Spark task serving partition 4 of 6
    assert list(stages.process_stage(None, salts, 6)(iter([_rows([salts[4]], "p", PING)]))) == []
    assert seen == [(4, 1)] and gc_steps == [1]


def test_fewer_tasks_together_serve_every_partition_once(monkeypatch):
    salts = partition_salts(6)
    seen = []
    monkeypatch.setattr(stages, "process_partition", lambda ctx, given, p: seen.append((p, len(given.side))) or iter(()))
    monkeypatch.setattr(stages.worker_gc, "task_started", lambda: None)
    side = _rows([salts[0], salts[1], salts[3], salts[3], salts[5]], "p", PING)
    for task in (0, 1):           # each task gets the rows the shuffle sends it: partition p to task p % 2
        _in_task(monkeypatch, task)
        mine = side.filter(pa.array([salts.index(r) % 2 == task for r in side.column("route").to_pylist()]))
        assert list(stages.process_stage(None, salts, 2)(iter([mine]))) == []
    assert seen == [(0, 1), (2, 0), (4, 0), (1, 1), (3, 2), (5, 1)]   # task 0's, then task 1's


def test_tasks_must_divide_the_partitions():
    with pytest.raises(ValueError):
        stages.process_stage(None, partition_salts(6), 4)


def test_spark_sends_a_partition_s_rows_to_its_index_modulo_a_divisor():
    """repartition(tasks, route) with tasks dividing the partition count: partition p's salt hashes to
    p modulo tasks (Spark's pmod of murmur3), what process_stage relies on."""
    from fencing.stream.routing import spark_hash_long
    for n in (6, 12):
        salts = partition_salts(n)
        for tasks in (d for d in range(1, n + 1) if n % d == 0):
            assert [spark_hash_long(s) % tasks for s in salts] == [p % tasks for p in range(n)]


def test_process_tasks_are_the_fewest_that_keep_the_cores_busy():
    assert process_tasks(6, 2) == 2
    assert process_tasks(6, 4) == 3
    assert process_tasks(6, 8) == 6
    assert process_tasks(6, 1) == process_tasks(6, 0) == 1
    assert process_tasks(7, 2) == 7                              # one task would leave a core idle
    assert process_tasks(12, 2) == 2 and process_tasks(12, 5) == 4
