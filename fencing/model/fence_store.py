"""Fences in Redis: the farm's canonical GeoJSON record plus, per H3 cell group it touches, the
compact record the job's tasks load (geometry as WKB, the group's interior/boundary cells, debounce)."""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import numpy as np
import orjson
import shapely

from fencing.model import keys, notify
from fencing.model.deleted_fences import DELETED_FENCES, mark as mark_deleted, unmark as unmark_deleted  # noqa: F401 - DELETED_FENCES: the job reads it from here
from fencing.model.geometry import FenceError, cover, groups_of, parse_fence_geometry
from fencing.model.h3util import cell_to_str
from fencing.model.timeutil import iso, to_ms

DEFAULT_DEBOUNCE_REPORTS = 2
DEFAULT_DEBOUNCE_SECONDS = 30.0


@dataclass(frozen=True)
class FenceRules:
    """Per-fence event rules (GeoJSON properties override the defaults). `warn_m`: APPROACH distance
    in metres (0 = off); `active_from`/`active_to`: the fence's window in epoch ms (None = open)."""
    debounce_reports: int = DEFAULT_DEBOUNCE_REPORTS
    debounce_seconds: float = DEFAULT_DEBOUNCE_SECONDS
    dwell_seconds: float | None = None
    warn_m: float = 0.0
    active_from: int | None = None
    active_to: int | None = None
    # derived once (the state machine asks per report and fence): has a window / anything per report
    windowed: bool = field(init=False, compare=False, repr=False)
    watched: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        windowed = self.active_from is not None or self.active_to is not None
        object.__setattr__(self, "windowed", windowed)
        object.__setattr__(self, "watched", windowed or bool(self.warn_m))

    def active(self, t: int) -> bool:
        """Whether the fence exists at time t (ms): from `active_from` on, before `active_to`."""
        return (self.active_from is None or t >= self.active_from) and (self.active_to is None or t < self.active_to)

    @classmethod
    def from_properties(cls, props: dict) -> "FenceRules":
        def number(name, lo, hi, integer=False):
            value = props.get(name)
            if value is None:
                return None
            # a Python int of 400 digits is a number here, but overflows numpy's isfinite: test floats only
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                    isinstance(value, float) and not np.isfinite(value)):
                raise FenceError(f"properties.{name} must be a number")
            if integer and int(value) != value:
                raise FenceError(f"properties.{name} must be an integer")
            if not lo <= value <= hi:
                raise FenceError(f"properties.{name} must be within [{lo}, {hi}]")
            return value

        def moment(name):
            value = props.get(name)
            if value is None:
                return None
            try:
                return to_ms(value)
            except (ValueError, OverflowError) as err:
                raise FenceError(f"properties.{name} must be an ISO 8601 time or epoch milliseconds ({err})") from None
        reports = number("debounce_reports", 1, 100, integer=True)
        seconds = number("debounce_seconds", 0, 86400)
        dwell = number("dwell_seconds", 1, 30 * 86400)
        warn = number("warn_m", 0, 10_000)
        start, end = moment("active_from"), moment("active_to")
        if start is not None and end is not None and end <= start:
            raise FenceError("properties.active_to must be later than properties.active_from")
        return cls(int(reports) if reports is not None else DEFAULT_DEBOUNCE_REPORTS,
                   float(seconds) if seconds is not None else DEFAULT_DEBOUNCE_SECONDS,
                   float(dwell) if dwell is not None else None,
                   float(warn) if warn is not None else 0.0, start, end)

    def record_fields(self) -> dict:
        """The rules as stored in a fence's cell-group records (what the job's fence cache reads)."""
        return {"debounce_reports": self.debounce_reports, "debounce_seconds": self.debounce_seconds,
                "dwell_seconds": self.dwell_seconds, "warn_m": self.warn_m,
                "active_from": self.active_from, "active_to": self.active_to}

    def normalized(self, props: dict) -> dict:
        """The Feature's properties with the window as ISO 8601 UTC strings (responses say times so)."""
        out = dict(props)
        for name, value in (("active_from", self.active_from), ("active_to", self.active_to)):
            if value is not None:
                out[name] = iso(value)
        return out


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


