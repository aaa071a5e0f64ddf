"""The types the Kafka source's planner (kafka_source) and its reader (kafka_read) share: the
record schema, one input partition (an offset range) and the data-loss error."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (BinaryType, IntegerType, LongType, StringType, StructField,
                               StructType, TimestampType)

SCHEMA = StructType([
    StructField("key", BinaryType()), StructField("value", BinaryType()),
    StructField("topic", StringType()), StructField("partition", IntegerType()),
    StructField("offset", LongType()), StructField("timestamp", TimestampType()),
])
# Derived with Spark's own converter, exactly as plan_data_source_read.py checks it
# (timestamp[us, tz=UTC], nullability included): a hand-written schema drifts.
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")
BATCH_ROWS = 65536  # rows per yielded RecordBatch: bounded memory, few Arrow round trips


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (retention, truncation, topic re-created)."""


@dataclass(frozen=True)
class LogGap:
    """Offsets [start, end) of a partition, inside a planned range, that no record holds: a reader
    skipped them. On the embedded broker such a gap is a produce cut off by a crash, never
    acknowledged: Tansu raises a partition's high watermark before it writes the record object, and
    answers the producer only after both (docs/operations.md, "Gaps in the broker's log")."""
    topic: str
    partition: int
    start: int
    end: int

    @property
    def offsets(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict:
        return {"topic": self.topic, "partition": self.partition, "start": self.start, "end": self.end}


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """One input partition: offsets [start, end) of one Kafka partition. Picklable, self-contained
    (executors know nothing else)."""
    bootstrap: str
    topic: str
    partition: int
    start: int
    end: int
    fail_on_data_loss: bool
    client: str
    new_partition: bool = False  # discovered at runtime: out-of-range here is not data loss


# fetch.wait.max.ms of the readers and the log-end probe. Tansu answers a fetch with nothing when its
# storage takes longer than this wait, and on its disk engine a fetch lists the partition's objects
# first: at 5-10 ms a restarted reader, and the probe, got no answer at all. A reader reads below the
# log end, so its fetches find data at once and this wait is paid only by the probe at the log end.
FETCH_WAIT_MS = 100


@dataclass(frozen=True)
class KafkaRanges(InputPartition):
    """Several ranges read by one task, one after the other (a micro-batch too small to be worth a
    task per Kafka partition: fencing.stream.batch_shape)."""
    ranges: tuple[KafkaRange, ...]
