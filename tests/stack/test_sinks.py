"""The job's event sink against the test stack's real Redis Cluster and broker: pipelined per master,
and when a master cannot run the pipelined script (here: its script cache flushed, as after a
failover to a replica that never loaded it) its calls are retried through the cluster client — every
event lands once, and each is reported new exactly once, whichever master failed."""
from __future__ import annotations

import secrets

import orjson
import pytest

from fencing.model import keys, live_stream
from fencing.stream.sinks import Sinks
from tests.redis_kit import drop_scope, take_over


def _events(farms: list[str], per_farm: int) -> list[dict]:
    return [{"event_id": f"ev-{farm}-{i}", "type": "enter", "farm_id": farm, "device_id": f"cow-{i}",
             "fence_id": "f-1", "ts": 1_700_000_000_000 + i, "lat": 47.0, "lon": 8.5}
            for farm in farms for i in range(per_farm)]


@pytest.mark.parametrize("failing", [0, 1, 2, "all"])
def test_events_land_once_when_a_master_lost_its_scripts(stack, failing):
    from ingest.producer import KafkaWriter
    redis = stack.redis
    sinks = Sinks(redis, KafkaWriter(stack.settings.kafka_bootstrap))
    farms = [f"sinkfarm-{secrets.token_hex(4)}" for _ in range(40)]     # spread over every master
    first = _events(farms[:20], 3)
    assert sinks.write_found(first) == len(first)

    primaries = sorted(redis.get_primaries(), key=lambda n: n.port)
    for node in primaries if failing == "all" else [primaries[failing]]:
        node.redis_connection.script_flush()        # its pipelined EVALSHA now fails with NOSCRIPT
    second = _events(farms, 3)                      # half already written, half new
    assert sinks.write_found(second) == len(second) - len(first)     # only the new ones count as new
    for farm in farms:
        assert redis.hlen(keys.event_data(farm)) == 3 and redis.zcard(keys.events(farm)) == 3
    assert sinks.write_found(second) == 0            # a replay adds nothing


def _no_events():
    import pyarrow as pa
    return pa.table({"key": pa.array([], pa.string()), "payload": pa.array([], pa.binary()),
                     "ts": pa.array([], pa.int64()), "eid": pa.array([], pa.string())})


class _Recording:
    """The real producer (the test stack's broker), noting what it was asked to produce and whether
    each event was in its farm's log at that moment (the one order: the log, then Kafka)."""

    def __init__(self, bootstrap: str, redis):
        from ingest.producer import KafkaWriter
        self.writer, self.redis, self.records = KafkaWriter(bootstrap), redis, []
        self.logged_first: list[bool] = []

    def produce_records(self, topic, records):
        records = list(records)
        self.records += [(topic, key, value) for key, value in records]
        for _, value in records:
            event = orjson.loads(value)
            self.logged_first.append(bool(self.redis.hexists(keys.event_data(event["farm_id"]), event["event_id"])))
        return self.writer.produce_records(topic, records)


def _streamed_ids(redis, farm: str) -> list[list[str]]:
    """The event ids of each entry of the farm's live stream, oldest entry first."""
    return [[orjson.loads(e)["event_id"] for e in live_stream.entry_events(fields)]
            for _, fields in redis.xrange(keys.event_stream(farm), "-", "+")]


def _produced_ids(producer: _Recording) -> list[str]:
    return [orjson.loads(v)["event_id"] for _, _, v in producer.records]


def test_found_events_go_into_the_log_then_to_kafka_by_time(stack):
    redis = stack.redis
    producer = _Recording(stack.settings.kafka_bootstrap, redis)
    sinks = Sinks(redis, producer)
    farm = f"pubfarm-{secrets.token_hex(4)}"
    events = _events([farm], 4)[::-1]                      # newest first: Kafka gets them by time
    events[1]["fence_id"] = ""                             # a fence-less event is keyed by its device
    assert sinks.write_found(events + events[:1]) == 4     # the same event twice: once
    assert _produced_ids(producer) == [f"ev-{farm}-{i}" for i in range(4)]
    assert producer.logged_first == [True] * 4             # each one was in the log before Kafka got it
    assert {t for t, _, _ in producer.records} == {"fence.events"}
    assert [k for _, k, _ in producer.records] == [b"f-1", b"f-1", b"cow-2", b"f-1"]
    assert redis.hlen(keys.event_data(farm)) == 4
    assert _streamed_ids(redis, farm) == [[f"ev-{farm}-{i}" for i in range(4)]]    # one entry, by time


def test_events_found_again_are_logged_once_and_produced_again(stack):
    """The scanner forgets a device only after its sink returned: finding an event again means the
    sink may not have produced it (a crash after the log), so Kafka gets it again (consumers drop a
    repeat by event_id); the log and its live stream never hold it twice."""
    redis = stack.redis
    producer = _Recording(stack.settings.kafka_bootstrap, redis)
    sinks = Sinks(redis, producer)
    farm = f"againfarm-{secrets.token_hex(4)}"
    sinks.redis.hset(keys.event_data(farm), "ev-x", "{}")   # another event of the farm, logged before
    assert sinks.write_found(_events([farm], 2)) == 2
    producer.records.clear()
    assert sinks.write_found(_events([farm], 3)) == 1       # 2 logged already, 1 new
    assert _produced_ids(producer) == [f"ev-{farm}-{i}" for i in range(3)]
    assert redis.hlen(keys.event_data(farm)) == 4
    assert _streamed_ids(redis, farm) == [[f"ev-{farm}-0", f"ev-{farm}-1"], [f"ev-{farm}-2"]]


def test_a_large_write_fills_bounded_stream_entries(stack):
    """A stream reader's queue takes whole entries: a write of more events than an entry holds adds
    several, each full but the last, in time order."""
    redis = stack.redis
    sinks = Sinks(redis, _Recording(stack.settings.kafka_bootstrap, redis))
    farm = f"bigfarm-{secrets.token_hex(4)}"
    n = 2 * live_stream.ENTRY_EVENTS + 7
    assert sinks.write_found(_events([farm], n)) == n
    entries = _streamed_ids(redis, farm)
    assert [len(e) for e in entries] == [live_stream.ENTRY_EVENTS, live_stream.ENTRY_EVENTS, 7]
    assert [i for e in entries for i in e] == [f"ev-{farm}-{i}" for i in range(n)]


def test_a_job_with_an_older_epoch_publishes_nothing(stack):
    redis = stack.redis
    producer = _Recording(stack.settings.kafka_bootstrap, redis)
    farm = f"epochfarm-{secrets.token_hex(4)}"
    scope = f"sk{secrets.token_hex(4)}"
    try:
        old = take_over(redis, stack.settings.redis_node, 3, scope)
        new = take_over(redis, stack.settings.redis_node, 7, scope)
        assert Sinks(new, producer).write_found(_events([farm], 2)) == 2
        producer.records.clear()
        with pytest.raises(Exception, match="FENCED"):
            Sinks(old, producer).write_found(_events([farm], 3))      # a newer job (epoch 7) took over
        with pytest.raises(Exception, match="FENCED"):
            Sinks(old, producer).write("run:1", _no_events(), ["dead"], [])
        assert producer.records == [] and redis.hlen(keys.event_data(farm)) == 2
    finally:
        drop_scope(redis, scope)
