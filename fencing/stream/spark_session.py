"""The SparkSession of the job (and of the test suite): loopback only, no UI, Arrow on.

local[*] (the default): everything in one JVM, nothing shipped.

A cluster master (spark://, k8s://, yarn), as `herdfence up --spark-workers N` or
HERDFENCE_SPARK_MASTER gives it:
  * the executors' Python code is the artefact in HERDFENCE_PYFILES (deploy/artifact.py builds it),
    shipped with SparkContext.addPyFile — before the job registers its data source or defines any
    function, so every Python function carries it in its includes; a probe job logs where the
    executors import `fencing` from (HERDFENCE_HOME/run/executors.json, and the job log);
  * dynamic allocation with shuffle tracking (no external shuffle service needed), bounded by
    HERDFENCE_MIN_EXECUTORS / HERDFENCE_MAX_EXECUTORS (HERDFENCE_DYNAMIC_ALLOCATION=0 turns it off);
  * one core per executor (HERDFENCE_EXECUTOR_CORES), HERDFENCE_EXECUTOR_MEMORY (1g);
  * fencing.elastic.scale.RequestWatcher: executor requests posted in Redis (job:scale:request) are applied,
    the live executors published (job:executors).
When the job was launched by spark-submit (a Kubernetes driver pod), the driver's host, bind address
and memory come from spark-submit and are left alone.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time

from pyspark.sql import SparkSession

from fencing.config import TUNING, load_settings, spark_cluster_conf
from fencing.stream.class_archive import with_class_archive

log = logging.getLogger("herdfence.spark")


def is_local(master: str) -> bool:
    return master.startswith("local")


CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
cluster_conf = spark_cluster_conf      # fencing/config.py: the one reader of HERDFENCE_* variables


# The local JVM (driver + executor) mostly moves bytes: the readers hand the shuffle a few Arrow IPC
# blobs per task. C2's compiler threads took half of its CPU in a benchmark's measured run (2.2 of
# 4.4 core-s in 15 s); C1 alone compiles almost nothing after start and runs this work as fast
# (measured 2026-11-23). HERDFENCE_JVM_OPTIONS replaces it ("" = the JVM's default).
LOCAL_JVM_OPTIONS = TUNING.jvm_options
WARM_DAEMON = "fencing.stream.warm_daemon"
LOOPBACK_MASTERS = ("spark://127.0.0.1:", "spark://localhost:", "spark://[::1]:")


def local_jvm_options(options: str = LOCAL_JVM_OPTIONS) -> str:
    """The local JVM's options: `options` and the class archive (fencing.stream.class_archive)."""
    return with_class_archive(options)


