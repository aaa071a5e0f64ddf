"""Driver-side sinks of a micro-batch, idempotent by batch id and event id:
events → Redis (per farm: hash + time index + live stream, each event written once) and Kafka
`fence.events`; dead letters → `gps.reports.dlq`; pings → `job:ping:<id>`."""
from __future__ import annotations

import orjson
from redis.exceptions import RedisError

from fencing.timeutil import iso
from fencing import keys

STREAM_MAXLEN = 100_000

# A farm's events, each written only if its id is new, so a replayed batch adds nothing twice. One call
# per farm and batch (all keys share the farm's slot); returns a 1/0 flag per event.
_ADD_EVENTS = """
local flags = {}
for i = 2, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('ZADD', KEYS[2], ARGV[i + 2], ARGV[i])
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[1], '*', 'event', ARGV[i + 1])
    flags[#flags + 1] = 1
  else
    flags[#flags + 1] = 0
  end
end
return flags
"""


def public_event(event: dict) -> dict:
    return {"event_id": event["event_id"], "type": event["type"], "device_id": event["device_id"],
            "fence_id": event["fence_id"], "ts": iso(event["ts"]), "lat": event["lat"], "lon": event["lon"]}


class Sinks:
    def __init__(self, redis, producer):
        self.redis, self.producer = redis, producer
        self.add_events = redis.register_script(_ADD_EVENTS)
        redis.script_load(_ADD_EVENTS)              # on every master: the pipelined EVALSHA needs it

    def write(self, batch_id: str, events: list[dict], dead_letters: list[str], pings: list[str]) -> int:
        """`batch_id` is the run-qualified batch version. Returns how many events were new to Redis."""
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
        """Each event into its farm's log unless its id is there already; returns the new ones.
        One script call per farm (bounded chunks), pipelined per master: a batch touching thousands
        of farms costs one round trip per node, not one per farm."""
        by_farm: dict[str, list[dict]] = {}
        for event in events:
            by_farm.setdefault(event["farm_id"], []).append(event)
        calls: list[tuple[list[dict], list[str], list]] = []
        for farm_id, farm_events in by_farm.items():
            for start in range(0, len(farm_events), 2000):
                chunk = farm_events[start:start + 2000]
                args: list = [STREAM_MAXLEN]
                for event in chunk:
                    args += [event["event_id"], orjson.dumps(public_event(event)), event["ts"]]
                calls.append((chunk, [keys.event_data(farm_id), keys.events(farm_id), keys.event_stream(farm_id)], args))
        if not calls:
            return []
        answers = self._run_scripts(calls)
        new = [e for (chunk, _, _), flags in zip(calls, answers) for e, flag in zip(chunk, flags) if flag]
        new.sort(key=lambda e: (e["ts"], e["event_id"]))
        return new

    def _run_scripts(self, calls) -> list[list[int]]:
        """The script calls pipelined per master (redis-py's cluster pipeline refuses EVALSHA). A call
        that fails there — its slot moved, its master failed over, the node lacks the script — is
        made again on its own through the cluster client, which follows redirects and reloads the
        script; the answers of the calls that succeeded are kept, so an event reported new once is
        not reported old by a retry (HSETNX keeps it single in Redis either way)."""
        by_node: dict[str, list[int]] = {}
        nodes = {}
        for i, (_, script_keys, _) in enumerate(calls):
            node = self.redis.nodes_manager.get_node_from_slot(self.redis.keyslot(script_keys[0]))
            nodes[node.name] = node
            by_node.setdefault(node.name, []).append(i)
        answers: list = [None] * len(calls)
        for name, indices in by_node.items():
            try:
                pipe = nodes[name].redis_connection.pipeline(transaction=False)
                for i in indices:
                    _, script_keys, args = calls[i]
                    pipe.evalsha(self.add_events.sha, len(script_keys), *script_keys, *args)
                for i, flags in zip(indices, pipe.execute(raise_on_error=False)):
                    answers[i] = None if isinstance(flags, Exception) else flags
            except RedisError:
                pass            # the node is unreachable: every call of it is retried below
        for i, flags in enumerate(answers):
            if flags is None:
                _, script_keys, args = calls[i]
                answers[i] = self.add_events(keys=script_keys, args=args)
        return answers

    def write_once(self, events: list[dict]) -> int:
        """Events outside any batch (the silent scanner): Kafka gets only those new to Redis."""
        new = self._add_to_redis(events)
        self.producer.produce_records("fence.events", [((e["fence_id"] or e["device_id"]).encode(),
                                                        orjson.dumps(public_event(e))) for e in new])
        return len(new)
