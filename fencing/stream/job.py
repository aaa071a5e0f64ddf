"""The herdfence streaming job: Kafka `gps.reports` → H3 routing → aligned membership + transitions →
idempotent sinks. Run as `python -m fencing.stream.job` (herdfence up does this).

One streaming query; every micro-batch (foreachBatch, with its batch id) runs:
  read + prepare (the `herdreports` source, one task per Kafka partition)  → repartition(tasks, route)
  → process (a task per core, each serving its routed partitions: fencing.stream.batch_shape)  → collect
and the driver writes events / dead letters / pings, then a heartbeat with the batch's load figures
for the elastic controller.

Hot standby (issue 19): two job processes run; the one holding the lease (fencing.model.lease) runs
the query, the other has its SparkSession, Python workers and fence caches warm and waits for the
lease. The active one writes as its lease epoch's Redis user (fencing.model.job_user): a take-over
deletes that user, which stops an old driver's writes.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
import signal
import socket
import threading
import time

import orjson
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from fencing.config import TOPIC_REPORTS, Settings, load_settings
from fencing.stream import routing
from fencing.model.fence_store import DELETED_FENCES
from fencing.model.heartbeat import Heartbeat, PartitionStats, ReaderTiming, RunningBatch
from fencing.model.offset_log import logged_offsets
from fencing.model.job_user import admit_everywhere, admit_missed
from fencing.model.lease import Lease, mark_standby
from fencing.stream.process import ProcessContext
from fencing.stream import fork_server, rows
from fencing.stream.keep_warm import ACTIVE_WARM_KEY, KEEP_WARM_S, STANDBY_WARM_KEY, KeepWarm
from fencing.model.redis_conn import cluster
from fencing.stream.pruning import DeletedFencePruner, HistoryCompactor
from fencing.stream.retention import RETENTION_DAYS, EventRetention
from fencing.stream.silent import SEEN_STEP_MS, SilentScanner
from fencing.stream import standby_priority
from fencing.stream.batch_shape import process_tasks
from fencing.stream.stages import process_stage
from fencing.stream.sinks import Sinks
from fencing.stream.spark_session import build_session, is_local, start_scale_watcher
from fencing.config import TUNING

log = logging.getLogger("herdfence.job")
MAX_OFFSETS_PER_TRIGGER = TUNING.max_offsets_per_trigger
TRIGGER = TUNING.trigger
ELASTIC = TUNING.elastic
STANDBY_WARM_EVERY_S = 45.0     # a standby's keep-warm period (Spark stops Python workers idle 60 s)


class BatchProcessor:
    """The foreachBatch function: one call per micro-batch, on the driver."""

    def __init__(self, spark: SparkSession, settings: Settings, observer=None):
        from ingest.producer import KafkaWriter

        self.spark, self.settings = spark, settings
        self.checkpoint = str(settings.checkpoint_dir)
        self.redis = cluster(*settings.redis_node)
        self.sinks = Sinks(self.redis, KafkaWriter(settings.kafka_bootstrap))
        self.epoch = 0                        # the lease epoch it writes under (0: a test's processor)
        self.observer = observer              # the elastic controller, when running
        self.totals = {"events": 0, "dead": 0, "points": 0, "redis_local": 0, "redis_cross": 0, "shed": 0}
        self.elastic = ELASTIC
        self.last_batch_end = time.time()     # the keep-warm thread runs only while the stream is idle
        self.holder = ""                      # this process's id in the lease
        self.active_since = 0.0               # when it took the lease (0: a test's processor)
        self.lease: Lease | None = None       # its lease (None: a test's processor)
        self.batches_run = 0

    def take_over(self, epoch: int) -> None:
        """Write from now on as `epoch`'s job user, admitted on every node first: the older epochs'
        users are deleted there, and with them their connections (fencing.model.job_user)."""
        default = self.redis
        missed = admit_everywhere(default, epoch)
        self.epoch = epoch
        self.redis = cluster(*self.settings.redis_node, epoch=epoch)
        self.sinks = Sinks(self.redis, self.sinks.producer)
        if missed:
            log.warning("job user of epoch %d not admitted yet on %s: retrying every second", epoch, missed)
            threading.Thread(target=admit_missed, args=(default, epoch), name="admit", daemon=True).start()

    @property
    def run_id(self) -> str:
        """The query's id from the checkpoint (stable across restarts from it, new when it is cleared)."""
        if not getattr(self, "_run_id", None):
            metadata = Path(self.checkpoint) / "metadata"
            self._run_id = orjson.loads(metadata.read_text().splitlines()[0])["id"][:8] if metadata.exists() else "run"
        return self._run_id

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.time()
        if self.active_since and not self.batches_run:     # the take-over's timeline (issue 19)
            log.info("first batch %s starts %.2f s after this job took the lease", batch_id, started - self.active_since)
        self.batches_run += 1
        # what `up` and `status` name while this batch runs (a batch that cannot finish says which)
        RunningBatch(batch_id, started, logged_offsets(self.checkpoint, batch_id) or {}).write(self.redis)
        table = routing.load(self.redis)
        n = table.partitions
        host, port = self.settings.redis_node
        deleted = frozenset(self.redis.smembers(DELETED_FENCES))
        proc = ProcessContext(batch_id, host, port, table, deleted, str(self.settings.history_dir), self.run_id,
                              SEEN_STEP_MS, self.epoch, elastic=self.elastic)

        # df: the source's reports, already parsed and routed by the readers (fencing.stream.report_source),
        # collected as Arrow: no Row object per event (tens of thousands a batch under a backlog)
        # the source read a small batch in one task, which then processes each routed partition in
        # turn, no shuffle; otherwise the shuffle gives each core a task (fencing.stream.batch_shape)
        single = df.rdd.getNumPartitions() == 1
        tasks = 1 if single else process_tasks(n, self.spark.sparkContext.defaultParallelism)
        staged = df if single else df.repartition(tasks, "route")
        out = staged.mapInArrow(process_stage(proc, routing.partition_salts(n), tasks), rows.OUTPUT_DDL).toArrow()
        spark_s = time.time() - started
        kinds = out.column("kind").to_numpy()
        # events stay Arrow (produced in chunks by the sinks): none becomes a Python object here
        events = out.filter(pa.array(kinds == rows.EVENT))
        side = out.filter(pa.array(kinds != rows.EVENT))
        del out
        side_kinds, payloads = side.column("kind").to_numpy(), side.column("payload")

        def rows_of(kind: int) -> list[str]:
            return payloads.filter(pa.array(side_kinds == kind)).to_pylist()
        dead, pings = rows_of(rows.DEAD), rows_of(rows.PING)
        stats = [PartitionStats.from_json(p) for p in rows_of(rows.STATS)]
        readers = [ReaderTiming.from_json(p) for p in rows_of(rows.READ)]
        self.sinks.write(f"{self.run_id}:{batch_id}", events, dead, pings)
        self._heartbeat(batch_id, table.version, started, events, dead, stats, readers,
                        spark_s=spark_s, sinks_s=time.time() - started - spark_s)
        self.last_batch_end = time.time()

    def _heartbeat(self, batch_id: int, routing_version: int, started: float, events: list, dead: list,
                   stats: list[PartitionStats], readers: list[ReaderTiming], spark_s: float = 0.0,
                   sinks_s: float = 0.0) -> None:
        points = sum(s.points for s in stats)
        shed = sum(s.shed for s in stats)
        self.totals["events"] += len(events)
        self.totals["dead"] += len(dead)
        self.totals["points"] += points
        self.totals["redis_local"] += sum(s.redis_local for s in stats)
        self.totals["redis_cross"] += sum(s.redis_cross for s in stats)
        self.totals["shed"] += shed
        progress = self._last_progress()
        beat = Heartbeat(
            batch_id=batch_id, time=time.time(), duration_s=round(time.time() - started, 3), points=points,
            events=len(events), dead_letters=len(dead), routing_version=routing_version,
            partitions=sorted(stats, key=lambda s: s.partition),
            events_total=self.totals["events"], dead_letters_total=self.totals["dead"],
            points_total=self.totals["points"], redis_local_total=self.totals["redis_local"],
            redis_cross_total=self.totals["redis_cross"], shed=shed, shed_total=self.totals["shed"],
            lag=self._lag(progress),
            # Spark's breakdown of the previous trigger (latestOffset, queryPlanning, addBatch = our
            # foreachBatch, walCommit, commitOffsets): what a batch costs outside the tasks
            previous_trigger_ms=dict(progress[0].get("durationMs") or {}) if progress else {},
            spark_s=round(spark_s, 3), sinks_s=round(sinks_s, 3), readers=readers,
            epoch=self.epoch, holder=self.holder, active_since=self.active_since,
            lease_gap_ms=self.lease.take_worst_gap_ms() if self.lease is not None else 0.0,
            log_gaps=[gap for r in readers for gap in r.gaps])
        if beat.log_gaps:
            log.warning("batch %d: skipped gaps in the input log (offsets no record holds): %s", batch_id,
                        ", ".join(f"{g['topic']}[{g['partition']}] {g['start']}..{g['end'] - 1}" for g in beat.log_gaps))
        beat.write(self.redis)
        if self.observer is not None:
            self.observer(beat)

    def _last_progress(self) -> list[dict]:
        """The active queries' last progress reports (one py4j round trip each, read once per beat)."""
        try:
            return [query.lastProgress or {} for query in self.spark.streams.active]
        except Exception:  # noqa: BLE001 - a metric, never a failure
            return []

    @staticmethod
    def _lag(progress: list[dict]) -> int:
        """Records in the source not yet processed (latest offset minus the batch's end offset), from the
        query's last progress report: one batch late, no extra Kafka round trip."""
        try:
            lag = 0
            for report in progress:
                for source in report.get("sources", []):
                    latest, end = source.get("latestOffset"), source.get("endOffset")
                    latest = orjson.loads(latest) if isinstance(latest, str) else latest
                    end = orjson.loads(end) if isinstance(end, str) else end
                    if isinstance(latest, dict) and isinstance(end, dict):
                        lag += sum(max(0, int(v) - int(end.get(k, v))) for k, v in latest.items()
                                   if isinstance(v, (int, float, str)) and str(v).lstrip("-").isdigit())
            return lag
        except Exception:  # noqa: BLE001 - a metric, never a failure
            return 0


