"""Keep Spark's per-task garbage collection in the Python workers cheap.

A reused PySpark worker runs `gc.collect()` after every task (pyspark/daemon.py): a full collection
of every object the worker holds (the modules, the fence caches). A profile of the job at a trickle
of reports put 80% of the workers' CPU there, and a task's worker is busy collecting while the next
task waits for it. So each task starts by freezing what is alive (fencing.model.gc_freeze): the
collection after the task then walks only the task's own objects. Once every 10 minutes a task lets a
full pass through (at 100k fences it walks the cache for 0.3-0.45 s; fence_cache also freezes after a
bulk load).

While a task computes, the collector is paused altogether (`collector_paused`): a batch makes
hundreds of thousands of objects (states, events, their dicts) that live until the task ends, and the
young collections walked them again and again, ~5% of the fencing core's time on a sparse batch. They
hold no cycles to speak of; reference counting frees them, and the collection after the task takes
whatever cycle there is.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

from fencing.model.gc_freeze import FreezePolicy

FULL_EVERY_S = 600.0
_policy = FreezePolicy(FULL_EVERY_S)


def task_started() -> None:
    """Call first thing in a task's function on a Python worker."""
    _policy.step()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block (as it was before, after it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
