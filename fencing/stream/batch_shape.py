"""How a micro-batch is cut into Spark tasks: the one place that decides.

A micro-batch runs two stages: reader tasks over its Kafka ranges, a shuffle by route, process tasks
over the routed partitions (each routed partition aligned with its Redis node). Every task costs a
Python worker round trip, its scheduling in the JVM and its own fixed work (the routing table, the
Arrow streams), whatever its size, and a core runs one task at a time. So:

- readers: at most one task per core (`reader_groups`), the batch's ranges spread over them by
  records: four Kafka partitions on two cores are read by two tasks, not in two waves of two;
- process: the fewest tasks that keep the cores busy (`process_tasks`): 6 routed partitions on 2
  cores are 2 tasks of 3; a task serves its routed partitions in turn, each with its own reports,
  statistics and Redis node (fencing.stream.stages);
- a small batch (at most `limit` records, `is_single_task`) is one task: it reads every range and
  processes each routed partition in turn, with no shuffle. At a trickle the two-stage shape is
  almost all of the batch: ~0.4 s on this 2-core machine for no work, against ~0.12 s as one task
  (measured 2026-11-26).

Who decides: the source plans the reader tasks when it plans the batch's input partitions; the driver
asks the planned batch how many input partitions it has (one: the single task) and builds the
process stage to match. A replay plans the same offsets the same way. Events, states and
per-partition statistics are the same in every shape.
"""
from __future__ import annotations

from fencing.model.offset_log import Offsets
from ingest.kafka_types import KafkaRange, KafkaRanges


def planned_records(start: Offsets, end: Offsets) -> int:
    """Records in a micro-batch's range [start, end) (a partition missing from `start` starts at 0)."""
    return sum(max(0, int(e) - int(start.get(p, 0))) for p, e in end.items())


def is_single_task(start: Offsets, end: Offsets, limit: int) -> bool:
    return limit > 0 and planned_records(start, end) <= limit


def reader_groups(ranges: list[KafkaRange], tasks: int) -> list[KafkaRange | KafkaRanges]:
    """The ranges as at most `tasks` reader tasks (0: one per range): the largest first onto the task
    with the fewest records so far; a task of one range is that range."""
    if tasks <= 0 or len(ranges) <= tasks:
        return list(ranges)
    groups: list[list[KafkaRange]] = [[] for _ in range(tasks)]
    loads = [0] * tasks
    for r in sorted(ranges, key=lambda r: (-(r.end - r.start), r.partition, r.start)):
        least = loads.index(min(loads))
        groups[least].append(r)
        loads[least] += r.end - r.start
    return [g[0] if len(g) == 1 else KafkaRanges(tuple(sorted(g, key=lambda r: (r.partition, r.start))))
            for g in groups if g]


def process_tasks(partitions: int, cores: int) -> int:
    """Process tasks for a batch routed into `partitions`: a divisor of it (the shuffle then sends each
    routed partition whole to one task: fencing.stream.stages), the one whose waves over `cores` end
    first, and the fewest tasks among those (each task costs its own fixed work): 6 partitions on 2
    cores → 2 tasks, on 4 → 3, on 8 → 6; 7 on 2 → 7 (one task would leave a core idle)."""
    cores = max(1, cores)

    def finish(d: int) -> int:      # waves of `d` tasks on the cores, times each task's partitions
        return -(-d // cores) * (partitions // d)
    return min((d for d in range(1, partitions + 1) if partitions % d == 0), key=lambda d: (finish(d), d))
