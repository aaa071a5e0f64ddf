"""Keep Spark's per-task garbage collection in the Python workers cheap.

A reused PySpark worker runs `gc.collect()` after every task (pyspark/daemon.py). That full collection
walks every object the worker holds: ~100k for the imported modules alone (20-30 ms) and far more
with the fence caches loaded. A profile of the job at a trickle of reports put 80% of the workers'
CPU there, and a task's worker is busy collecting while the next task waits for it.

So each task starts by freezing what is alive (gc.freeze: modules, fence caches, anything that
survived the previous collection); the collection after the task then sees only the task's own
objects. Frozen objects are still freed by reference counting; only cyclic garbage among them waits
for the next full pass, which every FULL_EVERY_S the worker lets through (gc.unfreeze before a task:
the collection after it walks everything once).
"""
from __future__ import annotations

import gc
import time

FULL_EVERY_S = 60.0
_last_full = time.monotonic()


def task_started() -> None:
    """Call first thing in a task's function on a Python worker."""
    global _last_full
    now = time.monotonic()
    if now - _last_full >= FULL_EVERY_S:
        _last_full = now
        gc.unfreeze()
    else:
        gc.freeze()
