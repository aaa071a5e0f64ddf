"""The secondary indexes of a farm's event log, and the listings that read them.

A farm's log is a hash event id → JSON (`evdata:{farm}`) and a time index (`events:{farm}`, a sorted set
of ids scored by event time). A listing filtered by fence or device reads the sorted set of that fence
(`evfence:{farm}:<fence>`) or device (`evdev:{farm}:<device>`), scored like the time index, so it reads
what it returns instead of the farm's whole log. Every key carries the farm's hash tag: one slot, one
node, and each script below declares every key it touches (a slot the elastic controller migrates
redirects a call before it runs, never half-way through).

Who keeps them:
* the writer (fencing.stream.sinks, `_ADD_EVENTS`) adds each new event to its indexes in the same
  script that adds it to the log: an id written twice adds nothing twice;
* retention (fencing.stream.retention) drops an event from the log and its indexes in one script;
* a fence's deletion leaves its events, and so its index, to retention (the log keeps them too);
* events written before the indexes existed: the first filtered listing of a farm whose log is not
  marked indexed (`evindexed:{farm}`) indexes the whole log, in bounded chunks, then marks it.
  Each chunk adds only ids the log still holds (checked in the script), so a trim racing the
  backfill leaves no index entry behind. This assumes the job writing the log runs this version too
  (an upgrade restarts the stack: `herdfence down`, then `up`).

A listing filtered by both fence and device reads the smaller of the two indexes and filters the rest
on the Redis side; every page is one script call (index range + HMGET), so the ids it returns always
have their JSON.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from fencing.model import keys

PAGE = 2000              # index entries one script call looks at (one HMGET of at most this many)
BACKFILL_CHUNK = 2000    # events indexed per backfill call


def index_keys(farm_id: str, fence_id: object, device_id: object) -> tuple[str | None, str | None]:
    """The fence and device index an event belongs to (None: the event has no such string id, e.g. a
    silent collar's event without a fence)."""
    return (keys.fence_events(farm_id, fence_id) if isinstance(fence_id, str) else None,
            keys.device_events(farm_id, device_id) if isinstance(device_id, str) else None)


class KeyTable:
    """The KEYS of one script call: the fixed keys first, then each index key once; `at` gives a key's
    1-based position in KEYS (0 for None), which the script's arguments name it by."""

    def __init__(self, fixed: list[str]) -> None:
        self.keys = list(fixed)
        self._at: dict[str, int] = {}

    def at(self, key: str | None) -> int:
        if key is None:
            return 0
        pos = self._at.get(key)
        if pos is None:
            self.keys.append(key)
            pos = self._at[key] = len(self.keys)
        return pos


# Lua: for the ids in `ids[j]` (new to the log) with ARGV positions of their index keys, collect
# score/id pairs per index key and ZADD each key once. Used by the writer (sinks) and the backfill.
LUA_COLLECT = """
local function collect(by, pos, score, id)
  if pos > 0 then
    local t = by[pos]
    if not t then t = {}; by[pos] = t end
    t[#t + 1] = score
    t[#t + 1] = id
  end
end
local function zadd_all(by)
  for pos, t in pairs(by) do
    redis.call('ZADD', KEYS[pos], unpack(t))
  end
end
"""

# Backfill: KEYS[1] the farm's time index, KEYS[2..] index keys; ARGV: (id, score, fence key position,
# device key position)*. Each id the log still holds goes into its indexes; returns how many.
_INDEX = LUA_COLLECT + """
local by, n = {}, 0
for i = 1, #ARGV, 4 do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    collect(by, tonumber(ARGV[i + 2]), ARGV[i + 1], ARGV[i])
    collect(by, tonumber(ARGV[i + 3]), ARGV[i + 1], ARGV[i])
    n = n + 1
  end
end
zadd_all(by)
return n
"""

# One page of a listing: KEYS[1] a sorted set of event ids (the time index or an index), KEYS[2] the
# event hash. ARGV: forward (1/0), lo, hi (score bounds), cursor score ('' = from the start), skip (entries
# at the cursor score already looked at), want (matches at most), budget (entries looked at, at most),
# field ('' = no filter), value (the field's value an event must have).
# Returns {done, cursor score, skip, score, JSON, score, JSON, ...}; done = 1 when the range is exhausted.
# The cursor is (score, how many at that score looked at): ties keep the sorted set's order.
_PAGE = """
local fwd = ARGV[1] == '1'
local lo, hi, cur, skip = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local want, budget, field, value = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8], ARGV[9]
local rows
if fwd then
  rows = redis.call('ZRANGEBYSCORE', KEYS[1], cur ~= '' and cur or lo, hi, 'WITHSCORES', 'LIMIT', skip, budget)
else
  rows = redis.call('ZREVRANGEBYSCORE', KEYS[1], cur ~= '' and cur or hi, lo, 'WITHSCORES', 'LIMIT', skip, budget)
end
local n = #rows / 2
if n == 0 then
  return {1, cur, skip}
end
local ids = {}
for i = 1, n do
  ids[i] = rows[2 * i - 1]
end
local raws = redis.call('HMGET', KEYS[2], unpack(ids))
local out = {0, '', 0}
local last, run, found = cur, skip, 0
for i = 1, n do
  local s = rows[2 * i]
  if s == last then run = run + 1 else last, run = s, 1 end
  local raw = raws[i]
  local keep = raw and true or false
  if keep and field ~= '' then
    local ok, event = pcall(cjson.decode, raw)
    keep = ok and type(event) == 'table' and event[field] == value
  end
  if keep then
    out[#out + 1] = s
    out[#out + 1] = raw
    found = found + 1
    if found == want then break end
  end
end
out[1] = (found < want and n < budget) and 1 or 0
out[2], out[3] = last, run
return out
"""

_SCRIPTS: dict[tuple[int, str], object] = {}


def _script(redis, text: str):
    script = _SCRIPTS.get((id(redis), text))
    if script is None:
        script = _SCRIPTS[(id(redis), text)] = redis.register_script(text)
    return script


@dataclass(frozen=True)
class Source:
    """The sorted set a listing reads, and the field it still filters on the Redis side ('' = none)."""
    index: str
    field: str = ""
    value: str = ""


def source(redis, farm_id: str, fence_id: str | None, device_id: str | None) -> Source:
    if fence_id is None and device_id is None:
        return Source(keys.events(farm_id))
    ensure_indexed(redis, farm_id)
    if device_id is None:
        return Source(keys.fence_events(farm_id, fence_id))
    if fence_id is None:
        return Source(keys.device_events(farm_id, device_id))
    by_fence, by_device = keys.fence_events(farm_id, fence_id), keys.device_events(farm_id, device_id)
    if redis.zcard(by_device) <= redis.zcard(by_fence):
        return Source(by_device, "fence_id", fence_id)
    return Source(by_fence, "device_id", device_id)


def scan(redis, farm_id: str, *, fence_id: str | None = None, device_id: str | None = None,
         forward: bool, lo: int | str = "-inf", hi: int | str = "+inf", want: int | None = None,
         page: int = PAGE) -> Iterator[tuple[str, str]]:
    """(score, event JSON) of the farm's retained events with scores in [lo, hi] and the given fence
    and device, oldest first (`forward`) or newest first; at most `want`."""
    src = source(redis, farm_id, fence_id, device_id)
    run = _script(redis, _PAGE)
    cursor, skip, left = "", 0, want
    while left is None or left > 0:
        n = page if left is None else min(page, left)
        out = run(keys=[src.index, keys.event_data(farm_id)],
                  args=[1 if forward else 0, lo, hi, cursor, skip, n, n if not src.field else page,
                        src.field, src.value])
        done, cursor, skip, rows = int(out[0]), out[1], int(out[2]), out[3:]
        for i in range(0, len(rows), 2):
            yield rows[i], rows[i + 1]
        if left is not None:
            left -= len(rows) // 2
        if done:
            return


def ensure_indexed(redis, farm_id: str) -> None:
    """Index the farm's log once (events written before the indexes existed), then mark it indexed."""
    marker = keys.events_indexed(farm_id)
    if redis.exists(marker):
        return
    chunk: list[tuple[str, str]] = []
    for score, raw in scan(redis, farm_id, forward=False):
        chunk.append((score, raw))
        if len(chunk) == BACKFILL_CHUNK:
            index_events(redis, farm_id, chunk)
            chunk = []
    index_events(redis, farm_id, chunk)
    redis.set(marker, "1")


def index_events(redis, farm_id: str, logged: list[tuple[str, str]]) -> int:
    """Put these (score, JSON) events of the farm's log into their indexes (those still logged);
    returns how many."""
    if not logged:
        return 0
    table = KeyTable([keys.events(farm_id)])
    args: list = []
    for score, raw in logged:
        event = orjson.loads(raw)
        by_fence, by_device = index_keys(farm_id, event.get("fence_id"), event.get("device_id"))
        args += (event["event_id"], score, table.at(by_fence), table.at(by_device))
    return _script(redis, _INDEX)(keys=table.keys, args=args)
