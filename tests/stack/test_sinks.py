"""The job's event sink against the test stack's real Redis Cluster and broker: pipelined per master,
and when a master cannot run the pipelined script (here: its script cache flushed, as after a
failover to a replica that never loaded it) its calls are retried through the cluster client — every
event lands once, and each is reported new exactly once, whichever master failed."""
from __future__ import annotations

import secrets

import pytest

from fencing.model import keys
from fencing.stream.sinks import Sinks


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
    assert sinks.write_once(first) == len(first)

    primaries = sorted(redis.get_primaries(), key=lambda n: n.port)
    for node in primaries if failing == "all" else [primaries[failing]]:
        node.redis_connection.script_flush()        # its pipelined EVALSHA now fails with NOSCRIPT
    second = _events(farms, 3)                      # half already written, half new
    assert sinks.write_once(second) == len(second) - len(first)     # only the new ones count as new
    for farm in farms:
        assert redis.hlen(keys.event_data(farm)) == 3 and redis.zcard(keys.events(farm)) == 3
    assert sinks.write_once(second) == 0            # a replay adds nothing


class _Recording:
    """The real producer (the test stack's broker), noting what it was asked to produce."""

    def __init__(self, bootstrap: str):
        from ingest.producer import KafkaWriter
        self.writer, self.records = KafkaWriter(bootstrap), []

    def produce_records(self, topic, records):
        records = list(records)
        self.records += [(topic, key, value) for key, value in records]
        return self.writer.produce_records(topic, records)


def test_publish_sends_each_new_event_to_kafka_once_by_time_then_logs_it(stack):
    import orjson
    from fencing.stream.sinks import event_log
    redis = stack.redis
    producer = _Recording(stack.settings.kafka_bootstrap)
    farm = f"pubfarm-{secrets.token_hex(4)}"
    events = _events([farm], 4)[::-1]                      # newest first: Kafka gets them by time
    events[1]["fence_id"] = ""                             # a fence-less event is keyed by its device
    log = event_log(redis)
    assert len(log.publish(events + events[:1], producer)) == 4      # the same event twice: once
    assert [orjson.loads(v)["event_id"] for _, _, v in producer.records] == [f"ev-{farm}-{i}" for i in range(4)]
    assert {t for t, _, _ in producer.records} == {"fence.events"}
    assert [k for _, k, _ in producer.records] == [b"f-1", b"f-1", b"cow-2", b"f-1"]
    assert redis.hlen(keys.event_data(farm)) == 4 and redis.xlen(keys.event_stream(farm)) == 4
    more = _events([farm], 6)                              # 4 logged already, 2 new
    producer.records.clear()
    assert [e["event_id"] for e, _ in log.publish(more, producer)] == [f"ev-{farm}-4", f"ev-{farm}-5"]
    assert [orjson.loads(v)["event_id"] for _, _, v in producer.records] == [f"ev-{farm}-4", f"ev-{farm}-5"]
    producer.records.clear()
    assert log.publish(more, producer) == [] and producer.records == []      # a replay sends nothing


def test_a_job_with_an_older_epoch_publishes_nothing(stack):
    from fencing.stream.sinks import event_log
    redis = stack.redis
    producer = _Recording(stack.settings.kafka_bootstrap)
    farm = f"epochfarm-{secrets.token_hex(4)}"
    log = event_log(redis)
    assert len(log.publish(_events([farm], 2), producer, epoch=7)) == 2
    producer.records.clear()
    with pytest.raises(Exception, match="FENCED"):
        log.publish(_events([farm], 3), producer, epoch=3)      # a newer job (epoch 7) wrote here
    assert producer.records == [] and redis.hlen(keys.event_data(farm)) == 2
