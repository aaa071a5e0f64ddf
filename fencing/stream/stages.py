"""The process stage's task side, one mapInArrow function per shape of a micro-batch (the source plans
the shape: fencing.stream.single_task; the driver builds the matching stage: fencing.stream.job). Each
task starts with its garbage-collection step (fencing.stream.worker_gc), once:

- behind `repartition(n, route)`, a task serves one routed partition: its Spark partition's;
- a single-task batch's one task serves every routed partition in turn, each with the SHUFFLED rows
  the shuffle would have sent it (an empty one too: the controller expects a statistics row from
  each partition).
"""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa
from pyspark import TaskContext

from fencing.stream import rows, worker_gc
from fencing.stream.process import ProcessContext, process_partition


def shuffled_stage(ctx: ProcessContext):
    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        worker_gc.task_started()
        context = TaskContext.get()
        yield from process_partition(ctx, rows.unpack(batches), context.partitionId() if context else 0)
    return stage


def single_task_stage(ctx: ProcessContext, salts: tuple[int, ...]):
    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        worker_gc.task_started()
        for partition, part in enumerate(rows.split_by_route(batches, salts)):
            yield from process_partition(ctx, rows.unpack(part), partition)
    return stage
