"""Small micro-batches as one Spark task: read, prepare and process without the shuffle.

A micro-batch normally runs two stages: one reader task per Kafka partition, a shuffle by route, one
process task per routed partition (each aligned with its Redis node). At a trickle (a farm's collars,
a few reports a batch) that shape is almost all of the batch: 10 tiny tasks, two Python worker round
trips each, a shuffle and a second stage cost ~0.4 s on this 2-core machine for no work, where one task
reading everything and processing each routed partition in turn costs ~0.12 s (measured 2026-11-26).
The events, states and per-partition statistics are the same: the task runs the process
stage once per routed partition, with that partition's reports, in their arrival order.

Who decides: the source alone, when it plans the batch's input partitions: one when the batch's offset
range holds at most `limit` records (`is_single_task`). The driver asks the planned batch how many
input partitions it has and builds the stage to match (fencing.stream.stages holds both stages' task
side); a replay plans the same offsets the same way.
"""
from __future__ import annotations

from fencing.model.offset_log import Offsets


def planned_records(start: Offsets, end: Offsets) -> int:
    """Records in a micro-batch's range [start, end) (a partition missing from `start` starts at 0)."""
    return sum(max(0, int(e) - int(start.get(p, 0))) for p, e in end.items())


def is_single_task(start: Offsets, end: Offsets, limit: int) -> bool:
    return limit > 0 and planned_records(start, end) <= limit
