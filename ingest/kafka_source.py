"""`herdkafka`: a Spark Python streaming data source reading one Kafka topic.

Offsets are {"<partition>": next_offset} (string keys: they round-trip through Spark's JSON
checkpoint). A micro-batch is the per-partition range [start, end); Spark checkpoints `end` before
running the batch, so a restarted query replays exactly the uncommitted ranges.

Options (as Spark's Kafka source): kafka.bootstrap.servers, subscribe, startingOffsets
(earliest | latest | JSON {"0": 42}), maxOffsetsPerTrigger, minPartitions, failOnDataLoss,
plus herdfence's: client (confluent | kafka-python, read path), probeIntervalMs (driver throttle),
partitionDiscoveryIntervalMs and holdFile (ingest.admission: latestOffset plans nothing new while the
reads are held).

Why the log end comes from a fetch response: Tansu's ListOffsets(latest) answers the newest batch's
first offset + 1, so the tail of the last batch would stay unread while producers are idle. The
high watermark in a Fetch response is exact on Tansu and on Kafka alike (see `LogEndProbe`).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructType
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from ingest.admission import held
from ingest.kafka_read import read_partition
from ingest.kafka_types import ARROW_SCHEMA, BATCH_ROWS, FETCH_WAIT_MS, SCHEMA, DataLossError, KafkaRange  # noqa: F401

log = logging.getLogger("herdfence.ingest")

Offsets = dict[str, int]


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    topic: str
    starting: str | Offsets = "latest"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    client: str = "confluent"
    probe_interval_s: float = 0.1
    discovery_interval_s: float = 5.0
    hold_file: str | None = None

    @classmethod
    def parse(cls, o: dict[str, str]) -> "SourceOptions":
        get = lambda k: o.get(k, o.get(k.lower()))  # noqa: E731 - Spark may lower-case keys
        bootstrap, topic = get("kafka.bootstrap.servers"), get("subscribe")
        if not bootstrap or not topic:
            raise ValueError("herdkafka needs options kafka.bootstrap.servers and subscribe")
        if "," in topic:
            raise ValueError("herdkafka subscribes to exactly one topic")
        starting: str | Offsets = (get("startingOffsets") or "latest").strip()
        if starting not in ("earliest", "latest"):
            starting = {str(k): int(v) for k, v in json.loads(starting).items()}
        num = lambda k: int(get(k)) if get(k) else None  # noqa: E731
        return cls(bootstrap, topic, starting, num("maxOffsetsPerTrigger"), num("minPartitions"),
                   (get("failOnDataLoss") or "true").lower() != "false",
                   get("client") or "confluent",
                   (num("probeIntervalMs") or 100) / 1000.0,
                   (num("partitionDiscoveryIntervalMs") or 5000) / 1000.0,
                   get("holdFile") or None)


# ----------------------------------------------------------------------------- pure planning
def fair_share(available: dict[str, int], budget: int) -> dict[str, int]:
    """Water-filling: every partition gets an equal share of `budget`, and what a short partition
    cannot use is spread over the others. Deterministic (ties broken by partition id)."""
    take = {p: 0 for p in available}
    left = {p: a for p, a in available.items() if a > 0}
    while budget > 0 and left:
        share = max(budget // len(left), 1)
        for p in sorted(left, key=int):
            if budget == 0:
                break
            t = min(share, left[p], budget)
            take[p] += t
            left[p] -= t
            budget -= t
        left = {p: a for p, a in left.items() if a > 0}
    return take


def split_ranges(ranges: list[KafkaRange], min_partitions: int | None) -> list[KafkaRange]:
    """Cut big ranges so that there are at least `min_partitions` input partitions (as Spark's
    KafkaOffsetRangeCalculator: pieces of about total/min_partitions offsets)."""
    ranges = [r for r in ranges if r.end > r.start]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    piece = max(-(-total // min_partitions), 1)
    out: list[KafkaRange] = []
    for r in ranges:
        cuts = list(range(r.start, r.end, piece)) + [r.end]
        out += [replace(r, start=a, end=b) for a, b in zip(cuts, cuts[1:])]
    return out


# ----------------------------------------------------------------------------- driver side
class LogEndProbe:
    """The exact log end of every partition, from Fetch responses (not ListOffsets).

    One confluent consumer is reused: each probe re-assigns it at the last known ends with
    enable.partition.eof, then polls until every partition answered with a record (its fetch
    response carried the high watermark, now cached) or an EOF event (offset = exact end). Small
    fetches keep a probe to a few KB; results are reused for `interval_s` because the driver asks
    every ~33 ms when idle."""

    def __init__(self, opts: SourceOptions) -> None:
        from confluent_kafka import Consumer
        self.opts = opts
        self.consumer = Consumer({
            "bootstrap.servers": opts.bootstrap, "group.id": "herdfence-probe",
            "enable.auto.commit": False, "enable.partition.eof": True,
            # Tansu answers an empty fetch when its storage is slower than the wait: at 10 ms its disk
            # engine (a listing of the partition's objects per fetch) never answered a probe
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": FETCH_WAIT_MS,
            "max.partition.fetch.bytes": 1024, "fetch.max.bytes": 1_048_576,
            "message.max.bytes": 1000, "queued.min.messages": 1, "log_level": 3,
            # librdkafka's defaults back off 500-1000 ms around each re-assign: measured 1 s per
            # probe with them, 13 ms without.
            "fetch.error.backoff.ms": 10, "fetch.queue.backoff.ms": 1,
        })
        self.known: dict[int, int] = {}
        self.partitions: list[int] = []
        self._probed_at = 0.0
        self._discovered_at = 0.0

    def discover(self, force: bool = False) -> list[int]:
        now = time.monotonic()
        if force or not self.partitions or now - self._discovered_at > self.opts.discovery_interval_s:
            md = self.consumer.list_topics(self.opts.topic, timeout=10)
            t = md.topics.get(self.opts.topic)
            if t is None or t.error is not None:
                if not self.partitions:
                    raise RuntimeError(f"topic {self.opts.topic!r} not found: {t and t.error}")
            else:
                self.partitions = sorted(t.partitions)
            self._discovered_at = now
        return self.partitions

    def low_watermarks(self, parts: list[int]) -> dict[int, int]:
        from confluent_kafka import TopicPartition
        # ListOffsets(earliest) is exact on Tansu; only "latest" under-reports.
        return {p: self.consumer.get_watermark_offsets(TopicPartition(self.opts.topic, p),
                                                       timeout=10, cached=False)[0] for p in parts}

    def listed_ends(self) -> dict[int, int]:
        """ListOffsets(latest) of every partition: milliseconds, but on Tansu short of the newest
        record batch (see the module doc). Enough when a backlog fills the batch anyway."""
        from confluent_kafka import TopicPartition
        listed = {p: self.consumer.get_watermark_offsets(TopicPartition(self.opts.topic, p), timeout=10,
                                                         cached=False)[1] for p in self.discover()}
        # the next exact probe starts its fetches there, not far behind (known ends are where it
        # starts); what it cached is older than this listing, so it probes again
        for p, e in listed.items():
            self.known[p] = max(self.known.get(p, e), e)
        self._probed_at = 0.0
        return listed

    def ends(self, force: bool = False, timeout_s: float = 5.0) -> dict[int, int]:
        from confluent_kafka import KafkaError, TopicPartition
        parts = self.discover()
        if not force and time.monotonic() - self._probed_at < self.opts.probe_interval_s \
                and set(parts) <= set(self.known):
            return dict(self.known)
        topic = self.opts.topic
        lows = self.low_watermarks([p for p in parts if p not in self.known])
        self.known.update(lows)
        # Seek slightly behind the known end so that a truncated/re-created log shows up as an
        # out-of-range error instead of a silent wait.
        self.consumer.assign([TopicPartition(topic, p, self.known[p]) for p in parts])
        pending, deadline = set(parts), time.monotonic() + timeout_s
        fresh: dict[int, int] = {}
        while pending and time.monotonic() < deadline:
            m = self.consumer.poll(0.02)
            if m is None:
                continue
            p = m.partition()
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    fresh[p] = max(fresh.get(p, 0), m.offset())
                    pending.discard(p)
                elif p in pending and m.error().code() == KafkaError.OFFSET_OUT_OF_RANGE:
                    fresh[p] = self.consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=10, cached=False)[1]
                    pending.discard(p)
                continue
            hw = self.consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
            fresh[p] = max(fresh.get(p, 0), hw, m.offset() + 1)
            pending.discard(p)
        for p in pending:
            # answered with no record and no EOF: the position is in a gap at the log's tail (a produce
            # cut off by a crash, ingest/kafka_read.py); the answer's log end is the end
            hw = self.consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
            if hw > self.known.get(p, -1):
                fresh[p] = hw
        idle = all(fresh.get(p, -1) <= self.known.get(p, -1) for p in parts)
        self.known.update(fresh)  # a partition that did not answer keeps its last known end
        if idle:
            # no fetch left waiting at the end of an idle log: Tansu answers a connection's requests in
            # turn, so the next listing's ListOffsets waited behind it for the fetch wait (~90 ms a
            # partition: an idle trigger took 615 ms, 107 ms without it). While records come, the
            # fetch is answered at once and stays (a trickle's latency was worse without it)
            self.consumer.unassign()
        self._probed_at = time.monotonic()
        return {p: self.known[p] for p in parts}

    def close(self) -> None:
        self.consumer.close()


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._probe: LogEndProbe | None = None
        self._available_now: Offsets | None = None

    @property
    def probe(self) -> LogEndProbe:
        if self._probe is None:  # lazily: the reader is pickled to Python workers for planning
            self._probe = LogEndProbe(self.opts)
        return self._probe

    def __getstate__(self) -> dict:
        return {"opts": self.opts, "_probe": None, "_available_now": self._available_now}

    # --- offsets
    def initialOffset(self) -> Offsets:
        s = self.opts.starting
        if isinstance(s, dict):
            return dict(s)
        parts = self.probe.discover(force=True)
        if s == "earliest":
            return {str(p): o for p, o in self.probe.low_watermarks(parts).items()}
        return {str(p): o for p, o in self.probe.ends(force=True).items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        m = self.opts.max_offsets_per_trigger
        return ReadMaxRows(m) if m else ReadAllAvailable()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        """The offsets the next batch reads to; `start` itself (no batch) while the reads are held
        (ingest.admission)."""
        if held(self.opts.hold_file):
            return dict(start)          # no new records planned: no batch runs
        ends = self._ends(start, self._listed(start, limit))
        if isinstance(limit, ReadMaxRows):
            begin = {p: start.get(p, 0) for p in ends}  # new partitions are read from their start
            take = fair_share({p: ends[p] - begin[p] for p in ends}, limit.max_rows)
            ends = {p: begin[p] + take[p] for p in ends}
        return ends

    def _ends(self, start: Offsets, ends: Offsets | None) -> Offsets:
        """The log ends to plan to (probed when `ends` is None; a given dict is adjusted in place),
        never below `start`."""
        ends = ends or {str(p): e for p, e in self.probe.ends().items()}
        if self._available_now is not None:
            ends = {p: min(e, self._available_now.get(p, e)) for p, e in ends.items()}
        for p, s in start.items():
            if p in ends and ends[p] < s:
                self._data_loss(f"partition {p}: log end {ends[p]} is below the committed offset {s}")
                ends[p] = s  # failOnDataLoss=false: never go backwards; the reader will skip
            ends.setdefault(p, s)
        return ends

    def _listed(self, start: Offsets, limit: ReadLimit) -> Offsets | None:
        """The listed log ends (ListOffsets, milliseconds) when they already hold more than a batch
        may take, else None (the exact probe then decides): under a backlog the exact probe (fetches
        at every partition's end) took 0.5-1.7 s per trigger while a producer flooded the broker.
        Below that the listing is not used: on Tansu it lags the log end, and under a steady stream
        it moves in steps of about a second (measured 2026-11-28 at 54,000 reports/s: the listing
        behind the exact end by 24,500 records at the median, 51,000 at most; the exact probe took
        30 ms at the median, 72 ms at most), so planning from it held every report back ~0.5 s."""
        if self._available_now is not None or not isinstance(limit, ReadMaxRows):
            return None
        listed = {str(p): e for p, e in self.probe.listed_ends().items()}
        if sum(max(0, e - start.get(p, 0)) for p, e in listed.items()) >= limit.max_rows:
            return {p: max(e, start.get(p, 0)) for p, e in listed.items()}
        return None

    def reportLatestOffset(self) -> Offsets | None:
        return {str(p): e for p, e in self.probe.known.items()} or None

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {str(p): e for p, e in self.probe.ends(force=True).items()}

    def _data_loss(self, msg: str) -> None:
        if self.opts.fail_on_data_loss:
            raise DataLossError(msg + " (set failOnDataLoss=false to skip lost offsets)")
        log.warning("data loss, skipping: %s", msg)

    # --- planning and reading
    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaRange]:
        o = self.opts
        ranges = [KafkaRange(o.bootstrap, o.topic, int(p), start.get(p, 0), e,
                             o.fail_on_data_loss, o.client, new_partition=p not in start)
                  for p, e in sorted(end.items(), key=lambda kv: int(kv[0]))]
        return split_ranges(ranges, o.min_partitions)

    def read(self, partition: KafkaRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_partition(partition)

    def commit(self, end: Offsets) -> None:
        pass  # offsets live in Spark's checkpoint; nothing to commit to Kafka

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "herdkafka"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(SourceOptions.parse(dict(self.options)))


def register(spark) -> None:  # noqa: ANN001 - SparkSession
    """Make `spark.readStream.format("herdkafka")` available in this SparkSession."""
    spark.dataSource.register(KafkaDataSource)
