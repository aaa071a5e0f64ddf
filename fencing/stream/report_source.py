"""`herdreports`: the job's source. herdkafka's offsets, planning and reading, with stage 1 of the
micro-batch (fencing.stream.prepare: parse, validate, farm, H3 cell, route) done inside the reader.

Each report then crosses from Python to the JVM once, parsed and routed, instead of going Python
(read) → JVM → Python (prepare) → JVM: at 250k reports a batch that round trip cost about a second.
The reader loads the routing table from Redis when it runs. The elastic controller publishes a new
table only on the driver between two micro-batches, so the readers and the batch's process stage see
the same version. The route values (salts) come from `routing.partition_salts`, Spark's own hash
partitioner in Python, so no Spark job is needed on the executors.

Options: herdkafka's, plus `redis` = a cluster node "host:port" and `singleTaskMaxRecords` (a batch of at
most that many records is read by one task; fencing.stream.batch_shape).

The reading stage (fencing.stream.prepare: geometry, pandas, H3) and the Redis client are imported where
they run, not at the top: the driver's source runner, a fresh Python process started with the query
(and again when a standby takes over, on its critical path), needs only the offsets' side.
"""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from ingest.kafka_source import KafkaDataSource, KafkaRange, KafkaStreamReader, SourceOptions
from ingest.kafka_types import KafkaRanges


class RoutedReportsReader(KafkaStreamReader):
    def __init__(self, opts: SourceOptions, redis_node: tuple[str, int], single_task_records: int = 0) -> None:
        super().__init__(opts)
        self.redis_node = redis_node
        self.single_task_records = single_task_records

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "redis_node": self.redis_node,
                "single_task_records": self.single_task_records}

    def partitions(self, start: dict, end: dict) -> list:
        """A task per Kafka partition, or one task for all of them when the batch is small: the one
        place that decides (fencing.stream.batch_shape; the driver asks the planned batch)."""
        from fencing.stream.batch_shape import is_single_task
        ranges = super().partitions(start, end)
        if len(ranges) > 1 and is_single_task(start, end, self.single_task_records):
            return [KafkaRanges(tuple(ranges))]
        return ranges

    def read(self, partition: KafkaRange | KafkaRanges) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        from fencing.stream import routing
        from fencing.model.redis_conn import cluster
        from fencing.stream import worker_gc
        from fencing.stream.prepare import PrepareContext, prepare_partition
        from ingest.kafka_read import read_partition
        worker_gc.task_started()
        host, port = self.redis_node
        table = routing.load(cluster(host, port))
        context = PrepareContext(host, port, table, list(routing.partition_salts(table.partitions)))
        gaps: list = []          # offsets no record holds, skipped by the reader (ingest.kafka_read)
        return prepare_partition(context, read_partition(partition, gaps), gaps)


class RoutedReportsSource(KafkaDataSource):
    @classmethod
    def name(cls) -> str:
        return "herdreports"

    def schema(self) -> str:
        from fencing.stream.rows import SHUFFLED_DDL
        return SHUFFLED_DDL

    def streamReader(self, schema) -> RoutedReportsReader:  # noqa: ANN001 - StructType
        options = dict(self.options)
        node = options.get("redis") or ""
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError("herdreports needs the option redis=host:port (a Redis Cluster node)")
        single = options.get("singleTaskMaxRecords", options.get("singletaskmaxrecords")) or "0"
        return RoutedReportsReader(SourceOptions.parse(options), (host, int(port)), int(single))


def register(spark) -> None:  # noqa: ANN001 - SparkSession
    """Make `spark.readStream.format("herdreports")` available in this SparkSession."""
    spark.dataSource.register(RoutedReportsSource)
