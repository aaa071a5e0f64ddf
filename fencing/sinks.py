"""Driver-side sinks of a micro-batch, idempotent by batch id and event id:
events → Redis (per farm: hash + time index + live stream, each event written once) and Kafka
`fence.events`; dead letters → `gps.reports.dlq`; pings → `job:ping:<id>`."""
from __future__ import annotations

import orjson

from fencing.timeutil import iso
from fencing import keys

RETENTION_MS = 8 * 24 * 3600 * 1000      # events are kept at least 7 days
STREAM_MAXLEN = 100_000

# One farm's event: written only if its id is new, so a replayed batch adds nothing twice.
_ADD_EVENT = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[2])
  return 1
end
return 0
"""


def public_event(event: dict) -> dict:
    return {"event_id": event["event_id"], "type": event["type"], "device_id": event["device_id"],
            "fence_id": event["fence_id"], "ts": iso(event["ts"]), "lat": event["lat"], "lon": event["lon"]}


class Sinks:
    def __init__(self, redis, producer):
        self.redis, self.producer = redis, producer
        self.add_event = redis.register_script(_ADD_EVENT)

    def write(self, batch_id: int, events: list[dict], dead_letters: list[str], pings: list[str]) -> int:
        """Returns how many events were new to Redis."""
        events = sorted(events, key=lambda e: (e["ts"], e["event_id"]))
        new = self._add_to_redis(events)
        marker = keys.SINK_DONE.format(batch_id)
        if not self.redis.get(marker):
            # Kafka has no upsert: the marker keeps a replayed batch from producing again; consumers can
            # also drop duplicates by the deterministic event_id.
            self.producer.produce_records("fence.events",
                                          [(e["fence_id"].encode(), orjson.dumps(public_event(e))) for e in events])
            self.producer.produce_records("gps.reports.dlq", [(None, d.encode()) for d in dead_letters])
            self.redis.set(marker, "1", ex=7 * 24 * 3600)
        for ping in pings:
            self.redis.set(f"job:ping:{ping}", batch_id, ex=3600)
        return len(new)

    def _add_to_redis(self, events: list[dict]) -> list[dict]:
        """Each event into its farm's log unless its id is there already; returns the new ones."""
        new = []
        for event in events:
            farm_id, body = event["farm_id"], public_event(event)
            if self.add_event(keys=[keys.event_data(farm_id), keys.events(farm_id), keys.event_stream(farm_id)],
                              args=[event["event_id"], orjson.dumps(body), event["ts"], STREAM_MAXLEN]):
                new.append(event)
        return new

    def write_once(self, events: list[dict]) -> int:
        """Events outside any batch (the silent scanner): Kafka gets only those new to Redis."""
        new = self._add_to_redis(events)
        self.producer.produce_records("fence.events", [((e["fence_id"] or e["device_id"]).encode(),
                                                        orjson.dumps(public_event(e))) for e in new])
        return len(new)
