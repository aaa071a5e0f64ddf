"""The process stage's task side: one mapInArrow function for every shape of a micro-batch (the source
plans the shape: fencing.stream.batch_shape; the driver builds the stage: fencing.stream.job).

A task serves the routed partitions p with p % tasks == its index, each in turn, with the SHUFFLED rows
the shuffle sends that partition (an empty one too: the controller expects a statistics row from
each partition). `repartition(tasks, route)` puts partition p's rows in task p % tasks whenever
`tasks` divides the partition count (`routing.partition_salts`: Spark's hash of p's salt is p modulo
the partition count). So one function covers:

- the shuffle, a task per core: each serves several routed partitions (6 on 2 cores: 2 tasks of 3),
  or one where there are cores enough (tasks = partitions);
- a single-task batch, read by one task and processed without a shuffle (tasks = 1).

Each task starts with its garbage-collection step (fencing.stream.worker_gc), once.
"""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa
from pyspark import TaskContext

from fencing.stream import rows, worker_gc
from fencing.stream.process import ProcessContext, process_partition


def process_stage(ctx: ProcessContext, salts: tuple[int, ...], tasks: int):
    """The stage for a batch routed into len(salts) partitions and run as `tasks` tasks."""
    if tasks < 1 or len(salts) % tasks:
        raise ValueError(f"{tasks} tasks cannot serve {len(salts)} routed partitions evenly")

    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        worker_gc.task_started()
        context = TaskContext.get()
        task = context.partitionId() if context else 0
        parts = rows.split_by_route(batches, salts)
        for partition in range(task, len(salts), tasks):
            yield from process_partition(ctx, rows.unpack(parts[partition]), partition)
    return stage
