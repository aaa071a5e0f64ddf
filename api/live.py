"""Read side of the live state the job writes: positions, fence members, spatial lookups."""
from __future__ import annotations

import numpy as np
import orjson
import shapely

from fencing.timeutil import iso
from fencing import keys
from fencing.geometry import cover
from fencing.h3util import cell_to_str


def positions(redis, farm_id: str, device_ids: list[str] | None = None) -> dict[str, dict]:
    """device_id → latest position record (all of the farm's devices when device_ids is None)."""
    if device_ids is None:
        raw = redis.hgetall(keys.positions(farm_id))
        return {d: orjson.loads(v) for d, v in raw.items()}
    if not device_ids:
        return {}
    values = redis.hmget(keys.positions(farm_id), device_ids)
    return {d: orjson.loads(v) for d, v in zip(device_ids, values) if v}


def device_view(device_id: str, pos: dict | None) -> dict:
    pos = pos or {}
    return {"device_id": device_id, "lat": pos.get("lat"), "lon": pos.get("lon"), "ts": iso(pos.get("ts")),
            "fences": pos.get("fences", []), "battery": pos.get("battery")}


def fence_members(redis, farm_id: str, fence_id: str) -> list[dict]:
    inside = redis.hgetall(keys.members(farm_id, fence_id))
    found = positions(redis, farm_id, sorted(inside))
    return [{"device_id": d, "lat": p.get("lat"), "lon": p.get("lon"), "ts": iso(p.get("ts")),
             "inside_since": iso(int(inside[d]))} for d, p in found.items()]


def devices_within(redis, farm_id: str, geom: shapely.Geometry) -> dict[str, dict]:
    """Devices whose latest position lies in geom, from the res-7 cell index: devices in cells wholly
    inside are taken as they are, devices in boundary cells get an exact test — never a full scan."""
    area = cover(geom, res=keys.POS_INDEX_RES)
    interior = [cell_to_str(int(c)) for c in area.interior]
    boundary = [cell_to_str(int(c)) for c in area.boundary]
    pipe = redis.pipeline()
    for cell in interior + boundary:
        pipe.smembers(keys.position_cell(farm_id, cell))
    sets = pipe.execute() if (interior or boundary) else []
    sure = set().union(*sets[: len(interior)]) if interior else set()
    maybe = set().union(*sets[len(interior):]) - sure if boundary else set()
    found = positions(redis, farm_id, sorted(sure | maybe))
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