def feature_rules(feature) -> FenceRules:
    """The Feature's envelope and properties (name, event rules), before its geometry is looked at."""
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
    return FenceRules.from_properties(props)


def validate_feature(feature) -> ValidFence:
    """GeoJSON Feature → validated fence with its H3 cover; FenceError names what is wrong."""
    rules = feature_rules(feature)
    props = feature["properties"]
    geom = parse_fence_geometry(feature.get("geometry"))
    fence_cover = cover(geom)
    fence = ValidFence(
        feature={"type": "Feature", "geometry": feature["geometry"], "properties": rules.normalized(props)},
        geometry=geom, rules=rules, interior=fence_cover.interior, boundary=fence_cover.boundary)
    fence.groups = _split_by_group(fence_cover.interior, fence_cover.boundary)
    reason = fence_cost_error(fence)
    if reason:
        raise FenceError(reason)
    return fence


# What one fence may cost (issue 18: bounded work per request). The area and vertex limits of
# fencing.model.geometry bound these already for ordinary shapes; these bound them for any shape.
MAX_COVER_CELLS = 60_000            # res-9 cells of its cover (a 2,500 km² square needs ~25,000)
MAX_FENCE_REDIS_BYTES = 8 << 20     # its records in Redis: its outline is stored once per cell group


def fence_cost_error(fence: "ValidFence") -> str | None:
    """Why a fence would cost too much to store and match (a sentence for a 422), or None."""
    cells = len(fence.interior) + len(fence.boundary)
    if cells > MAX_COVER_CELLS:
        return (f"fence too costly: its cover has {cells} H3 cells > {MAX_COVER_CELLS} "
                "(limit on the cells of one fence); split it into smaller fences")
    # per group record: the outline (WKB) + ~20 bytes of JSON per cell
    size = len(fence.groups) * len(shapely.to_wkb(fence.geometry)) + 20 * cells
    if size > MAX_FENCE_REDIS_BYTES:
        return (f"fence too costly: its records would take {size / 2**20:.1f} MiB in Redis over "
                f"{len(fence.groups)} cell groups > {MAX_FENCE_REDIS_BYTES >> 20} MiB (limit on the Redis bytes "
                "of one fence); simplify its outline or split it")
    return None


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
                             "updated": iso(time.time() * 1000)}
    rules = fence.rules
    pipe = redis.pipeline()
    for group, record in group_records(farm_id, fence_id, version, fence).items():
        pipe.hset(keys.group_fences(group), uid, orjson.dumps(record))
        pipe.incr(keys.group_version(group))
    stale = set(previous["groups"]) - set(fence.groups) if previous else set()
    for group in stale:
        pipe.hdel(keys.group_fences(group), uid)
        pipe.incr(keys.group_version(group))
    pipe.set(keys.fence(farm_id, fence_id),
             orjson.dumps({"feature": feature, "version": version, "groups": sorted(fence.groups)}))
    pipe.sadd(keys.farm_fences(farm_id), fence_id)
    _set_window(pipe, farm_id, fence_id, rules)
    if fence.groups:
        pipe.sadd(keys.FENCE_GROUPS, *fence.groups)
    unmark_deleted(pipe, [uid])
    pipe.execute()
    notify.live_changed(redis, [farm_id])
    return feature


def group_records(farm_id: str, fence_id: str, version: int, fence: ValidFence) -> dict[str, dict]:
    """The compact record of the fence per cell group it touches: what the job's fence cache loads."""
    uid = fence_uid(farm_id, fence_id)
    wkb = shapely.to_wkb(fence.geometry, hex=True)
    rules = fence.rules.record_fields()
    return {group: {"uid": uid, "farm": farm_id, "fid": fence_id, "ver": version, "wkb": wkb,
                    "interior": interior, "boundary": boundary, **rules}
            for group, (interior, boundary) in fence.groups.items()}


def window_text(rules: FenceRules) -> str | None:
    """A fence's window as stored in the farm's window hash ("from,to", empty = open), None without one."""
    if not rules.windowed:
        return None
    return f"{'' if rules.active_from is None else rules.active_from},{'' if rules.active_to is None else rules.active_to}"


