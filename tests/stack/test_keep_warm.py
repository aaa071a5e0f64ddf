"""The job's keep-warm (fencing/stream/keep_warm.py) on the test stack: while no report arrives it runs one task
per core, each on its own pooled Python worker, and the same workers serve run after run (Spark would
stop a worker idle for a minute, and its successor would reload the whole fence map)."""
from __future__ import annotations

import os
import time

import orjson

from fencing.stream.keep_warm import STATUS_KEY
from tests.farmkit import Farm, square


def _next_run(redis, after: int, timeout_s: float = 60.0) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        raw = redis.get(STATUS_KEY)
        status = orjson.loads(raw) if raw else None
        if status and status["runs"] > after:
            return status
        time.sleep(0.5)
    raise AssertionError(f"no keep-warm run after run {after} within {timeout_s} s")


def test_keep_warm_holds_the_same_workers_while_idle(stack):
    redis = stack.redis
    first = _next_run(redis, after=0)
    second = _next_run(redis, after=first["runs"])
    third = _next_run(redis, after=second["runs"])
    for run in (first, second, third):
        pids = [t["pid"] for t in run["tasks"]]
        # local[*]: one task per core, each on a worker of its own
        assert len(pids) == (os.cpu_count() or 1) and len(set(pids)) == len(pids), run
    assert {t["pid"] for t in second["tasks"]} == {t["pid"] for t in third["tasks"]}
    for pid in (t["pid"] for t in third["tasks"]):
        os.kill(pid, 0)                                          # the workers are alive (raises if not)


def test_keep_warm_loads_new_fence_groups_in_bulk(stack):
    """A paddock drawn while the herd is quiet reaches every worker's cache before the next report."""
    redis = stack.redis
    before = _next_run(redis, after=0)
    before = _next_run(redis, after=before["runs"])
    cached = {t["pid"]: t["fences"] for t in before["tasks"]}
    Farm(stack, "keep-warm farm").fence(square(-61.3, -34.7), name="far paddock")   # a group no batch meets
    started_before = _next_run(redis, after=before["runs"])      # may have begun before the fence was saved
    after = _next_run(redis, after=started_before["runs"])
    assert {t["pid"]: t["fences"] for t in after["tasks"]} == {pid: n + 1 for pid, n in cached.items()}
