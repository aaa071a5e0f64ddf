"""Executor scaling of the running job on a Spark cluster (standalone, Kubernetes, YARN).

For the elastic controller (fencing/elastic/controller.py), which runs inside the job's driver process:

    from fencing.elastic import scale
    scale.executor_ids(sc)             # ["0", "1"]: the live executors (the driver excluded)
    scale.request_executors(sc, 1)     # ask the cluster manager for one more executor
    scale.kill_executors(sc, ["1"])    # give executors back (the cluster manager does not replace them)
    scale.scale_to(sc, 3)              # request or kill the difference (kills the highest ids first)

They call the driver's SparkContext through Py4J (sc._jsc.sc().requestExecutors / killExecutor), the
same ExecutorAllocationClient that Spark's dynamic allocation uses; in local mode they do nothing and
return False.

Two ways to own the executor count — pick one (HERDFENCE_DYNAMIC_ALLOCATION):
  * 1 (default for an external spark:// or k8s:// master, see fencing/stream/spark_session.py): Spark's
    dynamic allocation adds executors while tasks queue up for longer than schedulerBacklogTimeout
    and removes executors idle for executorIdleTimeout, between HERDFENCE_MIN/MAX_EXECUTORS. Spark
    then refuses killExecutors (kill_executors returns []) and its allocation manager overrides
    explicit requests at its next adjustment: the controller should only re-plan partitions.
  * 0 (default for `herdfence up --spark-workers N`): the elastic controller drives the count with
    request_executors / kill_executors / scale_to; killed executors are not replaced.

From outside the driver (operators, `herdfence up --spark-workers N`): RequestWatcher, started by the
job's SparkSession on a cluster, polls the Redis key `job:scale:request` — JSON {"id", "add": n} or
{"id", "kill": [ids]} or {"id", "target": n} — applies it once and publishes the executors it sees in
`job:executors` ({"time", "executor_ids", "last_request"}) every few seconds.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from typing import Any

log = logging.getLogger("herdfence.scale")
REQUEST_KEY = "job:scale:request"
EXECUTORS_KEY = "job:executors"


def _is_cluster(sc: Any) -> bool:
    return not sc.master.startswith("local")


def executor_ids(sc: Any) -> list[str]:
    """Ids of the live executors (sorted numerically when they are numbers)."""
    seq = sc._jsc.sc().getExecutorIds()
    ids = list(sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava(seq))
    return sorted((str(i) for i in ids), key=lambda i: (not i.isdigit(), int(i) if i.isdigit() else 0, i))


_targets: dict[int, int] = {}      # id(sc) -> the executor total we last asked for (pending ones count)


def _set_total(sc: Any, total: int) -> bool:
    """Absolute target (SparkContext.requestTotalExecutors): robust where relative requests are not —
    the standalone backend's own running total starts at 0 without dynamic allocation."""
    jvm = sc._jvm
    no_locality = jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(jvm.java.util.HashMap())
    ok = bool(sc._jsc.sc().requestTotalExecutors(int(total), 0, no_locality))
    if ok:
        _targets[id(sc)] = int(total)
    return ok


def request_executors(sc: Any, n: int = 1) -> bool:
    """Ask the cluster manager for `n` more executors. False in local mode or when refused."""
    if n <= 0 or not _is_cluster(sc):
        return False
    if dynamic_allocation(sc):       # advisory: the allocation manager adjusts it at its next step
        ok = bool(sc._jsc.sc().requestExecutors(int(n)))
    else:
        ok = _set_total(sc, max(_targets.get(id(sc), 0), len(executor_ids(sc))) + int(n))
    log.info("requested %d more executor(s): %s", n, "accepted" if ok else "refused")
    return ok


def kill_executors(sc: Any, ids: list[str]) -> list[str]:
    """Release the given executors (not replaced); returns the ids the cluster manager accepted."""
    if not _is_cluster(sc):
        return []
    if dynamic_allocation(sc):
        log.warning("kill_executors(%s) refused: dynamic allocation owns the executor count", ids)
        return []
    live = executor_ids(sc)
    _set_total(sc, max(_targets.get(id(sc), 0), len(live)))     # a sane baseline for the decrement
    done = [i for i in ids if i in live and sc._jsc.sc().killExecutor(str(i))]
    _targets[id(sc)] = max(0, _targets.get(id(sc), len(live)) - len(done))
    log.info("killed executors %s (asked %s)", done, ids)
    return done


def dynamic_allocation(sc: Any) -> bool:
    return sc.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true"


def scale_to(sc: Any, target: int) -> dict:
    """Request or kill executors so that `target` are (or will be) running."""
    target = max(0, int(target))
    ids = executor_ids(sc)
    if target > len(ids):
        return {"requested": target - len(ids), "ok": request_executors(sc, target - len(ids))}
    if target < len(ids):
        return {"killed": kill_executors(sc, ids[target:])}
    return {}


# --- the standalone master's view (no SparkContext needed) ------------------------------------------
def master_state(ui_port: int, host: str = "127.0.0.1", timeout: float = 3.0) -> dict:
    """The standalone master's JSON (http://host:ui_port/json/): workers, cores used, apps."""
    with urllib.request.urlopen(f"http://{host}:{ui_port}/json/", timeout=timeout) as r:
        return json.load(r)


def busy_workers(state: dict) -> int:
    """ALIVE workers that run at least one executor core (of some application)."""
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE" and w.get("coresused", 0) > 0)


# --- remote requests through Redis ----------------------------------------------------------------
def post_request(redis_client: Any, **request: Any) -> str:
    """Queue a request for the job's RequestWatcher (`add`, `kill` or `target`); returns its id."""
    req = {"id": f"{time.time():.6f}", **request}
    redis_client.set(REQUEST_KEY, json.dumps(req))
    return req["id"]


class RequestWatcher(threading.Thread):
    """Applies requests posted in Redis to this driver's SparkContext and publishes its executors."""

    def __init__(self, sc: Any, redis_factory, interval_s: float = 2.0):
        super().__init__(name="herdfence-scale", daemon=True)
        self.sc, self.redis_factory, self.interval_s = sc, redis_factory, interval_s
        self.done: str | None = None
        self.last: dict | None = None

    def step(self, redis_client: Any) -> None:
        raw = redis_client.get(REQUEST_KEY)
        if raw:
            req = json.loads(raw)
            if req.get("id") != self.done:
                self.done = req.get("id")
                result: dict = {}
                if "add" in req:
                    result = {"requested": int(req["add"]), "ok": request_executors(self.sc, int(req["add"]))}
                elif "kill" in req:
                    result = {"killed": kill_executors(self.sc, [str(i) for i in req["kill"]])}
                elif "target" in req:
                    result = scale_to(self.sc, int(req["target"]))
                self.last = {**req, "result": result, "applied_at": time.time()}
                log.info("scale request %s applied: %s", req, result)
        ids = executor_ids(self.sc)
        redis_client.set(EXECUTORS_KEY, json.dumps({"time": time.time(), "executor_ids": ids,
                                                    "last_request": self.last}))

    def run(self) -> None:
        client = None
        while True:
            try:
                client = client or self.redis_factory()
                self.step(client)
            except Exception as e:  # noqa: BLE001 - never take the driver down; retry next round
                log.warning("scale watcher: %s", e)
                client = None
            time.sleep(self.interval_s)
