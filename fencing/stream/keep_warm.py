"""Keeps the executors' Python workers, and the fence caches they hold, alive while no micro-batch runs.

Spark stops its idle Python workers when none has been used for a minute (PythonWorkerFactory; not
configurable), and a new worker must load the whole fence map before it can test a point: ~7 s at 100k
fences, paid by the first report after a quiet spell. While the stream is idle, this driver thread runs
a tiny job every `HERDFENCE_KEEP_WARM_SECONDS`. Each task bulk-loads the fence groups its worker has not
cached yet (all of them in a new worker; those saved meanwhile in an old one), so the next micro-batch
does not.

A run must meet every pooled worker, and the pool can hold more workers than there are cores: a stage
that chains two Python operators holds two workers per task. Spark hands idle workers out first in,
first out, so n tasks in a row meet n different workers while the pool holds at least n. A run
therefore has twice as many tasks as the last run met workers (at least two per core): it wraps around
the pool, and room is left for the pool to have grown. The last run is in `job:keepwarm`: time,
tasks' pids, fences cached.
"""
from __future__ import annotations

import os
import time
from typing import Callable

import orjson

from fencing.stream.periodic import Periodic
from fencing.config import TUNING

KEEP_WARM_S = TUNING.keep_warm_seconds   # 0 = off
STATUS_KEY = ACTIVE_WARM_KEY = "job:keepwarm"
STANDBY_WARM_KEY = "job:keepwarm:standby"    # the hot standby's runs (fencing.stream.job)
HOLD_S = 0.05       # a task holds its worker a moment, so a run's tasks spread over every executor


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
        self.workers_met = 0        # distinct workers the last run met
        self.planner = False        # a standby: also warm the source's planner and the batch's operators
        self.batch_path_warm = False  # the batch's operators were run once (the JVM keeps what it compiled)

    def tick(self) -> None:
        if time.time() - self.last_activity() >= self.every_s:   # else micro-batches keep the workers busy
            self.warm_once()        # best effort: a missed run only costs a reload later

    def warm_once(self) -> list[dict]:
        sc = self.spark.sparkContext
        sc.setJobDescription("herdfence: keep the Python workers warm")
        n = 2 * max(1, sc.defaultParallelism, self.workers_met)
        rows = [r.asDict() for r in self.spark.range(0, n, 1, n)
                .mapInArrow(_warm_task(self.redis_node), "pid long, fences long").collect()]
        self.workers_met = len({r["pid"] for r in rows})
        if self.planner:          # a standby: also what the first batch after a take-over would pay
            from fencing.stream import routing
            from fencing.stream.warm_standby import warm_batch_path, warm_planner
            # the planner's Python worker is stopped when idle a minute, like any: met every run
            warm_planner(self.spark)
            if not self.batch_path_warm:
                # loaded classes and compiled code stay in the JVM: once is enough (its shuffle and
                # a task per routed partition every run were a third of an idle standby's CPU)
                warm_batch_path(self.spark, routing.load(self.redis).partitions)
                self.batch_path_warm = True
        self.runs += 1
        self.redis.set(self.status_key, orjson.dumps({"time": time.time(), "runs": self.runs, "tasks": rows,
                                                      "driver_pid": os.getpid()}))
        return rows
