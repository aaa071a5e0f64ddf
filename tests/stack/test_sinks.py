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
