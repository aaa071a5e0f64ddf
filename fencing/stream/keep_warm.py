"""Keeps the executors' Python workers, and the fence caches they hold, alive while no micro-batch runs.

Spark stops a Python worker that has been idle for a minute (PythonWorkerFactory; not configurable),
and a new worker must load the whole fence map before it can test a point: ~7 s at 100k fences, paid
by the first report after a quiet spell. While the stream is idle, this driver thread runs a tiny job
every `HERDFENCE_KEEP_WARM_SECONDS` with one task per executor core. Each task holds its worker for a
moment, so the tasks land on different pooled workers. Each task also bulk-loads the fence groups its
worker has not cached yet (all of them in a new worker; those saved meanwhile in an old one), so the
next micro-batch does not. The last run is in `job:keepwarm`: time, tasks' pids, fences cached.
"""
from __future__ import annotations

import os
import time
from typing import Callable

import orjson

from fencing.stream.periodic import Periodic
from fencing.config import TUNING

KEEP_WARM_S = TUNING.keep_warm_s   # 0 = off
STATUS_KEY = ACTIVE_WARM_KEY = "job:keepwarm"
STANDBY_WARM_KEY = "job:keepwarm:standby"    # the hot standby's runs (fencing.stream.job)
HOLD_S = 0.3        # long enough that a run's tasks overlap, so no worker serves two of them


def _warm_task(redis_node: tuple[str, int]):
    def run(batches):
        import pyarrow as pa

        from fencing.stream.fence_cache import process_cache
        from fencing.model.redis_conn import cluster
        # what a micro-batch's tasks import (readers and process stage): a standby that takes over
        # then pays no module loading in its first batch
        import fencing.stream.prepare  # noqa: F401
        import fencing.stream.process  # noqa: F401
        import ingest.kafka_read  # noqa: F401
        for _ in batches:
            pass
        started = time.perf_counter()
        cache = process_cache()
        cache.warm(cluster(*redis_node))
        time.sleep(max(0.0, HOLD_S - (time.perf_counter() - started)))
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()], "fences": [len(cache)]})
    return run


class KeepWarm(Periodic):
    def __init__(self, spark, redis, redis_node: tuple[str, int], last_activity: Callable[[], float],
                 every_s: float = KEEP_WARM_S, status_key: str = STATUS_KEY):
        super().__init__("keep-warm", every_s)
        self.status_key = status_key
        self.spark, self.redis, self.redis_node = spark, redis, redis_node
        self.last_activity = last_activity
        self.runs = 0

    def tick(self) -> None:
        if time.time() - self.last_activity() >= self.every_s:   # else micro-batches keep the workers busy
            self.warm_once()        # best effort: a missed run only costs a reload later

    def warm_once(self) -> list[dict]:
        sc = self.spark.sparkContext
        sc.setJobDescription("herdfence: keep the Python workers warm")
        n = max(1, sc.defaultParallelism)
        rows = [r.asDict() for r in self.spark.range(0, n, 1, n)
                .mapInArrow(_warm_task(self.redis_node), "pid long, fences long").collect()]
        self.runs += 1
        self.redis.set(self.status_key, orjson.dumps({"time": time.time(), "runs": self.runs, "tasks": rows,
                                                      "driver_pid": os.getpid()}))
        return rows
