"""Write simulated reports straight to Kafka (``gps.reports``), as gateways do, with confluent-kafka.

confluent-kafka (librdkafka) produced 95-210k msg/s against the embedded broker here, kafka-python
~15k; the values are serialized before the clock starts, so the timed per-row work is one produce() call."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
from confluent_kafka import KafkaException, Producer

from fencing.model import compact_json
from ingest.producer import PARTITIONER
from loadgen.progress import bar as progress_bar
from loadgen.records import Pacer, WriteStats, report_dicts

TOPIC = "gps.reports"
CHUNK = 2_000   # rows between poll/pacing/progress updates: small enough for smooth rates


def producer_config(bootstrap: str, **overrides) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        # the partitioner all of herdfence's producers share (ingest/producer.py): a device lands on
        # the same partition whether its reports come from the API or from here, so its order is kept
        **PARTITIONER,
        # idempotence: librdkafka's internal retries never write a report twice (a duplicate report
        # with the same ts would count twice towards a debounce streak)
        "enable.idempotence": True,
        "linger.ms": 20,
        # as production producers are usually set up: the broker stores and serves a third of the
        # bytes (measured with 1M reports: Tansu 0.96 → 0.31 core-s, the job's reads ~15% cheaper,
        # the producer the same) on the machine the benchmark shares with the job
        "compression.type": "lz4",
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        **overrides,
    }


def write_reports(bootstrap: str, df: pd.DataFrame, rate: float | None = None, topic: str = TOPIC,
                  progress: bool = True, flush_timeout_s: float = 120.0, start_at: float | None = None,
                  **config) -> WriteStats:
    """Produce every row of ``df`` (in row order) keyed by device id; block until all are delivered.

    ``rate`` = rows/s target (None: as fast as possible), paced in slices of 1/20 s. ``start_at``: the
    wall time to send the first row at (after the messages are built). ``config`` overrides producer settings
    (dots as underscores are not translated: pass e.g. ``**{"linger.ms": 5}``)."""
    stats = WriteStats(rows=len(df), sent_at_ms=np.zeros(len(df), dtype=np.int64))

    undelivered = 0

    def failed(err, _msg) -> None:       # called for failed deliveries only (see the config below)
        nonlocal undelivered
        undelivered += 1
        stats.note_error(str(err))

    # no Python callback per delivered report: a million callbacks cost the load generator more CPU
    # than producing itself, and it shares the machine with the job it measures
    producer = Producer(producer_config(bootstrap, **{"delivery.report.only.error": True, **config}))
    produced = 0
    # the messages are built before the clock starts: gateways serialize on their own hardware, and
    # the generator shares this machine with the job it measures
    values = [compact_json.dumps(rec) for rec in report_dicts(df)]   # kept: compact (4 KB each otherwise)
    # one key object per device, not per report (a million devices: ~50 MB less per report each)
    codes, uniques = pd.factorize(df["device_id"].astype(str))
    unique_keys = [d.encode() for d in uniques.tolist()]
    keys = [unique_keys[c] for c in codes.tolist()]
    del codes, uniques, unique_keys
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    pacer = Pacer(rate)             # after the build: its clock starts now, no burst of "late" rows
    chunk = CHUNK if rate is None else max(1, min(CHUNK, int(rate / 20)))
    produce, poll = producer.produce, producer.poll
    t0 = time.perf_counter()
    with progress_bar(total=len(df), unit="rep", disable=not progress, desc=f"kafka {topic}") as bar:
        for i, (value, key) in enumerate(zip(values, keys)):
            if i % chunk == 0:
                if i:
                    bar.update(chunk)
                poll(0)
                pacer.admit(min(chunk, len(df) - i))
                stats.sent_at_ms[i:i + chunk] = time.time_ns() // 1_000_000
            while True:
                try:
                    produce(topic, value, key, on_delivery=failed)
                    produced += 1
                    break
                except BufferError:           # local queue full: let librdkafka drain, then retry
                    poll(0.05)
                except KafkaException as exc:
                    stats.failed += 1
                    stats.note_error(str(exc))
                    break
        bar.update(len(df) - bar.n)
        remaining = producer.flush(flush_timeout_s)
    stats.seconds = time.perf_counter() - t0
    stats.sent = produced - undelivered - remaining
    stats.failed += undelivered
    if remaining:
        stats.failed += remaining
        stats.note_error(f"{remaining} reports still undelivered after {flush_timeout_s}s")
    return stats
