"""Producing to Kafka: reports from the API, DLQ records and fence events from the job's driver.

confluent-kafka (librdkafka) because it is ~10x faster than kafka-python here and its idempotent
producer (acks=all, no duplicates on retry) works on Tansu. Every call is bounded in time: a dead
broker must turn into BrokerUnavailable (→ HTTP 503 + Retry-After), never a hung request.
"""
from __future__ import annotations

import logging
import threading
from typing import Iterable, Sequence

import orjson

DEFAULT_TIMEOUT_S = 5.0
log = logging.getLogger("herdfence.kafka")


class BrokerUnavailable(RuntimeError):
    """Records could not be acknowledged in time (broker down or unreachable)."""


class KafkaWriter:
    """A thread-safe, idempotent producer shared by all callers of one process."""

    def __init__(self, bootstrap: str, timeout_s: float = DEFAULT_TIMEOUT_S, **extra: object) -> None:
        from confluent_kafka import Producer
        self.timeout_s = timeout_s
        ms = int(timeout_s * 1000)
        self._producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 2, "queue.buffering.max.messages": 1_000_000,
            # a delivery callback for failed records only: one Python call per record cost the
            # driver ~1 µs each at tens of thousands of events a batch
            "delivery.report.only.error": True,
            # bound every wait by the timeout: delivery fails instead of retrying forever
            "message.timeout.ms": ms, "socket.connection.setup.timeout.ms": max(ms, 1000),
            "logger": log, **extra,  # librdkafka's reconnect chatter → logging, not stderr
        })
        self._lock = threading.Lock()  # flush() is per producer: serialize batches of callers

    def produce_records(self, topic: str, records: Iterable[tuple[bytes | str | None, bytes]]) -> int:
        """Send (key, value) pairs and block until every one is acknowledged; raise
        BrokerUnavailable otherwise. Returns the number acknowledged."""
        errors: list[str] = []
        sent = 0

        def on_delivery(err, _msg) -> None:  # noqa: ANN001
            if err is not None:
                errors.append(str(err))

        with self._lock:
            for key, value in records:
                while True:
                    try:
                        self._producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                        break
                    except BufferError:  # local queue full: let deliveries drain
                        self._producer.poll(0.05)
                sent += 1
            left = self._producer.flush(self.timeout_s)
        if left or errors:
            raise BrokerUnavailable(f"{left} of {sent} records not acknowledged"
                                    + (f": {errors[0]}" if errors else " in time"))
        return sent

    def close(self) -> None:
        self._producer.flush(self.timeout_s)


class ReportProducer(KafkaWriter):
    """The API's producer: key = device id, value = the report JSON."""

    def __init__(self, bootstrap: str, topic: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        from fencing.config import TOPIC_REPORTS
        super().__init__(bootstrap, timeout_s)
        self.topic = topic or TOPIC_REPORTS

    def send_many(self, reports: Sequence[dict]) -> None:
        self.produce_records(self.topic, ((r["device_id"], orjson.dumps(r)) for r in reports))


class DeadLetterWriter(KafkaWriter):
    """The job driver's writer for gps.reports.dlq (values from DeadLetter.to_bytes())."""

    def __init__(self, bootstrap: str, topic: str | None = None, timeout_s: float = 30.0) -> None:
        from fencing.config import TOPIC_DLQ
        super().__init__(bootstrap, timeout_s)
        self.topic = topic or TOPIC_DLQ

    def send(self, letters: Sequence) -> int:  # Sequence[DeadLetter]
        return self.produce_records(self.topic, ((f"{d.topic}:{d.partition}:{d.offset}", d.to_bytes())
                                                 for d in letters))
