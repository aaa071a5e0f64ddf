"""Producing to Kafka: reports from the API, DLQ records and fence events from the job's driver.

confluent-kafka (librdkafka) because it is ~10x faster than kafka-python here and its idempotent
producer (acks=all, no duplicates on retry) works on Tansu. Every call is bounded in time: a dead
broker must turn into BrokerUnavailable (→ HTTP 503 + Retry-After), never a hung request.
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Iterable, Sequence

import orjson

DEFAULT_TIMEOUT_S = 5.0
# KafkaWriter's callers flush after each call, and a flush sends at once whatever linger says (librdkafka
# ≥ 1.5): linger only lets one call's records fill fewer, larger batches while they are queued. 320k
# events into the embedded broker: 1.64–2.01 s and 1.9 core-s at 2 ms → 1.24–1.30 s and 1.3 core-s at 50.
FLUSHED_LINGER_MS = 50
# Every producer of the project (API, job, load generator, CLI) keys records by device or fence id and
# partitions them as the Java clients and kafka-python do: murmur2 of the key, (h & 0x7fffffff) % n.
# librdkafka's own default (consistent_random, CRC32) would put a device's reports from the API on
# another partition than the same device's reports from a gateway, and their order would be lost.
PARTITIONER = {"partitioner": "murmur2_random"}
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
            "bootstrap.servers": bootstrap, **PARTITIONER, "enable.idempotence": True, "acks": "all",
            "linger.ms": FLUSHED_LINGER_MS, "queue.buffering.max.messages": 1_000_000,
            # a delivery callback for failed records only: one Python call per record cost the
            # driver ~1 µs each at tens of thousands of events a batch
            "delivery.report.only.error": True,
            # bound every wait by the timeout: delivery fails instead of retrying forever
            "message.timeout.ms": ms, "socket.connection.setup.timeout.ms": max(ms, 1000),
            "logger": log, **extra,  # librdkafka's reconnect chatter → logging, not stderr
        })
        self._lock = threading.Lock()  # flush() is per producer: serialize batches of callers

    def produce_records(self, topic: str, records: Iterable[tuple[bytes | str | None, bytes | str]]) -> int:
        """Send (key, value) pairs and block until every one is acknowledged; raise
        BrokerUnavailable otherwise. Returns the number acknowledged."""
        errors: list[str] = []

        def on_delivery(err, _msg) -> None:  # noqa: ANN001
            if err is not None:
                errors.append(str(err))

        with self._lock:
            sent = self._enqueue(topic, records, on_delivery)
            left = self._producer.flush(self.timeout_s)
        if left or errors:
            raise BrokerUnavailable(f"{left} of {sent} records not acknowledged"
                                    + (f": {errors[0]}" if errors else " in time"))
        return sent

    def _enqueue(self, topic: str, records: Iterable[tuple[bytes | str | None, bytes | str]], on_delivery) -> int:
        """Queue every record in librdkafka (waiting while its local queue is full); the count queued."""
        sent = 0
        for key, value in records:
            while True:
                try:
                    self._producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    self._producer.poll(0.05)
            sent += 1
        return sent

    def close(self) -> None:
        self._producer.flush(self.timeout_s)


class _Acks:
    """One caller's records in flight: counted by delivery callbacks on the poller thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: int | None = None          # set once every record of the call is queued
        self.delivered = 0
        self.errors: list[str] = []
        self.done = threading.Event()

    def on_delivery(self, err, _msg) -> None:  # noqa: ANN001 - librdkafka's callback
        with self.lock:
            self.delivered += 1
            if err is not None:
                self.errors.append(str(err))
            if self.sent is not None and self.delivered >= self.sent:
                self.done.set()

    def all_queued(self, sent: int) -> None:
        with self.lock:
            self.sent = sent
            if self.delivered >= sent:
                self.done.set()


def _serve_callbacks(ref: "weakref.ref[ReportProducer]") -> None:
    while True:
        me = ref()
        if me is None or me._closed.is_set():
            return
        producer = me._producer
        del me
        producer.poll(0.05)


class ReportProducer(KafkaWriter):
    """The API's producer: key = device id, value = the report JSON.

    Many requests produce at once (collars post one or two fixes each, from the API's thread pool):
    each waits for the acknowledgement of its own records only, so librdkafka packs concurrent
    requests into shared record batches (group commit). A global flush under a lock, as KafkaWriter
    does for the job's single caller, made every request one broker round trip after the other and
    one record batch (one object in the disk-backed broker) per request."""

    def __init__(self, bootstrap: str, topic: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        from fencing.config import TOPIC_REPORTS
        # no flush here (each request waits for its own acknowledgements): a short linger, which
        # still packs concurrent requests into shared record batches
        super().__init__(bootstrap, timeout_s, **{"delivery.report.only.error": False, "linger.ms": 2})
        self.topic = topic or TOPIC_REPORTS
        self._closed = threading.Event()
        # delivery callbacks run on whichever thread polls: one daemon thread serves them all. It holds
        # the producer weakly: the API drops a producer gone fatal, and its thread then ends with it.
        threading.Thread(target=_serve_callbacks, args=(weakref.ref(self),), name="report-producer-poll",
                         daemon=True).start()

    def produce_records(self, topic: str, records: Iterable[tuple[bytes | str | None, bytes | str]]) -> int:
        acks = _Acks()
        sent = self._enqueue(topic, records, acks.on_delivery)
        acks.all_queued(sent)
        if not acks.done.wait(self.timeout_s + 1.0):
            raise BrokerUnavailable(f"{sent - acks.delivered} of {sent} records not acknowledged in time")
        if acks.errors:
            raise BrokerUnavailable(f"{len(acks.errors)} of {sent} records not acknowledged: {acks.errors[0]}")
        return sent

    def send_many(self, reports: Sequence[dict]) -> None:
        self.produce_records(self.topic, ((r["device_id"], orjson.dumps(r)) for r in reports))

    def close(self) -> None:
        super().close()
        self._closed.set()


class DeadLetterWriter(KafkaWriter):
    """The job driver's writer for gps.reports.dlq (values from DeadLetter.to_bytes())."""

    def __init__(self, bootstrap: str, topic: str | None = None, timeout_s: float = 30.0) -> None:
        from fencing.config import TOPIC_DLQ
        super().__init__(bootstrap, timeout_s)
        self.topic = topic or TOPIC_DLQ

    def send(self, letters: Sequence) -> int:  # Sequence[DeadLetter]
        return self.produce_records(self.topic, ((f"{d.topic}:{d.partition}:{d.offset}", d.to_bytes())
                                                 for d in letters))
