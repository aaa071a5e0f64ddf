"""Keep Spark's per-task garbage collection in the Python workers cheap.

A reused PySpark worker runs `gc.collect()` after every task (pyspark/daemon.py): a full collection
of every object the worker holds (the modules, the fence caches). A profile of the job at a trickle
of reports put 80% of the workers' CPU there, and a task's worker is busy collecting while the next
task waits for it. So each task starts by freezing what is alive (fencing.model.gc_freeze): the
collection after the task then walks only the task's own objects. Once every 10 minutes a task lets a
full pass through (at 100k fences it walks the cache for 0.3-0.45 s; fence_cache also freezes after a
bulk load).
"""
from __future__ import annotations

from fencing.model.gc_freeze import FreezePolicy

FULL_EVERY_S = 600.0
_policy = FreezePolicy(FULL_EVERY_S)


def task_started() -> None:
    """Call first thing in a task's function on a Python worker."""
    _policy.step()
