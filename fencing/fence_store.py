"""Fences in Redis: the farm's canonical GeoJSON record plus, per H3 cell group it touches, the
compact record the job's tasks load (geometry as WKB, the group's interior/boundary cells, debounce)."""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import numpy as np
import orjson
import shapely

from fencing import keys
from fencing.geometry import FenceError, cover, groups_of, parse_fence_geometry
from fencing.h3util import cell_to_str

DEFAULT_DEBOUNCE_REPORTS = 2
DEFAULT_DEBOUNCE_SECONDS = 30.0
DELETED_FENCES = "fences:deleted"   # set of fence uids; the job drops their state and emits nothing more


@dataclass(frozen=True)
class FenceRules:
    """Per-fence event rules (GeoJSON properties override the defaults)."""
    debounce_reports: int = DEFAULT_DEBOUNCE_REPORTS
    debounce_seconds: float = DEFAULT_DEBOUNCE_SECONDS
    dwell_seconds: float | None = None

    @classmethod
    def from_properties(cls, props: dict) -> "FenceRules":
        def number(name, lo, hi, integer=False):
            value = props.get(name)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                raise FenceError(f"properties.{name} must be a number")
            if integer and int(value) != value:
                raise FenceError(f"properties.{name} must be an integer")
            if not lo <= value <= hi:
                raise FenceError(f"properties.{name} must be within [{lo}, {hi}]")
            return value
        reports = number("debounce_reports", 1, 100, integer=True)
        seconds = number("debounce_seconds", 0, 86400)
        dwell = number("dwell_seconds", 1, 30 * 86400)
        return cls(int(reports) if reports is not None else DEFAULT_DEBOUNCE_REPORTS,
                   float(seconds) if seconds is not None else DEFAULT_DEBOUNCE_SECONDS,
                   float(dwell) if dwell is not None else None)


@dataclass
class ValidFence:
    feature: dict
    geometry: shapely.Geometry
    rules: FenceRules
    interior: np.ndarray
    boundary: np.ndarray
    groups: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)


def fence_uid(farm_id: str, fence_id: str) -> str:
    return f"{farm_id}/{fence_id}"


def validate_feature(feature) -> ValidFence:
    """GeoJSON Feature → validated fence with its H3 cover; FenceError names what is wrong."""
    if not isinstance(feature, dict):
        raise FenceError("body must be a GeoJSON Feature object")
    if feature.get("type") != "Feature":
        raise FenceError('type must be "Feature"')
    props = feature.get("properties")
    if not isinstance(props, dict):
        raise FenceError("properties must be an object with a name")
    name = props.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise FenceError("properties.name must be a non-empty string of at most 200 characters")
    rules = FenceRules.from_properties(props)
    geom = parse_fence_geometry(feature.get("geometry"))
    fence_cover = cover(geom)
    fence = ValidFence(
        feature={"type": "Feature", "geometry": feature["geometry"], "properties": dict(props)},
        geometry=geom, rules=rules, interior=fence_cover.interior, boundary=fence_cover.boundary)
    fence.groups = _split_by_group(fence_cover.interior, fence_cover.boundary)
    return fence


def _split_by_group(interior: np.ndarray, boundary: np.ndarray) -> dict[str, tuple[list[int], list[int]]]:
    out: dict[str, tuple[list[int], list[int]]] = {}
    for cells, slot in ((interior, 0), (boundary, 1)):
        if len(cells) == 0:
            continue
        parents = groups_of(cells)
        order = np.argsort(parents, kind="stable")
        parents, cells = parents[order], cells[order]
        bounds = np.flatnonzero(np.diff(parents)) + 1
        for part_parents, part_cells in zip(np.split(parents, bounds), np.split(cells, bounds)):
            group = cell_to_str(int(part_parents[0]))
            out.setdefault(group, ([], []))[slot].extend(int(c) for c in part_cells)
    return out


def new_fence_id() -> str:
    return "f-" + secrets.token_hex(6)


def save_fence(redis, farm_id: str, fence_id: str, fence: ValidFence) -> dict:
    """Create or replace a fence; the job sees it at the next micro-batch of each touched group."""
    uid = fence_uid(farm_id, fence_id)
    previous = load_fence(redis, farm_id, fence_id)
    version = (previous["version"] + 1) if previous else 1
    feature = {**fence.feature, "id": fence_id}
    feature["properties"] = {**feature["properties"], "version": version,
                             "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    wkb = shapely.to_wkb(fence.geometry, hex=True)
    rules = fence.rules
    pipe = redis.pipeline()
    for group, (interior, boundary) in fence.groups.items():
        record = {"uid": uid, "farm": farm_id, "fid": fence_id, "ver": version, "wkb": wkb,
                  "interior": interior, "boundary": boundary,
                  "debounce_reports": rules.debounce_reports, "debounce_seconds": rules.debounce_seconds,
                  "dwell_seconds": rules.dwell_seconds}
        pipe.hset(keys.group_fences(group), uid, orjson.dumps(record))
        pipe.incr(keys.group_version(group))
    stale = set(previous["groups"]) - set(fence.groups) if previous else set()
    for group in stale:
        pipe.hdel(keys.group_fences(group), uid)
        pipe.incr(keys.group_version(group))
    pipe.set(keys.fence(farm_id, fence_id),
             orjson.dumps({"feature": feature, "version": version, "groups": sorted(fence.groups)}))
    pipe.sadd(keys.farm_fences(farm_id), fence_id)
    pipe.srem(DELETED_FENCES, uid)
    pipe.execute()
    return feature


def load_fence(redis, farm_id: str, fence_id: str) -> dict | None:
    raw = redis.get(keys.fence(farm_id, fence_id))
    return orjson.loads(raw) if raw else None


def list_fences(redis, farm_id: str) -> list[dict]:
    ids = sorted(redis.smembers(keys.farm_fences(farm_id)))
    if not ids:
        return []
    raws = redis.mget([keys.fence(farm_id, i) for i in ids])   # one slot: the farm's hash tag
    return [orjson.loads(r)["feature"] for r in raws if r]


def delete_fence(redis, farm_id: str, fence_id: str) -> bool:
    previous = load_fence(redis, farm_id, fence_id)
    if previous is None:
        return False
    uid = fence_uid(farm_id, fence_id)
    pipe = redis.pipeline()
    pipe.sadd(DELETED_FENCES, uid)
    for group in previous["groups"]:
        pipe.hdel(keys.group_fences(group), uid)
        pipe.incr(keys.group_version(group))
    pipe.delete(keys.fence(farm_id, fence_id))
    pipe.srem(keys.farm_fences(farm_id), fence_id)
    pipe.delete(keys.members(farm_id, fence_id))
    pipe.execute()
    return True
