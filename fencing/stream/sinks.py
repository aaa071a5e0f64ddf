"""The sinks of a micro-batch, idempotent by batch id and event id: events → Redis (per farm: hash +
time index + fence and device indexes + live stream, each event written once; by the process tasks)
and Kafka `fence.events` (by the driver); dead letters → `gps.reports.dlq`; pings → `{job}:ping:<id>`."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from fencing.config import TOPIC_DLQ, TOPIC_EVENTS
from fencing.model.timeutil import iso_many
from fencing.model import compact_json, keys, live_stream, notify
from fencing.model.event_index import LUA_COLLECT, KeyTable, index_keys
from fencing.model.node_pipe import NodePipeline


# Lua: `ids` = the event ids in ARGV (every 5th from the 2nd); `known` = the farm's hash (KEYS[1]) at
# those ids, one HMGET (a call without ids returns an empty list at once).
_KNOWN_IDS = """
local ids = {}
for i = 2, #ARGV, 5 do
  ids[#ids + 1] = ARGV[i]
end
if #ids == 0 then
  return {}
end
local known = redis.call('HMGET', KEYS[1], unpack(ids))
"""


# A farm's events, each written only if its id is new, so a replayed batch adds nothing twice. One call
# per farm and batch (all keys share the farm's slot); returns a 1/0 flag per event. Which ids are new
# comes from one HMGET, and the new ones go into the hash and the time index with one HSET and one ZADD, and into
# the live stream as entries of up to ENTRY_EVENTS events (fencing.model.live_stream): a command per
# event each was ~2 µs more of Redis CPU per event (AOF on). Each new event also goes into its fence's
# and its device's index (fencing.model.event_index): one ZADD per index key of the call. KEYS: the
# hash, the time index, the stream, the index keys; ARGV after the stream's length: (id, JSON, time,
# fence index position in KEYS, device index position)*, in time order (position 0: none).
# At most LOG_CHUNK events a call (Lua's unpack limit: 8000).
_ADD_EVENTS = _KNOWN_IDS + LUA_COLLECT + """
local fields, scores, seen, flags, by, live = {}, {}, {}, {}, {}, {}
for j = 1, #ids do
  local id, i = ids[j], 5 * j - 3
  if known[j] or seen[id] then
    flags[j] = 0
  else
    seen[id] = true
    fields[#fields + 1] = id
    fields[#fields + 1] = ARGV[i + 1]
    scores[#scores + 1] = ARGV[i + 2]
    scores[#scores + 1] = id
    collect(by, tonumber(ARGV[i + 3]), ARGV[i + 2], id)
    collect(by, tonumber(ARGV[i + 4]), ARGV[i + 2], id)
    live[#live + 1] = ARGV[i + 1]
    flags[j] = 1
  end
end
if #fields > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
  redis.call('ZADD', KEYS[2], unpack(scores))
  zadd_all(by)
  for s = 1, #live, ENTRY_EVENTS do
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[1], '*', 'ENTRY_FIELD',
               table.concat(live, '\\n', s, math.min(s + ENTRY_EVENTS - 1, #live)))
  end
end
return flags
""".replace("ENTRY_EVENTS", str(live_stream.ENTRY_EVENTS)).replace("ENTRY_FIELD", live_stream.FIELD)
LOG_CHUNK = 2000

def public_events(events: list[dict]) -> list[bytes]:
    """Each event as the contract's JSON (the value in Kafka `fence.events`, the logs and webhooks),
    with its farm: a consumer serving several farms routes an event without looking its fence up."""
    return [compact_json.dumps({"event_id": e["event_id"], "type": e["type"], "farm_id": e["farm_id"],
                          "device_id": e["device_id"],
                          "fence_id": e["fence_id"], "ts": stamp, "lat": e["lat"], "lon": e["lon"],
                          **_MARKS[bool(e.get("inferred")), bool(e.get("late"))]})
            for e, stamp in zip(events, iso_many([e["ts"] for e in events]))]


# "inferred"/"late" are present (true) only on such events
_MARKS = {(False, False): {}, (True, False): {"inferred": True}, (False, True): {"late": True},
          (True, True): {"inferred": True, "late": True}}


EVENT_CHUNK = 20_000     # events turned into Python objects at a time by the driver


def event_records(events: pa.Table, chunk: int = EVENT_CHUNK):
    """(key, value) pairs of the event rows in (ts, event id) order, made `chunk` rows at a time: the
    driver's memory holds the batch's events as Arrow, not as Python objects."""
    if not events.num_rows:
        return
    order = pc.sort_indices(events, sort_keys=[("ts", "ascending"), ("eid", "ascending")])
    for start in range(0, len(order), chunk):
        part = events.take(order[start:start + chunk])
        # str as it is: the producer copies its UTF-8 bytes itself (no bytes object per key and value)
        yield from zip(part.column("key").to_pylist(), part.column("payload").to_pylist())


class EventLog:
    """Each farm's event log in Redis (hash + time index + live stream), written once per event id,
    always before Kafka gets the events: the process tasks `add` a batch's events before it commits
    and the driver produces them after; the silent scanner's sink (Sinks.write_found) adds, then
    produces."""

    def __init__(self, redis):
        self.redis = redis
        self.add_events = redis.register_script(_ADD_EVENTS)
        redis.script_load(_ADD_EVENTS)              # on every master: the pipelined EVALSHA needs it

    def add(self, events: list[dict], publics: list[bytes] | None = None,
            returning: bool = True) -> list[tuple[dict, bytes]]:
        """Each event into its farm's log unless its id is there already; returns the new ones, by
        time, each with its public JSON (`publics`: already made by the caller, in `events`' order;
        `returning=False`: returns nothing, for a caller that only writes). One script call per farm
        (bounded chunks), pipelined per master: a batch touching thousands of farms costs one round
        trip per node, not one per farm."""
        if publics is None:
            publics = public_events(events)
        pipe = NodePipeline(self.redis)
        chunks: list[list[int]] = []
        for farm_id, rows in _by_farm(events).items():
            rows.sort(key=lambda i: (events[i]["ts"], events[i]["event_id"]))    # the stream in time order
            for start in range(0, len(rows), LOG_CHUNK):
                chunk = rows[start:start + LOG_CHUNK]
                args = [live_stream.MAXLEN]
                table = KeyTable([keys.event_data(farm_id), keys.events(farm_id), keys.event_stream(farm_id)])
                for i in chunk:
                    event = events[i]
                    by_fence, by_device = index_keys(farm_id, event["fence_id"], event["device_id"])
                    args += (event["event_id"], publics[i], event["ts"], table.at(by_fence), table.at(by_device))
                pipe.script(self.add_events, table.keys, args)
                chunks.append(chunk)
        if not chunks:
            return []
        answers = pipe.execute()
        if not returning:
            return []
        new = [(events[i], publics[i]) for chunk, flags in zip(chunks, answers) for i, flag in zip(chunk, flags) if flag]
        new.sort(key=lambda e: (e[0]["ts"], e[0]["event_id"]))
        return new


def _by_farm(events: list[dict]) -> dict[str, list[int]]:
    by_farm: dict[str, list[int]] = {}
    for i, event in enumerate(events):
        by_farm.setdefault(event["farm_id"], []).append(i)
    return by_farm


_LOGS: dict[int, EventLog] = {}


def event_log(redis) -> EventLog:
    """One EventLog per Redis client (a Spark Python worker registers the script once)."""
    log = _LOGS.get(id(redis))
    if log is None:
        log = _LOGS[id(redis)] = EventLog(redis)
    return log


class Sinks:
    """The driver's side of a batch: its events to Kafka `fence.events` (once per batch id: the
    tasks have put them in Redis), dead letters to `gps.reports.dlq`, pings. `redis`: the active
    job's client (its epoch's user, fencing.model.job_user): a driver that lost its lease fails on its
    first command here and produces nothing."""

    def __init__(self, redis, producer):
        self.redis, self.producer = redis, producer
        self.log = event_log(redis)

    def write(self, batch_id: str, events: pa.Table, dead_letters: list[str], pings: list[str]) -> None:
        """`batch_id` is the run-qualified batch version; `events`: the tasks' event rows (public JSON
        `payload`, `key` = fence id, `ts`, `eid` = event id), produced by time from Arrow in chunks."""
        marker = keys.SINK_DONE.format(batch_id)
        if not self.redis.get(marker):
            # Kafka has no upsert: the marker keeps a replayed batch from producing again; consumers can
            # also drop duplicates by the deterministic event_id.
            self.producer.produce_records(TOPIC_EVENTS, event_records(events))
            self.producer.produce_records(TOPIC_DLQ, [(None, d.encode()) for d in dead_letters])
            self.redis.set(marker, "1", ex=7 * 24 * 3600)
        if pings:
            pipe = NodePipeline(self.redis)
            for ping in pings:
                key = keys.JOB_PING.format(ping)
                pipe.command(key, "SET", key, batch_id, "EX", 3600)
            pipe.execute()

    def write_found(self, events: list[dict]) -> int:
        """Events outside any batch (the silent scanner), in the order a batch's events take: into
        their farms' logs (each id once), then to Kafka `fence.events` by time —
        every one of them, new to the log or not. The scanner forgets a device only after this
        returns, so an event it finds again was never known to be produced: a crash in between
        produces it again (consumers drop a repeat by its event_id), never loses it. Returns how many
        were new to the logs."""
        publics = public_events(events)
        new = self.log.add(events, publics)      # a job that lost its lease fails here: nothing produced
        notify.live_changed(self.redis, {e["farm_id"] for e, _ in new})   # live streams read them now
        once: dict[str, int] = {}           # the same event twice in one call: produced once
        for i, event in enumerate(events):
            once.setdefault(event["event_id"], i)
        order = sorted(once.values(), key=lambda i: (events[i]["ts"], events[i]["event_id"]))
        self.producer.produce_records(TOPIC_EVENTS, [((events[i]["fence_id"] or events[i]["device_id"]).encode(),
                                                      publics[i]) for i in order])
        return len(new)