def build_session(master: str, app_name: str = "herdfence", shuffle_partitions: int = 4,
                  standby: bool = False) -> SparkSession:
    """`standby`: the hot standby job's session (fencing.stream.job); on a cluster it starts with no
    executors, so that it takes none from the active job, and asks for them once it is active."""
    from fencing.config import check_spark_master
    check_spark_master(master)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Launched by spark-submit (a Kubernetes driver pod, the Spark Operator): the master, the driver's
    # address and memory, dynamic allocation and --py-files come from spark-submit; leave them alone.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    builder = SparkSession.builder.appName(app_name)
    if not submitted:
        host = TUNING.driver_host
        builder = (builder.master(master)
                   .config("spark.driver.host", host)
                   .config("spark.driver.bindAddress", TUNING.driver_bind or host)
                   .config("spark.driver.memory", TUNING.driver_memory))
        if is_local(master):
            builder = (builder.config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
                       .config("spark.driver.extraJavaOptions", local_jvm_options())
                       # shuffle files stay on this machine's disk: compressing them only costs CPU
                       .config("spark.shuffle.compress", "false"))
            if TUNING.warm_daemon:
                # every Python worker forked with the fence map loaded (fencing/stream/warm_daemon.py);
                # local only: an executor elsewhere may not have the package before its first task
                builder = builder.config("spark.python.daemon.module", WARM_DAEMON)
        else:
            # A standby asks for no executor while it waits. Without dynamic allocation a standalone
            # application takes every free core at once (the embedded cluster scales the active job by
            # explicit requests): so the standby always runs with it, from 0 executors.
            conf = cluster_conf({**os.environ, "HERDFENCE_DYNAMIC_ALLOCATION": "1", "HERDFENCE_MIN_EXECUTORS": "0",
                                 "HERDFENCE_INITIAL_EXECUTORS": "0"}) if standby else cluster_conf()
            for k, v in conf.items():
                builder = builder.config(k, v)
            # the driver JVM here is started by the same launcher as a local one: the archive fits it;
            # so it does the executors of a cluster on this machine (the workers launch them from the
            # same jars), not those of a remote one, whose pyspark may lie elsewhere
            archive_options = with_class_archive("")
            builder = builder.config("spark.driver.extraJavaOptions", archive_options)
            if master.startswith(LOOPBACK_MASTERS) and "spark.executor.extraJavaOptions" not in conf:
                builder = builder.config("spark.executor.extraJavaOptions", archive_options)
    builder = (builder.config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
               # Int.MaxValue turns off the per-row Arrow size check feeding mapInArrow (ArrowWriter
               # .sizeInBytes after every row: 14% of the executor JVM's CPU at 64 MB, the default)
               .config("spark.sql.execution.arrow.maxBytesPerBatch", "2147483647")
               # a per-row XXH64 over the shuffle (12% of the executor JVM's CPU) that detects retried
               # map tasks writing different rows; ours read a fixed Kafka offset range and the routing
               # table only changes between micro-batches, so a retry writes the same rows
               .config("spark.sql.shuffle.orderIndependentChecksum.enabled", "false")
               .config("spark.python.worker.reuse", "true")
               # the checkpoint's offsets and commits through Hadoop's FileSystem API: ~45 ms less of
               # every trigger than the FileContext default (walCommit 32 → 9 ms, commitOffsets 28 → 7
               # ms measured); like it, it refuses to replace a batch's existing file, which stops a
               # resumed old driver from rewriting the plan of the job that took over
               .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
               .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
               .config("spark.executorEnv.PYTHONHASHSEED", "0"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not is_local(spark.sparkContext.master):
        _ship_code(spark, probe=not standby)     # a probe job would take an executor from the active job
        if not standby:         # a standby applies no executor requests until it is active
            start_scale_watcher(spark)
    return spark


# --- the executors' code ----------------------------------------------------------------------------
def _ship_code(spark: SparkSession, probe: bool = True) -> None:
    from fencing.config import PYFILES_ENV, pyfiles_from_env
    files = pyfiles_from_env()
    submitted = [f for f in spark.sparkContext.getConf().get("spark.submit.pyFiles", "").split(",") if f]
    if submitted:      # spark-submit --py-files already ships them (and puts them on sys.path)
        log.info("executors' code from spark-submit --py-files: %s", submitted)
        files = [f for f in files if os.path.basename(f) not in {os.path.basename(x) for x in submitted}]
    elif not files:
        log.warning("no %s: executors will import herdfence from whatever is installed on their hosts",
                    PYFILES_ENV)
    for path in files:
        if not path.startswith(("local:", "hdfs:", "s3a:", "http:", "https:")) and not os.path.exists(path):
            raise FileNotFoundError(f"{PYFILES_ENV}: {path} does not exist")
        spark.sparkContext.addPyFile(path)
        log.info("shipping %s to the executors (addPyFile)", path)
    if probe:
        threading.Thread(target=_probe, args=(spark,), name="herdfence-probe", daemon=True).start()


def where_am_i(_: object) -> dict:
    """Runs on an executor: where this Python worker imports herdfence from."""
    import fencing
    import ingest
    return {"host": socket.gethostname(), "pid": os.getpid(), "executor_cwd": os.getcwd(),
            "fencing": fencing.__file__, "ingest": ingest.__file__, "python": sys.executable,
            "sys_path_head": sys.path[:3]}


def _probe(spark: SparkSession) -> None:
    """A tiny job: which file do the executors' `fencing` and `ingest` come from? Logged + written."""
    try:
        t0 = time.monotonic()
        sc = spark.sparkContext
        sc.setLocalProperty("spark.job.description", "herdfence: executor code probe")
        seen = sc.parallelize(range(8), 8).map(where_am_i).collect()
        unique = list({(s["pid"], s["fencing"]): s for s in seen}.values())
        for s in unique:
            log.info("executor python pid %s (%s) imports fencing from %s", s["pid"], s["executor_cwd"],
                     s["fencing"])
        home = str(load_settings().home)
        if home:
            out = os.path.join(home, "run", "executors.json")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "w") as f:
                json.dump({"time": time.time(), "probe_s": round(time.monotonic() - t0, 2),
                           "workers": unique}, f, indent=1)
    except Exception as e:  # noqa: BLE001 - a diagnostic, never a failure of the job
        log.warning("executor probe failed: %s", e)


def start_scale_watcher(spark: SparkSession) -> None:
    if not TUNING.scale_watch or is_local(spark.sparkContext.master):
        return
    from fencing.elastic import scale
    from fencing.config import load_settings
    from fencing.model.redis_conn import cluster

    def redis_client():
        return cluster(*load_settings().redis_node)
    scale.RequestWatcher(spark.sparkContext, redis_client).start()