def _set_window(pipe, farm_id: str, fence_id: str, rules: FenceRules) -> None:
    text = window_text(rules)
    if text is None:
        pipe.hdel(keys.fence_windows(farm_id), fence_id)
    else:
        pipe.hset(keys.fence_windows(farm_id), fence_id, text)


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
    mark_deleted(pipe, [uid])
    for group in previous["groups"]:
        pipe.hdel(keys.group_fences(group), uid)
        pipe.incr(keys.group_version(group))
    pipe.delete(keys.fence(farm_id, fence_id))
    pipe.srem(keys.farm_fences(farm_id), fence_id)
    pipe.delete(keys.members(farm_id, fence_id))
    pipe.hdel(keys.fence_windows(farm_id), fence_id)
    pipe.execute()
    notify.live_changed(redis, [farm_id])   # cached "who is inside" answers of the fence are gone
    return True


# --- bulk load (benchmarks, imports) ---------------------------------------------------------------
def validate_features_bulk(features: list) -> list:
    """Like `validate_feature` for many Features at once: each entry is a ValidFence or the FenceError
    that `validate_feature` would raise. Parsing and rule checks run per fence (same strict code);
    the H3 covers of all fences are computed together (one polyfill call, one vectorized
    covers/intersects over every (fence, candidate cell) pair), ~20x faster than one `cover` each."""
    out: list = [None] * len(features)
    parsed: list[tuple[int, dict, shapely.Geometry, FenceRules]] = []
    for i, feature in enumerate(features):
        try:
            rules = feature_rules(feature)
            parsed.append((i, feature, None, rules))
        except FenceError as err:
            out[i] = err
    fast = _fast_geometries([p[1].get("geometry") for p in parsed])
    for k, (i, feature, _, rules) in enumerate(parsed):
        try:
            geom = fast[k] if fast[k] is not None else parse_fence_geometry(feature.get("geometry"))
            parsed[k] = (i, feature, geom, rules)
        except FenceError as err:
            out[i] = err
            parsed[k] = None
    parsed = [p for p in parsed if p is not None]
    if not parsed:
        return out
    geoms = np.array([p[2] for p in parsed], dtype=object)
    covers = _bulk_covers(geoms)
    for (i, feature, geom, rules), (interior, boundary, groups) in zip(parsed, covers):
        fence = ValidFence(feature={"type": "Feature", "geometry": feature["geometry"],
                                    "properties": rules.normalized(feature["properties"])},
                           geometry=geom, rules=rules, interior=interior, boundary=boundary, groups=groups)
        reason = fence_cost_error(fence)
        out[i] = FenceError(reason) if reason else fence
    return out


def _fast_geometries(geometries: list) -> list:
    """GEOS parses the GeoJSON of all fences at once; a geometry passes only when it is certainly
    what `parse_fence_geometry` accepts (right type, ≤ MAX_VERTICES, coordinates in range, no
    antimeridian crossing, valid, area ≤ MAX_AREA_KM2). Every other entry is None, and the caller
    runs the strict per-fence parser on it, which gives the exact error (or accepts it)."""
    from fencing.model.geometry import _EARTH_AUTHALIC_KM, MAX_AREA_KM2, MAX_VERTICES

    out: list = [None] * len(geometries)
    texts = []
    for g in geometries:
        ok = isinstance(g, dict) and g.get("type") in ("Polygon", "MultiPolygon")
        texts.append(orjson.dumps(g) if ok else b'{"type":"Point","coordinates":[]}')
    if not texts:
        return out
    geoms = shapely.from_geojson(np.array(texts, dtype=object), on_invalid="ignore")
    want = np.array([3 if isinstance(g, dict) and g.get("type") == "Polygon" else 6 for g in geometries])
    present = ~shapely.is_missing(geoms)
    good = present.copy()
    good[present] &= (shapely.get_type_id(geoms[present]) == want[present]) & ~shapely.is_empty(geoms[present])
    idx = np.flatnonzero(good)
    if not len(idx):
        return out
    geoms2 = shapely.force_2d(geoms[idx])
    ok = shapely.get_num_coordinates(geoms2) <= MAX_VERTICES
    b = shapely.bounds(geoms2)
    ok &= np.isfinite(b).all(axis=1) & (b[:, 0] >= -180) & (b[:, 2] <= 180) & (b[:, 1] >= -90) & (b[:, 3] <= 90)
    ok &= (b[:, 2] - b[:, 0]) <= 180.0
    ok &= shapely.is_valid(geoms2)
    # area on the sphere exactly as geometry.area_km2 (sinusoidal around each fence's centre)
    seg = shapely.segmentize(geoms2, 0.01)
    xy, which = shapely.get_coordinates(seg, return_index=True)
    lon0 = ((b[:, 0] + b[:, 2]) / 2.0)[which]
    rad = np.pi / 180.0
    lat = xy[:, 1] * rad
    proj = np.column_stack(((xy[:, 0] - lon0) * rad * np.cos(lat), lat)) * _EARTH_AUTHALIC_KM
    ok &= shapely.area(shapely.set_coordinates(seg.copy(), proj)) <= MAX_AREA_KM2
    for j, k in enumerate(idx):
        if ok[j]:
            out[k] = geoms2[j]
    return out