def start_query(spark: SparkSession, settings: Settings, processor: BatchProcessor,
                checkpoint: str | None = None, trigger: str = TRIGGER):
    return query_writer(spark, settings, processor, checkpoint, trigger).start()


def _source(spark: SparkSession, settings: Settings, starting: str = "earliest",
            max_offsets: int = MAX_OFFSETS_PER_TRIGGER) -> DataFrame:
    from fencing.stream.report_source import register

    register(spark)
    host, port = settings.redis_node
    return (spark.readStream.format("herdreports")
            .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
            .option("redis", f"{host}:{port}")
            .option("subscribe", TOPIC_REPORTS)
            .option("startingOffsets", starting)
            .option("maxOffsetsPerTrigger", str(max_offsets))
            .option("singleTaskMaxRecords", str(TUNING.single_task_records))
            # a loud failure on lost offsets, unless the operator asked to skip them (docs/operations.md)
            .option("failOnDataLoss", "false" if TUNING.skip_lost_offsets else "true")
            .option("holdFile", str(settings.ingest_hold_file))
            .load())


def query_writer(spark: SparkSession, settings: Settings, processor: BatchProcessor,
                 checkpoint: str | None = None, trigger: str = TRIGGER):
    """The streaming query, planned but not started (a standby plans it before it takes over)."""
    source = _source(spark, settings)
    processor.checkpoint = checkpoint or str(settings.checkpoint_dir)
    return (source.writeStream.foreachBatch(processor)
            .option("checkpointLocation", processor.checkpoint)
            .trigger(processingTime=trigger).queryName("herdfence"))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # py4j logs from __del__ on connection close: with the JVM gone that can deadlock on the handler lock
    logging.getLogger("py4j").setLevel(logging.WARNING)
    settings = load_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    holder = f"{socket.gethostname()}:{os.getpid()}"
    lease = Lease(cluster(*settings.redis_node), holder, TUNING.job_lease_ms, on_lost=_lease_lost)
    waiting = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: waiting.set())
    epoch = lease.acquire(wait=False)      # first, so a standby on a cluster can ask for no executors
    # a standby yields the CPU while it warms and waits: its JVM and Python workers inherit this
    lowered = not epoch and standby_priority.lower(TUNING.standby_nice)
    if TUNING.fork_server and is_local(settings.spark_master_url):
        # the query's Python runner forked warm: a take-over's query start pays no imports
        os.environ["PYSPARK_PYTHON"] = str(fork_server.start())
    spark = build_session(settings.spark_master_url, standby=not epoch)
    processor = BatchProcessor(spark, settings)
    processor.holder, processor.lease = holder, lease
    JvmWatchdog(spark).start()
    # warm before waiting: Python workers started, fence caches loaded, the query planned. A standby
    # on a cluster holds no executors (they would be taken from the active job): it warms its driver only.
    keep_warm = KeepWarm(spark, processor.redis, settings.redis_node, lambda: processor.last_batch_end,
                         status_key=STANDBY_WARM_KEY if not epoch else ACTIVE_WARM_KEY)
    keep_warm.planner = not epoch
    if not epoch and keep_warm.every_s > 0:
        # a standby shares the machine with the active job: warm just often enough that Spark, which
        # stops a Python worker idle for a minute, keeps them (each run is two small Spark jobs, the
        # first also runs the batch's operators once: fencing.stream.warm_standby)
        keep_warm.every_s = max(keep_warm.every_s, STANDBY_WARM_EVERY_S)
    warm_executors = bool(epoch) or is_local(settings.spark_master_url)
    if warm_executors:
        if not epoch:
            # a standby warms now, so that a take-over pays nothing; an active job starts its query at
            # once: its first micro-batch starts the workers, and the keep-warm thread fills their
            # caches once the stream is idle
            _try(keep_warm.warm_once, "warming the Python workers")
        keep_warm.start()
    writer = query_writer(spark, settings, processor)
    taken = epoch
    if not taken:         # another job is active: stand by, warm
        _try(lambda: mark_standby(processor.redis, processor.holder), "marking the standby ready")
        log.info("herdfence job %s ready; standing by for the lease", processor.holder)
        taken = lease.acquire(stop=waiting)
    if not taken:        # SIGTERM while standing by
        logging.shutdown()
        os._exit(0)
    processor.take_over(taken)      # before its first write
    if lowered:
        log.info("back to the normal CPU priority (%d threads)", standby_priority.restore())
    if not warm_executors:
        keep_warm.start()
        start_scale_watcher(spark)
    keep_warm.status_key, keep_warm.planner, keep_warm.every_s = ACTIVE_WARM_KEY, False, KEEP_WARM_S
    if not epoch:   # its standby record is no standby's any more: a poller waiting for it would wait in vain
        _try(lambda: processor.redis.delete(STANDBY_WARM_KEY), "clearing the standby's keep-warm record")
    if ELASTIC:
        from fencing.elastic.controller import Controller
        processor.observer = Controller(processor.redis)
    processor.active_since = time.time()
    query = writer.start()
    log.info("query started in %.2f s", time.time() - processor.active_since)
    SilentScanner(processor.redis, processor.sinks).start()
    if RETENTION_DAYS > 0:
        EventRetention(processor.redis).start()
    DeletedFencePruner(processor.redis, processor.checkpoint, lambda: processor.run_id).start()
    if settings.history_dir:
        HistoryCompactor(str(settings.history_dir), processor.checkpoint, lambda: processor.run_id).start()
    log.info("herdfence job active (lease epoch %d): kafka=%s redis=%s:%s master=%s", processor.epoch,
             settings.kafka_bootstrap, *settings.redis_node, settings.spark_master_url)

    def stop(*_):
        # not from inside the signal handler: it may interrupt a py4j call of the main thread
        lease.release()
        threading.Thread(target=query.stop, name="stop", daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    code = 0
    try:
        query.awaitTermination()
    except BaseException:      # the query failed or the JVM died: leave, the supervisor restarts us
        log.exception("the streaming query stopped")
        code = 1
    # os._exit: interpreter shutdown can hang on py4j's callback threads once the JVM is gone
    logging.shutdown()
    os._exit(code)


def _lease_lost() -> None:
    """A job that lost its lease exits at once (its writes are refused anyway); the supervisor
    starts it again as the standby."""
    logging.shutdown()
    os._exit(5)


def _try(step, what: str) -> None:
    try:
        step()
    except Exception:  # noqa: BLE001 - warming is best effort
        log.exception("%s failed", what)


class JvmWatchdog(threading.Thread):
    """Exit the driver when its JVM is gone (killed, OOM): otherwise py4j calls can block forever and a
    live-looking pid would keep the supervisor from restarting the job."""

    def __init__(self, spark: SparkSession, every_s: float = 2.0):
        super().__init__(name="jvm-watchdog", daemon=True)
        self.proc = getattr(spark.sparkContext._gateway, "proc", None)
        self.every_s = every_s

    def run(self) -> None:
        while self.proc is not None:
            time.sleep(self.every_s)
            if self.proc.poll() is not None:
                log.error("the Spark JVM exited (code %s); exiting so that the job is restarted", self.proc.returncode)
                os._exit(3)


if __name__ == "__main__":
    main()
