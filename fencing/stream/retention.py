"""Event retention: each farm's event log in Redis (the event hash, its time index and its fence and
device indexes, written by fencing.stream.sinks.EventLog) keeps the events of the last
`HERDFENCE_EVENT_RETENTION_DAYS` days, by event time; older ones are dropped on a timer in the job
driver. Without it the log of a farm grows for as long as its animals move. The live stream is capped
on its own (fencing.model.live_stream.MAXLEN); the Kafka topic `fence.events` and the report history on
disk keep their own retention.

A replayed batch re-adds none of the retained events (their ids are still there); an event already
older than the retention when it was made (a collar's backlog from months ago) is kept until the next
trim."""
from __future__ import annotations

import time

import orjson

from fencing.model import keys
from fencing.model.event_index import KeyTable, index_keys
from fencing.model.node_pipe import NodePipeline
from fencing.stream.periodic import Periodic
from fencing.config import TUNING

RETENTION_DAYS = TUNING.event_retention_days
TRIM_EVERY_S = TUNING.event_trim_seconds
FARMS_PER_ROUND = 5_000      # farms per pipelined round (one round trip per master each)
EVENTS_PER_CALL = 5_000      # ids one script call drops (Lua's unpack takes ~8,000 at most)

# One farm's events older than the cutoff, read first (ids and JSON: which fence and device indexes
# hold them), then dropped from the hash, the time index and those indexes in one script (every key
# carries the farm's hash tag, so one slot; every key is declared). An id the log no longer holds by
# then is left alone, so a concurrent trim or a racing backfill leaves nothing half-dropped.
_OLD = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids == 0 then
  return {}
end
local raws = redis.call('HMGET', KEYS[2], unpack(ids))
local out = {}
for i = 1, #ids do
  out[2 * i - 1] = ids[i]
  out[2 * i] = raws[i]
end
return out
"""
# KEYS: the time index, the hash, the index keys; ARGV: cutoff, (id, fence index position, device index
# position)*. Returns how many it dropped.
_TRIM = """
local cutoff = tonumber(ARGV[1])
local gone, by = {}, {}
local function drop_from(pos, id)
  if pos > 0 then
    local t = by[pos]
    if not t then t = {}; by[pos] = t end
    t[#t + 1] = id
  end
end
for i = 2, #ARGV, 3 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) < cutoff then
    gone[#gone + 1] = ARGV[i]
    drop_from(tonumber(ARGV[i + 1]), ARGV[i])
    drop_from(tonumber(ARGV[i + 2]), ARGV[i])
  end
end
if #gone > 0 then
  redis.call('HDEL', KEYS[2], unpack(gone))
  redis.call('ZREM', KEYS[1], unpack(gone))
end
for pos, t in pairs(by) do
  redis.call('ZREM', KEYS[pos], unpack(t))
end
return #gone
"""


def _drop_args(farm_id: str, cutoff_ms: int, old: list) -> tuple[list[str], list]:
    """KEYS and ARGV of `_TRIM` for the (id, JSON) pairs `_OLD` read (JSON None: not in the hash)."""
    table = KeyTable([keys.events(farm_id), keys.event_data(farm_id)])
    args: list = [cutoff_ms]
    for i in range(0, len(old), 2):
        by_fence = by_device = None
        if old[i + 1] is not None:
            event = orjson.loads(old[i + 1])
            by_fence, by_device = index_keys(farm_id, event.get("fence_id"), event.get("device_id"))
        args += (old[i], table.at(by_fence), table.at(by_device))
    return table.keys, args


def trim_events(redis, cutoff_ms: int, per_call: int = EVENTS_PER_CALL) -> int:
    """Drop every farm's events with a time before `cutoff_ms` (from the log and its indexes); returns
    how many were dropped."""
    read, drop = redis.register_script(_OLD), redis.register_script(_TRIM)
    for text in (_OLD, _TRIM):
        redis.script_load(text)             # on every master: the pipelined EVALSHA needs it
    farms = sorted(redis.smembers(keys.FARMS))
    pipe = NodePipeline(redis)
    dropped = 0
    while farms:
        round_, farms = farms[:FARMS_PER_ROUND], farms[FARMS_PER_ROUND:]
        for farm_id in round_:
            pipe.script(read, [keys.events(farm_id), keys.event_data(farm_id)], [cutoff_ms, per_call])
        olds = pipe.execute()
        busy = [(farm_id, old) for farm_id, old in zip(round_, olds) if old]
        for farm_id, old in busy:
            pipe.script(drop, *_drop_args(farm_id, cutoff_ms, old))
        dropped += sum(pipe.execute()) if busy else 0
        farms += [farm_id for farm_id, old in busy if len(old) // 2 == per_call]   # more to drop
    return dropped


class EventRetention(Periodic):
    """The driver's timer; not started when the retention is 0 (keep every event)."""

    def __init__(self, redis, days: float = RETENTION_DAYS, every_s: float = TRIM_EVERY_S) -> None:
        super().__init__("event-retention", every_s)
        self.redis, self.keep_ms = redis, int(days * 86_400_000)

    def tick(self) -> None:
        trim_events(self.redis, int(time.time() * 1000) - self.keep_ms)
