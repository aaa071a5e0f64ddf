"""fencing.stream.single_task: which micro-batches run as one task, how the driver reads that from the
checkpoint's offset log, and how one task's input is split back into its routed partitions."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from fencing.elastic.routing import partition_salts
from fencing.stream.single_task import (batch_is_single_task, by_partition, is_single_task, planned_records,
                                        single_task_stage)


def test_planned_records_counts_each_partition_and_new_ones_from_zero():
    assert planned_records({"0": 10, "1": 5}, {"0": 15, "1": 5}) == 5
    assert planned_records({"0": 10}, {"0": 12, "1": 3}) == 5        # partition 1 is new: from 0
    assert is_single_task({"0": 0}, {"0": 100}, 100)
    assert not is_single_task({"0": 0}, {"0": 101}, 100)
    assert not is_single_task({"0": 0}, {"0": 1}, 0)                  # 0 turns it off


def _log(ckpt, batch_id: int, offsets: dict) -> None:
    d = ckpt / "offsets"
    d.mkdir(parents=True, exist_ok=True)
    (d / str(batch_id)).write_text("v1\n" + json.dumps({"batchWatermarkMs": 0, "conf": {}}) + "\n"
                                   + json.dumps(offsets))


def test_the_driver_reads_the_same_offsets_the_source_planned_with(tmp_path):
    _log(tmp_path, 6, {"0": 100, "1": 200})
    _log(tmp_path, 7, {"0": 150, "1": 260})        # 110 records
    _log(tmp_path, 8, {"0": 5150, "1": 260})       # 5,000 records
    assert batch_is_single_task(str(tmp_path), 7, 110)
    assert not batch_is_single_task(str(tmp_path), 7, 109)
    assert not batch_is_single_task(str(tmp_path), 8, 4999)
    # what it cannot read, it never calls single: the shuffle is right for either plan
    assert not batch_is_single_task(str(tmp_path), 6, 10**9)        # no log of batch 5
    assert not batch_is_single_task(str(tmp_path), 9, 10**9)        # not logged yet
    assert not batch_is_single_task(str(tmp_path / "elsewhere"), 7, 10**9)
    (tmp_path / "offsets" / "7").write_text("v1\n{}\n")             # a torn file
    assert not batch_is_single_task(str(tmp_path), 7, 10**9)


def _rows(routes: list[int], tag: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"kind": pa.array(np.zeros(len(routes), np.int8)),
                                       "route": pa.array(routes, pa.int64()),
                                       "payload": pa.array([f"{tag}{i}" for i in range(len(routes))])})


def test_one_task_s_input_splits_into_its_partitions_in_order():
    salts = partition_salts(3)
    batches = [_rows([salts[2]] * 2, "a"), _rows([salts[0], salts[2], salts[0]], "b"), _rows([salts[2]], "c")]
    parts = by_partition(batches, salts)
    payloads = [[p for b in part for p in b.column("payload").to_pylist()] for part in parts]
    assert payloads == [["b0", "b2"], [], ["a0", "a1", "b1", "c0"]]


def test_the_stage_runs_every_partition_once_even_an_empty_one():
    salts = partition_salts(4)
    seen = []

    def process(part, partition):
        seen.append((partition, sum(b.num_rows for b in part)))
        yield _rows([salts[partition]], f"out{partition}-")
    out = list(single_task_stage(salts, process)(iter([_rows([salts[1], salts[3], salts[3]], "x")])))
    assert seen == [(0, 0), (1, 1), (2, 0), (3, 2)]
    assert len(out) == 4
