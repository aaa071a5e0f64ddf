"""`herdfence bench ingest`: fill a topic, read it back through the herdkafka reader.

What is measured: `KafkaStreamReader.partitions()` + `read_range()` for every range, i.e. the
executor-side hot path of the Spark source (Arrow batches in the declared schema), run in this
process one range after another. It is the reader directly, not a streaming query: a query adds
Spark's fixed per-batch cost (DESIGN.md: 0.1-0.35 s/micro-batch) which is not the source's.
"""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import orjson

from ingest.kafka_read import read_range
from ingest.kafka_source import KafkaStreamReader, SourceOptions
from ingest.producer import KafkaWriter


def _fill(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(10)
    now = int(time.time() * 1000)
    KafkaWriter(bootstrap, timeout_s=60).produce_records(topic, (
        (f"cow-{i % 10000}", orjson.dumps({"device_id": f"cow-{i % 10000}", "ts": now, "lat": 59.0,
                                           "lon": 17.0, "battery": 80})) for i in range(records)))


def measure(bootstrap: str, topic: str, client: str) -> dict:
    r = KafkaStreamReader(SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                               "startingOffsets": "earliest", "client": client}))
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    t0, n = time.perf_counter(), 0
    for part in r.partitions(start, end):
        n += sum(b.num_rows for b in read_range(part))
    dt = time.perf_counter() - t0
    r.stop()
    return {"records": n, "records_per_s": round(n / dt), "client": client}


def run(records: int, json_path: str | Path | None, bootstrap: str | None = None,
        partitions: int = 4) -> dict:
    from fencing.config import load_settings
    bootstrap = bootstrap or load_settings().kafka_bootstrap
    topic = f"bench.ingest.{uuid.uuid4().hex[:8]}"
    _fill(bootstrap, topic, records, partitions)
    runs = [measure(bootstrap, topic, c) for c in ("confluent", "kafka-python")]
    best = max(runs, key=lambda x: x["records_per_s"])
    out = {**best, "all": runs}
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    import sys
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000,
                         sys.argv[2] if len(sys.argv) > 2 else None,
                         sys.argv[3] if len(sys.argv) > 3 else None)))
