"""Event retention: each farm's event log in Redis (the event hash and its time index, written by
fencing.stream.sinks.EventLog) keeps the events of the last `HERDFENCE_EVENT_RETENTION_DAYS` days, by event
time; older ones are dropped on a timer in the job driver. Without it the log of a farm grows for as
long as its animals move. The live stream is capped on its own (sinks.STREAM_MAXLEN); the Kafka topic
`fence.events` and the report history on disk keep their own retention.

A replayed batch re-adds none of the retained events (their ids are still there); an event already
older than the retention when it was made (a collar's backlog from months ago) is kept until the next
trim."""
from __future__ import annotations

import time

from fencing.model import keys
from fencing.model.node_pipe import NodePipeline
from fencing.stream.periodic import Periodic
from fencing.config import TUNING

RETENTION_DAYS = TUNING.retention_days
TRIM_EVERY_S = TUNING.trim_every_s
FARMS_PER_ROUND = 5_000      # farms per pipelined round (one round trip per master each)
EVENTS_PER_CALL = 5_000      # ids one script call drops (Lua's unpack takes ~8,000 at most)

# One farm's events older than the cutoff: out of the hash and the time index together (both keys
# carry the farm's hash tag, so one slot). Returns how many it dropped.
_TRIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids > 0 then
  redis.call('HDEL', KEYS[2], unpack(ids))
  redis.call('ZREM', KEYS[1], unpack(ids))
end
return #ids
"""


def trim_events(redis, cutoff_ms: int, per_call: int = EVENTS_PER_CALL) -> int:
    """Drop every farm's events with a time before `cutoff_ms`; returns how many were dropped."""
    script = redis.register_script(_TRIM)
    redis.script_load(_TRIM)                # on every master: the pipelined EVALSHA needs it
    farms = sorted(redis.smembers(keys.FARMS))
    pipe = NodePipeline(redis)
    dropped = 0
    while farms:
        round_, farms = farms[:FARMS_PER_ROUND], farms[FARMS_PER_ROUND:]
        for farm_id in round_:
            pipe.script(script, [keys.events(farm_id), keys.event_data(farm_id)], [cutoff_ms, per_call])
        counts = pipe.execute()
        dropped += sum(counts)
        farms += [farm_id for farm_id, n in zip(round_, counts) if n == per_call]   # more to drop
    return dropped


class EventRetention(Periodic):
    """The driver's timer; not started when the retention is 0 (keep every event)."""

    def __init__(self, redis, days: float = RETENTION_DAYS, every_s: float = TRIM_EVERY_S) -> None:
        super().__init__("event-retention", every_s)
        self.redis, self.keep_ms = redis, int(days * 86_400_000)

    def tick(self) -> None:
        trim_events(self.redis, int(time.time() * 1000) - self.keep_ms)
