"""Read side of the live state the job writes: positions, fence members, spatial lookups."""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import orjson
import shapely

from fencing.model.timeutil import iso
from fencing.model import keys
from fencing.model.geometry import cover
from fencing.model.h3util import cell_to_str


def positions(redis, farm_id: str, device_ids: list[str] | None = None) -> dict[str, dict]:
    """device_id → latest position record (all of the farm's devices when device_ids is None)."""
    if device_ids is None:
        raw = redis.hgetall(keys.positions(farm_id))
        return {d: orjson.loads(v) for d, v in raw.items()}
    if not device_ids:
        return {}
    values = redis.hmget(keys.positions(farm_id), device_ids)
    return {d: orjson.loads(v) for d, v in zip(device_ids, values) if v}


def device_view(device_id: str, pos: dict | None, closed: set[str] = frozenset()) -> dict:
    """`closed`: the farm's fences outside their active window now (`closed_fences`): not listed."""
    pos = pos or {}
    return {"device_id": device_id, "lat": pos.get("lat"), "lon": pos.get("lon"), "ts": iso(pos.get("ts")),
            "fences": [f for f in pos.get("fences", []) if f not in closed], "battery": pos.get("battery")}


def closed_fences(redis, farm_id: str, now_ms: int | None = None) -> set[str]:
    """The farm's fences outside their active window by wall clock: they list no members."""
    windows = redis.hgetall(keys.fence_windows(farm_id))
    if not windows:
        return set()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    out = set()
    for fence_id, text in windows.items():
        start, _, end = text.partition(",")
        if (start and now_ms < int(start)) or (end and now_ms >= int(end)):
            out.add(fence_id)
    return out


# Query-by-fence in one round trip (all keys share the farm's slot): does the fence exist, is it in its
# active window now (ARGV[2], ms), who is in it, and where are they. nil when the fence does not exist;
# the third element says the fence has a window (its answer changes with the clock alone).
_MEMBERS = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return false end
local window = redis.call('HGET', KEYS[4], ARGV[1])
local windowed = 0
if window then
  windowed = 1
  local now = tonumber(ARGV[2])
  local comma = string.find(window, ',', 1, true)
  local from, to = tonumber(string.sub(window, 1, comma - 1)), tonumber(string.sub(window, comma + 1))
  if (from and now < from) or (to and now >= to) then return {{}, {}, windowed} end
end
local inside = redis.call('HGETALL', KEYS[2])
local ids = {}
for i = 1, #inside, 2 do ids[#ids + 1] = inside[i] end
if #ids == 0 or #ids > 7000 then return {inside, {}, windowed} end
return {inside, redis.call('HMGET', KEYS[3], unpack(ids)), windowed}
"""


@dataclass(frozen=True)
class Members:
    devices: list[dict]
    windowed: bool        # the fence has an active window: the answer may change with the clock alone


async def fence_members(aredis, farm_id: str, fence_id: str, now_ms: int | None = None) -> Members | None:
    """Devices inside the fence now (none outside its active window, by wall clock), or None when the
    farm has no such fence (async Redis client)."""
    script = _script(aredis, _MEMBERS)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    answer = await script(keys=[keys.farm_fences(farm_id), keys.members(farm_id, fence_id),
                                keys.positions(farm_id), keys.fence_windows(farm_id)], args=[fence_id, now_ms])
    if answer is None:
        return None
    flat, raw_positions, windowed = answer
    inside = dict(zip(flat[::2], flat[1::2]))
    ids = flat[::2]
    if inside and not raw_positions:       # too many members for one script call: read positions apart
        raw_positions = await aredis.hmget(keys.positions(farm_id), ids)
    found = {d: orjson.loads(r) for d, r in zip(ids, raw_positions) if r}
    return Members([{"device_id": d, "lat": p.get("lat"), "lon": p.get("lon"), "ts": iso(p.get("ts")),
                     "inside_since": iso(int(inside[d]))} for d, p in sorted(found.items())], bool(windowed))


_scripts: dict[tuple[int, str], object] = {}


def _script(redis, source: str):
    key = (id(redis), source)
    if key not in _scripts:
        _scripts[key] = redis.register_script(source)
    return _scripts[key]


@lru_cache(maxsize=4096)
def _cover_cells(wkb: bytes) -> tuple[list[str], list[str]]:
    """The res-7 cover of a query area; cached, since dashboards ask about the same areas again."""
    area = cover(shapely.from_wkb(wkb), res=keys.POS_INDEX_RES)
    return [cell_to_str(int(c)) for c in area.interior], [cell_to_str(int(c)) for c in area.boundary]


async def devices_within(aredis, farm_id: str, geom: shapely.Geometry) -> dict[str, dict]:
    """Devices whose latest position lies in geom, from the res-7 cell index: devices in cells wholly
    inside are taken as they are, devices in boundary cells get an exact test — never a full scan."""
    interior, boundary = _cover_cells(shapely.to_wkb(geom))
    pipe = aredis.pipeline()
    for cell in interior + boundary:
        pipe.smembers(keys.position_cell(farm_id, cell))
    sets = await pipe.execute() if (interior or boundary) else []
    sure = set().union(*sets[: len(interior)]) if interior else set()
    maybe = set().union(*sets[len(interior):]) - sure if boundary else set()
    ids = sorted(sure | maybe)
    found = {d: orjson.loads(v) for d, v in zip(ids, await aredis.hmget(keys.positions(farm_id), ids)) if v} \
        if ids else {}
    if maybe:
        candidates = [d for d in maybe if d in found]
        lon = np.array([found[d]["lon"] for d in candidates], dtype=float)
        lat = np.array([found[d]["lat"] for d in candidates], dtype=float)
        shapely.prepare(geom)
        hits = shapely.intersects_xy(geom, lon, lat) if candidates else np.array([], bool)
        for device_id, hit in zip(candidates, hits):
            if not hit:
                found.pop(device_id, None)
    return found
