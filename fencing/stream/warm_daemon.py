"""The daemon Spark forks the job's Python workers from (`spark.python.daemon.module`), with the fence
map already loaded.

Spark starts a Python worker by forking its daemon, and starts one whenever a task finds no idle
worker: at a job's start, after a minute idle, and at random when more tasks run at once than workers
are idle. A worker forked from pyspark's own daemon holds no fences, and its first task loads them all
(at 100,000 fences 5-11 s of a core, in the micro-batch that happened to meet it: the cause of a
benchmark's occasional slow run, and of a restarted job's slow first batch).

This daemon holds the fence cache (fencing.stream.fence_cache) itself. While no worker is asked for,
it brings the cache up to date every HERDFENCE_KEEP_WARM_SECONDS (its poll loop, idle): the whole map
once, then what changed. Once it holds the map, it also brings it up to date just before each fork (a
version check per group when nothing changed), so that every worker is forked with every fence cached,
sharing the daemon's memory until it writes to it; a worker's own refresh is then a version check. A
map import is loaded once per daemon, not once per worker. The first workers of a job, forked before
the daemon's first load, start as pyspark's do: a job's start waits for no load of the daemon's. Its
Redis client is closed before the fork (a child never shares its socket).

Anything going wrong here only costs the old behaviour: the worker loads the fences itself.
"""
from __future__ import annotations

import os
import select
import sys
import time


_LOADED = {"once": False}      # the daemon's cache has been brought up to date at least once


def refresh_before_fork() -> None:
    """Bring this process's fence cache up to date (every group, changed ones reloaded)."""
    started = time.perf_counter()
    try:
        from fencing.config import load_settings
        from fencing.model.redis_conn import new_cluster
        from fencing.stream.fence_cache import process_cache
        cache = process_cache()
        if not cache.preload:
            return
        client = new_cluster(*load_settings().redis_node, retry=None)   # no Redis (a test's Spark): at once
        try:
            cache.warm(client)
        finally:
            client.close()
        _LOADED["once"] = True
    except Exception as e:  # noqa: BLE001 - never stop a worker from starting
        print(f"herdfence warm daemon: the fence cache was not refreshed before a fork ({e!r}); the worker "
              "loads it itself", file=sys.stderr, flush=True)
        return
    took = time.perf_counter() - started
    if took > 1.0:
        print(f"herdfence warm daemon: {len(cache)} fences up to date in {took:.1f} s before a fork",
              file=sys.stderr, flush=True)


# the worker module whose workers run tasks (readers and the process stage); Spark's other daemons
# (data source lookup and planning) never test a point and get no fences
TASK_WORKER = "pyspark.worker"


class _RefreshingPoll:
    """pyspark's daemon waits for fork requests in `poll(1000)`: an idle wait longer than `every_s`
    since the last refresh brings the cache up to date."""

    def __init__(self, poll, every_s: float) -> None:  # noqa: ANN001 - select.poll
        self._poll, self.every_s = poll, every_s
        self.refreshed_at = time.monotonic()

    def register(self, *args) -> None:
        self._poll.register(*args)

    def unregister(self, *args) -> None:
        self._poll.unregister(*args)

    def poll(self, timeout=None) -> list:  # noqa: ANN001
        events = self._poll.poll(timeout)
        if not events and time.monotonic() - self.refreshed_at >= self.every_s:
            refresh_before_fork()
            self.refreshed_at = time.monotonic()
        return events


def main() -> None:
    from pyspark import daemon

    from fencing.config import TUNING
    if sys.argv[1:2] != [TASK_WORKER]:
        daemon.manager()
        return
    fork, poll = os.fork, select.poll
    polls: list[_RefreshingPoll] = []

    def warm_fork() -> int:
        if _LOADED["once"]:         # else the first idle poll loads the map: nothing in a job start's way
            refresh_before_fork()
            for p in polls:
                p.refreshed_at = time.monotonic()
        pid = fork()
        if pid == 0:                # the worker: the standard calls again
            os.fork, select.poll = fork, poll
        return pid

    def refreshing_poll() -> _RefreshingPoll:
        polls.append(_RefreshingPoll(poll(), TUNING.keep_warm_seconds))
        return polls[-1]
    os.fork = warm_fork
    if TUNING.keep_warm_seconds > 0:
        select.poll = refreshing_poll
    daemon.manager()


if __name__ == "__main__":
    main()