def _bulk_covers(geoms: np.ndarray, res: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """`fencing.model.geometry.cover` of every geometry, vectorized across fences (same candidates, same
    margin, same classification, so the same cells)."""
    import pyarrow as pa
    from h3ronpy import ContainmentMode
    from h3ronpy.vector import cells_to_wkb_polygons, wkb_to_cells

    from fencing.model.geometry import _margin_deg
    from fencing.model.h3util import cells_for_points
    from fencing.model.keys import FENCE_RES

    res = FENCE_RES if res is None else res
    eps = _margin_deg(res)
    n = len(geoms)
    grown_fences = shapely.buffer(geoms, eps, quad_segs=1, join_style="mitre")
    lists = pa.array(wkb_to_cells(pa.array(shapely.to_wkb(grown_fences), pa.binary()), res,
                                  ContainmentMode.Covers))
    offsets = np.asarray(lists.offsets)
    poly_cells = np.asarray(lists.values.to_numpy(zero_copy_only=False), dtype=np.uint64)
    poly_fence = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
    xy, vert_fence = shapely.get_coordinates(geoms, return_index=True)
    vert_cells = cells_for_points(xy[:, 1], xy[:, 0], res)
    fence_idx = np.concatenate([poly_fence, vert_fence.astype(np.int64)])
    cells = np.concatenate([poly_cells, vert_cells])
    order = np.lexsort((cells, fence_idx))
    fence_idx, cells = fence_idx[order], cells[order]
    keep = np.r_[True, (fence_idx[1:] != fence_idx[:-1]) | (cells[1:] != cells[:-1])]
    fence_idx, cells = fence_idx[keep], cells[keep]
    distinct, pos = np.unique(cells, return_inverse=True)
    hexes = shapely.from_wkb(np.asarray(cells_to_wkb_polygons(distinct).to_pylist(), dtype=object))
    grown = shapely.buffer(hexes, eps, quad_segs=1, join_style="mitre")
    b = shapely.bounds(hexes)
    straddles = ((b[:, 2] - b[:, 0]) > 180.0)[pos]
    shapely.prepare(geoms)
    inside = shapely.covers(geoms[fence_idx], grown[pos]) & ~straddles
    touches = straddles | shapely.intersects(geoms[fence_idx], grown[pos])
    kept = touches                                  # interior cells touch too
    fence_idx, cells, inside = fence_idx[kept], cells[kept], inside[kept]
    # per fence: cells are sorted ascending (lexsort above), as `cover` returns them
    group_codes, group_pos = np.unique(groups_of(cells), return_inverse=True)
    group_names = [cell_to_str(int(g)) for g in group_codes]
    bounds = np.searchsorted(fence_idx, np.arange(n + 1)).tolist()
    cells_l, inside_l, gpos_l = cells.tolist(), inside.tolist(), group_pos.tolist()
    out = []
    for k in range(n):
        lo, hi = bounds[k], bounds[k + 1]
        c = cells[lo:hi]
        m = inside[lo:hi]
        groups: dict[str, tuple[list[int], list[int]]] = {}
        for cell, is_in, gp in zip(cells_l[lo:hi], inside_l[lo:hi], gpos_l[lo:hi]):
            groups.setdefault(group_names[gp], ([], []))[0 if is_in else 1].append(cell)
        out.append((c[m], c[~m], groups))
    return out


def save_fences_bulk(redis, farm_id: str | None, fences, chunk: int = 5_000) -> list[dict]:
    """Create or replace many fences with few, large pipelines; returns the saved Features.

    ``fences``: (fence_id, fence) pairs of the farm ``farm_id`` — or, with ``farm_id=None``,
    (farm_id, fence_id, fence) triples of any farms — where a fence is a ValidFence or a GeoJSON
    Feature (validated in bulk; an invalid one raises FenceError naming it). The records written are
    exactly those of `save_fence` (versions continue from existing fences, groups a replaced fence
    left are cleared); commands are batched per key: one HSET per cell-group hash and one INCR per
    touched group per chunk, one MSET and one SADD per farm, so 100k fences load in seconds."""
    items = [(farm_id, *f) for f in fences] if farm_id is not None else [tuple(f) for f in fences]
    todo = [i for i, it in enumerate(items) if not isinstance(it[2], ValidFence)]
    if todo:
        checked = validate_features_bulk([items[i][2] for i in todo])
        for i, v in zip(todo, checked):
            if isinstance(v, FenceError):
                raise FenceError(f"fence {items[i][1]!r}: {v}")
            items[i] = (items[i][0], items[i][1], v)
    saved: list[dict] = []
    stamp = iso(time.time() * 1000)
    for start in range(0, len(items), chunk):
        part = items[start:start + chunk]
        by_farm: dict[str, list[int]] = {}
        for k, (farm, _, _) in enumerate(part):
            by_farm.setdefault(farm, []).append(k)
        pipe = redis.pipeline()
        for farm, ks in by_farm.items():      # previous versions: one MGET per farm (one slot)
            # MGET/MSET are refused by redis-py's cluster pipeline; raw commands on one slot (the
            # farm's hash tag) are routed like any single-key command
            pipe.execute_command("MGET", *[keys.fence(farm, part[k][1]) for k in ks])
        previous: list[dict | None] = [None] * len(part)
        for (farm, ks), raws in zip(by_farm.items(), pipe.execute()):
            for k, raw in zip(ks, raws):
                previous[k] = orjson.loads(raw) if raw else None
        pipe_windows = redis.pipeline()
        by_group: dict[str, dict[str, bytes]] = {}
        group_drops: dict[str, list[str]] = {}
        farm_docs: dict[str, dict[str, bytes]] = {}
        uids = []
        for k, (farm, fence_id, fence) in enumerate(part):
            uid = fence_uid(farm, fence_id)
            uids.append(uid)
            prev = previous[k]
            version = (prev["version"] + 1) if prev else 1
            feature = {**fence.feature, "id": fence_id}
            feature["properties"] = {**feature["properties"], "version": version, "updated": stamp}
            rules = fence.rules
            for group, record in group_records(farm, fence_id, version, fence).items():
                by_group.setdefault(group, {})[uid] = orjson.dumps(record)
            for group in (set(prev["groups"]) - set(fence.groups)) if prev else ():
                group_drops.setdefault(group, []).append(uid)
            if rules.windowed or prev:          # a new fence without a window has nothing to clear
                _set_window(pipe_windows, farm, fence_id, rules)
            farm_docs.setdefault(farm, {})[keys.fence(farm, fence_id)] = orjson.dumps(
                {"feature": feature, "version": version, "groups": sorted(fence.groups)})
            saved.append(feature)
        pipe = redis.pipeline()
        for group, mapping in by_group.items():
            pipe.hset(keys.group_fences(group), mapping=mapping)
        for group, drop in group_drops.items():
            pipe.hdel(keys.group_fences(group), *drop)
        for group in set(by_group) | set(group_drops):
            pipe.incr(keys.group_version(group))
        if by_group:
            pipe.sadd(keys.FENCE_GROUPS, *by_group)
        for farm, docs in farm_docs.items():
            pipe.execute_command("MSET", *[x for kv in docs.items() for x in kv])
            pipe.sadd(keys.farm_fences(farm), *[key.rsplit(":", 1)[1] for key in docs])
        unmark_deleted(pipe, uids)
        pipe.execute()
        pipe_windows.execute()
        notify.live_changed(redis, farm_docs)
    return saved
