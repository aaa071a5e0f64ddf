"""The deleted-fence set and its pruning.

When a fence is deleted its uid goes into `fences:deleted`: the job's tasks forget a deleted fence in a
device's state at the device's next counting report, and emit nothing more for it. Without pruning the
set only grows (every fence ever deleted, read by every micro-batch). An entry may go once no device
state can still name the fence:
* its deletion is older than a grace period (a micro-batch that began before the deletion, with the
  fence in its cache, has long finished: no new state can name it);
* no device state record names it in "s" (the state now), nor in "d" (what the state before the batch
  that wrote the record had different: its fences when they changed; "p" in records written before
  that was a delta) unless that batch is committed (it is never replayed, so those are never read).
The states are searched on the Redis side (a script per chunk of a group's state hash; only records
that name some fence are decoded), so a sweep moves uids, not device states, over the network.

Each entry's deletion time lives in `{fences:deleted}:at` (the same slot as the set), so an entry is
dropped only if it still carries the deletion time the sweep saw: a fence re-created or deleted again
meanwhile is left alone. A stray members hash the job may have written for the fence while its
deletion was in flight is dropped with it (unless the fence exists again).

The window left: a state that moves between the nodes' scans (a device changing cell group, a slot
the elastic controller migrates) while the sweep runs can be missed; if it still names the fence, that
device's next report may then give one `exit` event for the fence that is gone. It takes a device that
has not reported since the deletion (an hour or more) to move in those seconds.
"""
from __future__ import annotations

import time

from fencing.model import keys

DELETED_FENCES = "fences:deleted"          # set of fence uids; the job drops their state, emits nothing
DELETED_AT = "{fences:deleted}:at"         # hash uid -> deletion time (ms); same slot as the set
STATE_MATCH = "{g:*}:state"
SCAN_COUNT = 500                           # state records one script call looks at
UIDS_PER_SCAN = 2_000                      # deleted fences looked for in one pass over the states

# KEYS[1]: one group's device-state hash. ARGV: cursor, count, run id ("" unknown), first batch that may
# still be replayed, uid... Returns {next cursor, uid named, ...}. Work per record, not per uid: a
# record is decoded only when it names some fence at all (a uid holds a "/"; nothing else in a
# state does), and its fences are looked up in the set of uids.
_NAMED = """
local scan = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local run, floor = ARGV[3], tonumber(ARGV[4])
local wanted, found, out = {}, {}, {scan[1]}
for j = 5, #ARGV do wanted[ARGV[j]] = true end
local function collect(state)
  if type(state) == 'table' and type(state.f) == 'table' then
    for uid, _ in pairs(state.f) do
      if wanted[uid] and not found[uid] then found[uid] = true; table.insert(out, uid) end
    end
  end
end
local values = scan[2]
for i = 2, #values, 2 do
  local raw = values[i]
  if string.find(raw, '/', 1, true) then
    local ok, rec = pcall(cjson.decode, raw)
    if ok and type(rec) == 'table' then
      collect(rec.s)
      local replayable = true
      if run ~= '' and type(rec.b) == 'string' then
        local brun, batch = string.match(rec.b, '^(.*):(%d+)$')
        replayable = brun == run and tonumber(batch) >= floor
      end
      if replayable then collect(rec.p); collect(rec.d) end
    end
  end
end
return out
"""

# KEYS[1] the set, KEYS[2] the deletion times; ARGV: uid, time, uid, time, ...
_DROP = """
local dropped = {}
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 1] then
    redis.call('SREM', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    table.insert(dropped, ARGV[i])
  end
end
return dropped
"""

# KEYS[1] the fence's document, KEYS[2] its members hash (one farm slot)
_DROP_MEMBERS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.call('DEL', KEYS[2]) end
return 0
"""


def now_ms() -> int:
    return int(time.time() * 1000)


def mark(pipe, uids: list[str], at_ms: int | None = None) -> None:
    """In the deleting pipeline: these fences are deleted as of now."""
    if uids:
        at = str(at_ms if at_ms is not None else now_ms())
        pipe.sadd(DELETED_FENCES, *uids)
        pipe.hset(DELETED_AT, mapping={u: at for u in uids})


def unmark(pipe, uids: list[str]) -> None:
    """In the saving pipeline: these fences exist (again)."""
    if uids:
        pipe.srem(DELETED_FENCES, *uids)
        pipe.hdel(DELETED_AT, *uids)


def named_in_states(redis, uids: list[str], run_id: str = "", first_replayable: int = 0) -> set[str]:
    """Which of `uids` some device state still names (see the module doc for "p")."""
    if not uids:
        return set()
    script = redis.register_script(_NAMED)
    named: set[str] = set()
    for key in redis.scan_iter(match=STATE_MATCH, count=10_000, target_nodes=redis.PRIMARIES):
        cursor = "0"
        while True:
            left = [u for u in uids if u not in named]
            if not left:
                return named
            out = script(keys=[key], args=[cursor, SCAN_COUNT, run_id, first_replayable, *left])
            cursor = out[0].decode() if isinstance(out[0], bytes) else str(out[0])
            named.update(u.decode() if isinstance(u, bytes) else u for u in out[1:])
            if cursor == "0":
                break
    return named


def prune(redis, grace_s: float, run_id: str = "", first_replayable: int = 0,
          at_ms: int | None = None) -> list[str]:
    """Drop the entries deleted more than `grace_s` ago that no device state names; returns them.
    Entries without a deletion time (written before it was kept) get one now and wait a grace period."""
    now = at_ms if at_ms is not None else now_ms()
    members = redis.smembers(DELETED_FENCES)
    if not members:
        return []
    times = dict(zip(sorted(members), redis.hmget(DELETED_AT, sorted(members))))
    undated = [u for u, t in times.items() if t is None]
    if undated:
        redis.hset(DELETED_AT, mapping={u: str(now) for u in undated})
    due = {u: t for u, t in times.items() if t is not None and int(t) <= now - grace_s * 1000}
    if not due:
        return []
    dropped: list[str] = []
    candidates = sorted(due)
    for start in range(0, len(candidates), UIDS_PER_SCAN):   # one scan of every state per chunk
        chunk = candidates[start:start + UIDS_PER_SCAN]
        named = named_in_states(redis, chunk, run_id, first_replayable)
        free = [u for u in chunk if u not in named]
        if free:
            out = redis.register_script(_DROP)(keys=[DELETED_FENCES, DELETED_AT],
                                               args=[x for u in free for x in (u, due[u])])
            dropped += [u.decode() if isinstance(u, bytes) else u for u in out]
    drop_members = redis.register_script(_DROP_MEMBERS)
    for uid in dropped:
        farm_id, _, fence_id = uid.partition("/")
        drop_members(keys=[keys.fence(farm_id, fence_id), keys.members(farm_id, fence_id)])
    return dropped
