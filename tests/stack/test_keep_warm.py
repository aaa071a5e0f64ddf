"""The job's keep-warm (fencing/stream/keep_warm.py) on the test stack: while no report arrives it runs a
small job whose tasks meet every pooled Python worker, and the same workers serve run after run (Spark
would stop workers idle for a minute, and their successors would reload the whole fence map)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import orjson
import psutil

from deploy import stack as deploy_stack
from fencing.stream.keep_warm import STATUS_KEY, KeepWarm
from fencing.stream.spark_session import WARM_DAEMON
from tests.conftest import wait_for
from tests.farmkit import Farm, square
from tests.fixtures_spark import get_spark


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
    for run in (second, third):
        pids = [t["pid"] for t in run["tasks"]]
        # local[*]: a worker per core at least; more tasks than workers met: the run went round the pool
        assert (os.cpu_count() or 1) <= len(set(pids)) < len(pids), run
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


def _workers_of_a_chained_stage(spark, depth: int) -> set[int]:
    """Runs a stage that chains `depth` Python operators: each task holds `depth` workers at once."""
    def tag(column: str):
        def run(batches):
            import os
            import time

            import pyarrow as pa
            for batch in batches:
                time.sleep(0.2)     # the two tasks overlap: neither finds the other's workers idle
                yield batch.append_column(column, pa.array([os.getpid()] * batch.num_rows, pa.int64()))
        return run
    df, schema = spark.range(0, 2, 1, 2), "id long"
    for level in range(depth):
        schema += f", w{level} long"
        df = df.mapInArrow(tag(f"w{level}"), schema)
    return {pid for row in df.collect() for pid in list(row.asDict().values())[1:]}


def test_a_run_meets_every_pooled_worker_when_a_batch_left_more_than_one_per_core(stack):
    """A micro-batch whose stage chains Python operators leaves more idle workers than cores; a run
    that met only one per core let the others go cold (and Spark stop them)."""
    spark = get_spark()
    pool = _workers_of_a_chained_stage(spark, depth=3)
    assert len(pool) == 6
    keep_warm = KeepWarm(spark, stack.redis, stack.settings.redis_node, last_activity=lambda: 0.0,
                         status_key="test:keepwarm")
    runs = [{row["pid"] for row in keep_warm.warm_once()} for _ in range(3)]
    assert pool <= runs[-1] and runs[-1] == runs[-2]


def test_a_standby_warms_the_batch_path_once(stack):
    """The JVM keeps the classes and code the batch's operators loaded: running them again every
    keep-warm period only cost the standby CPU."""
    from fencing.stream.warm_standby import BATCH_PATH_GROUP
    spark = get_spark()
    tracker = spark.sparkContext.statusTracker()
    keep_warm = KeepWarm(spark, stack.redis, stack.settings.redis_node, last_activity=lambda: 0.0,
                         status_key="test:keepwarm:standby")
    keep_warm.planner = True

    def group_jobs() -> set[int]:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()     # job starts are recorded async
        return set(tracker.getJobIdsForGroup(BATCH_PATH_GROUP))
    before = group_jobs()
    try:
        keep_warm.warm_once()
        first = group_jobs() - before
        assert first                                   # the first run warmed it
        keep_warm.warm_once()
        keep_warm.warm_once()
        spark.range(0, 4, 1, 2).collect()              # the thread's later jobs are not in its group
        assert group_jobs() - before - first == set()
        assert orjson.loads(stack.redis.get("test:keepwarm:standby"))["runs"] == 3
    finally:
        stack.redis.delete("test:keepwarm:standby")    # the test's own record, also when it fails


# forks after bringing the cache up to date, as the daemon does for each worker; the child (a worker)
# exits 0 when the fence is in the cache it was forked with, 3 when not
_FORK_AFTER_REFRESH = """
import os, sys
from fencing.stream import warm_daemon
from fencing.stream.fence_cache import process_cache
warm_daemon.refresh_before_fork()
pid = os.fork()
if pid == 0:
    try:
        process_cache().geometry(sys.argv[1])
    except KeyError:
        os._exit(3)
    os._exit(0)
os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_workers_are_forked_with_the_fences_saved_before_they_start(stack):
    """The job's Python workers are forked by herdfence's daemon (fencing/stream/warm_daemon.py), which
    brings its own fence cache up to date before each fork: a worker holds a paddock drawn a moment
    before it started, before its first task (a worker forked bare loaded the whole map in its first
    batch)."""
    farm = Farm(stack, "warm daemon farm")
    uid = f"{farm.farm_id}/{farm.fence(square(-62.1, -35.2), name='fresh paddock')}"
    done = subprocess.run([sys.executable, "-c", _FORK_AFTER_REFRESH, uid], env=stack.env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]

    def daemons() -> list[str]:
        job = (deploy_stack.status(stack.settings)["components"].get("job") or {}).get("pid")
        if not job:
            return []
        found = []
        for child in psutil.Process(int(job)).children(recursive=True):
            try:
                found.append(" ".join(child.cmdline()))
            except psutil.Error:
                pass
        return [c for c in found if f"-m {WARM_DAEMON}" in c]
    wait_for(daemons, timeout=60, what="the job's Python workers forked by the warm daemon")


def test_the_job_jvm_starts_from_the_class_archive(stack):
    """The job's driver JVM loads its classes from the class archive (deploy/jvm_archive.py): the
    archive's pages are resident in it. A JVM that rejects the archive (another classpath, changed
    jars) may still map the file, but reads none of it."""
    from fencing.stream.class_archive import class_archive
    from tests.chaoskit import archive_resident_kb, children, read_pid

    archive = class_archive()
    assert archive is not None and archive.is_file()
    job = read_pid(stack.env["HERDFENCE_HOME"], "job")
    jvms = [c for c in children(job) if b"java" in open(f"/proc/{c}/cmdline", "rb").read()]
    assert jvms, "no JVM under the job's driver"
    resident_kb = archive_resident_kb(jvms[0], archive)
    assert resident_kb > 20_000, f"{resident_kb} kB of {archive} resident in the job's JVM"
