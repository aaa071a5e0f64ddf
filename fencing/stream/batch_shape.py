"""How a micro-batch is cut into Spark tasks: the one place that decides.

A micro-batch runs two stages: a reader task per Kafka range, a shuffle by route, process tasks over
the routed partitions (each routed partition aligned with its Redis node). Every task costs a Python
worker round trip, its scheduling in the JVM and its shuffle fetch, whatever its size, and a core
runs one task at a time. So:

- process: the fewest tasks that keep the cores busy (`process_tasks`): 6 routed partitions on 2
  cores are 2 tasks of 3, not three waves of 2; a task serves its routed partitions in turn, each
  with its own reports, statistics and Redis node (fencing.stream.stages);
- a small batch (at most `limit` records, `is_single_task`) is one task: it reads every range and
  processes each routed partition in turn, with no shuffle. At a trickle the two-stage shape is
  almost all of the batch: ~0.4 s on this 2-core machine for no work, against ~0.12 s as one task
  (measured 2026-11-26).

Who decides: the source plans the single task when it plans the batch's input partitions; the driver
asks the planned batch how many input partitions it has (one: the single task, no shuffle) and builds
the process stage to match. A replay plans the same offsets the same way. Events, states and
per-partition statistics are the same in every shape.
"""
from __future__ import annotations

from fencing.model.offset_log import Offsets


def planned_records(start: Offsets, end: Offsets) -> int:
    """Records in a micro-batch's range [start, end) (a partition missing from `start` starts at 0)."""
    return sum(max(0, int(e) - int(start.get(p, 0))) for p, e in end.items())


def is_single_task(start: Offsets, end: Offsets, limit: int) -> bool:
    return limit > 0 and planned_records(start, end) <= limit


def process_tasks(partitions: int, cores: int) -> int:
    """Process tasks for a batch routed into `partitions`: a divisor of it (the shuffle then sends each
    routed partition whole to one task: fencing.stream.stages), the one whose waves over `cores` end
    first, and the fewest tasks among those (each task costs its own fixed work): 6 partitions on 2
    cores → 2 tasks, on 4 → 3, on 8 → 6; 7 on 2 → 7 (one task would leave a core idle)."""
    cores = max(1, cores)

    def finish(d: int) -> int:      # waves of `d` tasks on the cores, times each task's partitions
        return -(-d // cores) * (partitions // d)
    return min((d for d in range(1, partitions + 1) if partitions % d == 0), key=lambda d: (finish(d), d))
