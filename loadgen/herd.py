"""Deterministic herd simulator: farms, paddock fences and GPS tracks of grazing herds.

Everything is drawn from one seed, and fences use their own random stream, so the same seed gives the
same fences whatever the number of devices or points (benchmarks vary load against a fixed fence set).
Tracks are generated step by step with numpy across all devices at once: a Python loop over points
would be 10-50x slower and 1M-point benchmark loads must build in seconds.

Geometry is built in metres on a local plane around the region centre and projected to lon/lat with an
equirectangular projection: exact enough at farm scale, and shared paddock edges stay bit-identical.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pandas as pd
import shapely
from shapely.geometry import shape

COORD_DECIMALS = 7            # ~1 cm; short JSON, and a float parsed back from JSON is the same float
M_PER_DEG_LAT = 110_574.0
M_PER_DEG_LON_EQ = 111_320.0
HERD_NAMES = ("north", "south", "east", "west", "hill", "river", "meadow", "forest")


@dataclass(frozen=True)
class Fence:
    """A fence as the API takes it (``geojson`` is a Feature) plus its shapely geometry.

    ``debounce_*`` are per-fence overrides (None = the default); they are mirrored in the Feature's
    properties under the same names, which is where the API reads them."""
    fence_id: str
    name: str
    geometry: Any                       # shapely Polygon / MultiPolygon, lon/lat
    geojson: dict
    farm_id: str = ""
    debounce_reports: int | None = None
    debounce_seconds: float | None = None

    @classmethod
    def from_feature(cls, feature: dict, fence_id: str | None = None, farm_id: str = "") -> "Fence":
        """A Fence from a GeoJSON Feature (e.g. one read back from GET /v1/fences)."""
        props = feature.get("properties") or {}
        reports, seconds = props.get("debounce_reports"), props.get("debounce_seconds")
        return cls(fence_id=str(fence_id if fence_id is not None else feature["id"]),
                   name=str(props.get("name", "")), geometry=shape(feature["geometry"]), geojson=feature,
                   farm_id=farm_id, debounce_reports=None if reports is None else int(reports),
                   debounce_seconds=None if seconds is None else float(seconds))


@dataclass(frozen=True)
class Farm:
    farm_id: str
    name: str
    center_m: tuple[float, float]       # local plane, metres
    extent_m: tuple[float, float, float, float]   # minx, miny, maxx, maxy (local plane)
    water_m: np.ndarray                 # (W, 2) water points, local plane



# The shapes of track `bench push/core/stage --tracks` offer: "dense" = a fix every ~30 s, in order;
# "sparse" = collars saving battery, a fix every 5–15 min, 5% of them buffered out of coverage and
# uploaded late (inferred crossings, late excursions), in half of those blocks the animal away and back
# when coverage is (an escape whose return is seen live)
TRACKS = {"dense": {}, "sparse": {"report_interval_s": 600.0, "interval_jitter": 0.5, "late_fraction": 0.05,
                                  "late_escape": 0.5}}

@dataclass(frozen=True)
class SimConfig:
    seed: int = 0
    center: tuple[float, float] = (8.5, 47.0)          # lon, lat of the region centre
    farms: int = 4
    fences_per_farm: int = 12
    fences_total: int | None = None                     # overrides farms * fences_per_farm (spread evenly)
    devices: int = 1_000                                # all farms together
    herds_per_farm: int = 2
    steps: int = 120                                    # reports per device (before silence)
    points: int | None = None                           # exact number of reports; overrides steps
    report_interval_s: float = 30.0
    interval_jitter: float = 0.2                        # per-report jitter, fraction of the interval
    late_fraction: float = 0.0                          # reports buffered by the collar, uploaded late
    late_block: tuple[int, int] = (4, 12)               # fixes per buffered block (out of coverage)
    late_escape: float = 0.0                            # share of those blocks the animal spends away
    start_ms: int = 1_735_689_600_000                   # 2025-01-01T00:00:00Z: fixed, so runs repeat
    farm_spacing_m: float = 4_000.0
    water_points_per_farm: int = 3
    water_period_s: float = 4 * 3600.0                  # a herd walks to water about every 4 h
    skew: float = 0.0                                   # fraction of devices gathering at the hot spot
    hotspot_leg_s: float = 3_600.0                      # hot spot moves to the next farm every leg
    gather_speed_mps: float = 3.0                       # gathering animals are driven (trot)
    hotspot_radius_m: float = 40.0
    silent_fraction: float = 0.02                       # devices whose battery dies during the run
    gps_sigma_m: float = 2.5                            # per-report measurement noise
    stray_prob: float = 0.004                           # single multipath glitch 15-60 m away
    hole_fraction: float = 0.15
    multipolygon_fraction: float = 0.3                  # of the overlay (non-grid) fences

    @classmethod
    def for_totals(cls, fences: int, points: int, devices: int, **kw: Any) -> "SimConfig":
        """The shape the benchmarks ask for: N fences in total, M points, D devices."""
        per_farm = kw.pop("fences_per_farm", 12)
        farms = kw.pop("farms", max(1, math.ceil(fences / per_farm)))
        return cls(farms=farms, fences_per_farm=per_farm, fences_total=fences, points=points,
                   devices=devices, **kw)


@dataclass
class Simulation:
    config: SimConfig
    farms: list[Farm]
    fences: list[Fence]
    device_ids: np.ndarray                              # (D,) str
    device_farm: dict[str, str]
    device_herd: dict[str, str]
    reports: pd.DataFrame                               # device_id, ts, lat, lon, battery; arrival order (ts
                                                        # order unless some were uploaded late)
    silent_devices: list[str] = field(default_factory=list)

    def fences_of(self, farm_id: str) -> list[Fence]:
        return [f for f in self.fences if f.farm_id == farm_id]


# --- projection ----------------------------------------------------------------------------------
class _Plane:
    """Local metric plane <-> lon/lat around the region centre."""

    def __init__(self, lon0: float, lat0: float):
        self.lon0, self.lat0 = lon0, lat0
        self.m_per_deg_lon = M_PER_DEG_LON_EQ * math.cos(math.radians(lat0))

    def to_lonlat(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lon = np.round(self.lon0 + x / self.m_per_deg_lon, COORD_DECIMALS)
        lat = np.round(self.lat0 + y / M_PER_DEG_LAT, COORD_DECIMALS)
        return lon, lat

    def geometry(self, geom_m: Any) -> Any:
        def tr(coords: np.ndarray) -> np.ndarray:
            lon, lat = self.to_lonlat(coords[:, 0], coords[:, 1])
            return np.column_stack([lon, lat])
        return shapely.transform(geom_m, tr)


# --- fences --------------------------------------------------------------------------------------
def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def _pick(rng: np.random.Generator, n: int, fraction: float) -> set[int]:
    """A few indices: at least one whenever the fraction is > 0 and there are enough candidates."""
    if n == 0 or fraction <= 0:
        return set()
    k = min(n, max(1, round(fraction * n))) if n >= 3 else 0
    return set(rng.choice(n, size=k, replace=False).tolist())


def _circle(x: float, y: float, r: float) -> Any:
    return shapely.Point(x, y).buffer(r, quad_segs=8)


def _farm_layout(rng: np.random.Generator, n_fences: int, cfg: SimConfig) -> tuple[list[Any], np.ndarray, tuple]:
    """Paddock geometries (metres, farm-local origin), water points and extent of one farm.

    ~70% are a grid of rectangular paddocks sharing edges exactly (adjacent fences; a device on a
    shared edge is inside both), some with a hole (pond, barn); the rest are round overlay zones
    that overlap paddocks, some of them MultiPolygons of two disjoint parts."""
    n_grid = max(1, round(0.7 * n_fences)) if n_fences else 0
    n_overlay = n_fences - n_grid
    cols = max(1, math.ceil(math.sqrt(n_grid)))
    rows = max(1, math.ceil(n_grid / cols))
    xs = np.concatenate([[0.0], np.cumsum(rng.uniform(120, 450, cols))])   # 1.4-20 ha paddocks
    ys = np.concatenate([[0.0], np.cumsum(rng.uniform(120, 450, rows))])
    holes = _pick(rng, n_grid, cfg.hole_fraction)
    geoms: list[Any] = []
    for i in range(n_grid):
        r, c = divmod(i, cols)
        x0, x1, y0, y1 = xs[c], xs[c + 1], ys[r], ys[r + 1]
        shell = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
        inner = []
        if i in holes:
            w, h = x1 - x0, y1 - y0
            hx, hy = rng.uniform(0.15, 0.35) * w, rng.uniform(0.15, 0.35) * h
            cx, cy = x0 + rng.uniform(0.25, 0.75) * w, y0 + rng.uniform(0.25, 0.75) * h
            cx, cy = np.clip(cx, x0 + hx / 2 + 5, x1 - hx / 2 - 5), np.clip(cy, y0 + hy / 2 + 5, y1 - hy / 2 - 5)
            inner = [[(cx - hx / 2, cy - hy / 2), (cx + hx / 2, cy - hy / 2),
                      (cx + hx / 2, cy + hy / 2), (cx - hx / 2, cy + hy / 2)]]
        geoms.append(shapely.Polygon(shell, inner))
    width, height = xs[-1], ys[-1]
    multis = _pick(rng, n_overlay, cfg.multipolygon_fraction)
    for j in range(n_overlay):
        r1 = rng.uniform(60, 280)                                                 # 1.1-25 ha
        x, y = rng.uniform(0, width), rng.uniform(0, height)
        if j in multis:
            r2 = rng.uniform(60, 280)
            ang = rng.uniform(0, 2 * math.pi)
            d = r1 + r2 + rng.uniform(20, 200)                                   # disjoint parts
            geoms.append(shapely.MultiPolygon([_circle(x, y, r1),
                                               _circle(x + d * math.cos(ang), y + d * math.sin(ang), r2)]))
        else:
            geoms.append(_circle(x, y, r1))
    # water troughs sit on paddock corners, where several fences meet: herds spend time on boundaries
    corners = np.array([(x, y) for x in xs for y in ys])
    water = corners[rng.choice(len(corners), size=min(cfg.water_points_per_farm, len(corners)), replace=False)]
    return geoms, water, (0.0, 0.0, float(width), float(height))


def _features(ids: list[str], names: list[str], geoms_m: np.ndarray, offsets_m: np.ndarray,
              plane: _Plane) -> tuple[np.ndarray, list[dict]]:
    """Shift farm-local geometries to the region plane, project, orient (RFC 7946: exterior rings
    counter-clockwise) and serialize, all vectorized over the fences. The geometries are parsed back
    from their own GeoJSON, so ``geometry`` is exactly what a consumer of ``geojson`` gets."""
    geoms = np.array(geoms_m, dtype=object).copy()
    coords, index = shapely.get_coordinates(geoms, return_index=True)
    coords = coords + offsets_m[index]
    lon, lat = plane.to_lonlat(coords[:, 0], coords[:, 1])
    geoms = shapely.set_coordinates(shapely.transform(geoms, lambda c: c), np.column_stack([lon, lat]))
    text = shapely.to_geojson(shapely.orient_polygons(geoms, exterior_cw=False))
    features = [{"type": "Feature", "id": fid, "properties": {"name": name}, "geometry": orjson.loads(t)}
                for fid, name, t in zip(ids, names, text)]
    return shapely.from_geojson(text), features


def make_farms_and_fences(cfg: SimConfig, rng: np.random.Generator) -> tuple[list[Farm], list[Fence]]:
    total = cfg.fences_total if cfg.fences_total is not None else cfg.farms * cfg.fences_per_farm
    layouts = [_farm_layout(rng, n, cfg) for n in _split(total, cfg.farms)]
    # farms on a jittered square grid; spacing grows with the largest farm so farms never overlap
    spacing = max(cfg.farm_spacing_m, 1.5 * max(max(l[2][2], l[2][3]) for l in layouts))
    side = math.ceil(math.sqrt(cfg.farms))
    farms: list[Farm] = []
    ids, names, farm_of, geoms_m, offsets = [], [], [], [], []
    for f, (geoms, water, (_, _, w, h)) in enumerate(layouts):
        r, c = divmod(f, side)
        ox = (c - (side - 1) / 2) * spacing + rng.uniform(-0.1, 0.1) * spacing - w / 2
        oy = (r - (side - 1) / 2) * spacing + rng.uniform(-0.1, 0.1) * spacing - h / 2
        farm_id = f"farm-{f:03d}"
        farms.append(Farm(farm_id, f"Farm {f}", (ox + w / 2, oy + h / 2), (ox, oy, ox + w, oy + h),
                          water + (ox, oy)))
        for j, g in enumerate(geoms):
            kind = "Paddock" if shapely.get_num_coordinates(g) <= 10 else "Zone"   # rectangle (+ hole)
            ids.append(f"{farm_id}-fence-{j:03d}")
            names.append(f"{kind} {f}.{j}")
            farm_of.append(farm_id)
            geoms_m.append(g)
            offsets.append((ox, oy))
    if not ids:
        return farms, []
    geoms, features = _features(ids, names, geoms_m, np.array(offsets), _Plane(*cfg.center))
    fences = [Fence(fid, name, g, feat, farm) for fid, name, g, feat, farm in zip(ids, names, geoms, features, farm_of)]
    return farms, fences


# --- tracks --------------------------------------------------------------------------------------
def _steps_for(cfg: SimConfig) -> int:
    if cfg.points is None:
        return cfg.steps
    # silent devices report for 20-90% of the run: over-provision, then cut to exactly `points`
    alive = 1.0 - 0.45 * cfg.silent_fraction
    return max(1, math.ceil(cfg.points / (cfg.devices * alive)) + 1)


def _hotspot_path(farms: list[Farm], rng: np.random.Generator, t_s: np.ndarray, leg_s: float) -> np.ndarray:
    """Hot spot position at times t_s, visiting farm centres in a random cycle: in each leg it stays
    at a farm for the first half (the herd gathers in a few cells), then walks to the next farm."""
    order = rng.permutation(len(farms))
    stops = np.array([farms[i].center_m for i in order] + [farms[order[0]].center_m])
    leg = np.floor(t_s / leg_s).astype(int) % len(farms)
    frac = np.clip(2 * (t_s % leg_s) / leg_s - 1, 0, 1)
    return stops[leg] + frac[:, None] * (stops[leg + 1] - stops[leg])


def _walk(cfg: SimConfig, farms: list[Farm], dev_herd: np.ndarray, steps: int,
          rng: np.random.Generator) -> np.ndarray:
    """True positions (steps, D, 2) in metres: one numpy step for all devices at a time."""
    D, F, Hf, dt = len(dev_herd), len(farms), cfg.herds_per_farm, cfg.report_interval_s
    ext = np.array([farms[f].extent_m for f in range(F)])                  # (F, 4)
    herd_farm = np.repeat(np.arange(F), Hf)
    # herds roam a little beyond the fenced area (lanes, yard): some reports are outside every fence
    margin = 0.15 * (ext[:, 2:] - ext[:, :2])
    lo, hi = (ext[:, :2] - margin)[herd_farm], (ext[:, 2:] + margin)[herd_farm]
    herd_c = lo + rng.uniform(0.2, 0.8, (F * Hf, 2)) * (hi - lo)            # herd centres (H, 2)
    herd_phase = rng.uniform(0, cfg.water_period_s, F * Hf)
    herd_heading = rng.uniform(0, 2 * math.pi, F * Hf)
    # water points of all farms in one padded (F, W, 2) table, so targets are one fancy-index per step
    water_count = np.array([len(f.water_m) for f in farms])
    water_table = np.zeros((F, water_count.max(), 2))
    for f, farm in enumerate(farms):
        water_table[f, : water_count[f]] = farm.water_m
    pos = herd_c[dev_herd] + rng.normal(0, 40, (D, 2))
    heading = rng.uniform(0, 2 * math.pi, D)
    graze = rng.lognormal(math.log(0.06), 0.5, D)                           # m/s, per animal
    gather = rng.random(D) < cfg.skew
    gather_off = rng.normal(0, cfg.hotspot_radius_m / 2, (D, 2))
    t_s = np.arange(steps) * dt
    hot = _hotspot_path(farms, rng, t_s, cfg.hotspot_leg_s) if cfg.skew > 0 else None
    max_step = 1.2 * dt                                                      # walking, 1.2 m/s

    xy = np.empty((steps, D, 2))
    for s in range(steps):
        # herd centres wander slowly and are pulled back inside their farm
        herd_heading += rng.normal(0, 0.3, len(herd_c))
        herd_c += 0.05 * dt * np.column_stack([np.cos(herd_heading), np.sin(herd_heading)])
        herd_c += 0.2 * (np.clip(herd_c, lo, hi) - herd_c)
        cycle = (t_s[s] + herd_phase) / cfg.water_period_s
        thirsty = (cycle % 1.0) < 0.15
        w_idx = np.floor(cycle).astype(int)
        herd_water = water_table[herd_farm, w_idx % water_count[herd_farm]]
        # correlated random walk: heading persists with small turns; drift toward herd and water
        heading += rng.normal(0, 0.6, D)
        step_len = graze * dt * rng.lognormal(0, 0.4, D)
        move = step_len[:, None] * np.column_stack([np.cos(heading), np.sin(heading)])
        move += 0.03 * (herd_c[dev_herd] - pos)
        to_water = herd_water[dev_herd] - pos
        move += np.where(thirsty[dev_herd][:, None], 0.25 * to_water, 0.0)
        if hot is not None:
            to_hot = hot[s] + gather_off - pos
            move = np.where(gather[:, None], 0.5 * to_hot + 0.2 * move, move)
        norm = np.hypot(move[:, 0], move[:, 1])
        cap = np.where(gather, cfg.gather_speed_mps * dt, max_step) if hot is not None else max_step
        move *= np.minimum(1.0, cap / np.maximum(norm, 1e-9))[:, None]
        pos = pos + move
        heading = np.where(norm > 1e-6, np.arctan2(move[:, 1], move[:, 0]), heading)
        xy[s] = pos

    return xy


ESCAPE_M = (300.0, 600.0)      # how far an animal strays while its collar is out of coverage


def late_uploads(reports: pd.DataFrame, fraction: float, block: tuple[int, int],
                 rng: np.random.Generator, escape: float = 0.0,
                 escape_rng: np.random.Generator | None = None) -> pd.DataFrame:
    """Rows reordered into arrival order when about `fraction` of the fixes were buffered by their
    collar (blocks of `block` consecutive fixes of a device, out of coverage) and uploaded right after
    the device's next fix, which arrives first: those fixes reach the job late. `escape`: the share of
    blocks during which the animal was away (ESCAPE_M off, one way; out of its paddock, or into a
    neighbour's) and is back when the collar is in coverage again: the return is seen live, before
    the buffer (drawn from `escape_rng`, so the blocks are the same whatever `escape`). `reports` is
    sorted by ts; the result is sorted by arrival (rows keep their ts)."""
    if not len(reports):
        return reports
    if escape > 0:
        reports = reports.copy()
        lat_col, lon_col = reports["lat"].to_numpy(float).copy(), reports["lon"].to_numpy(float).copy()
    dev = reports["device_id"].to_numpy()
    by_device = pd.Series(np.arange(len(reports))).groupby(dev, sort=False).indices
    arrival = reports["ts"].to_numpy(np.int64).astype(np.float64)
    mean_block = (block[0] + block[1]) / 2
    for rows in by_device.values():                   # rows of one device, in ts order
        n = len(rows)
        starts = np.flatnonzero(rng.random(n) < fraction / mean_block)
        for s in starts.tolist():
            e = min(n - 1, s + int(rng.integers(block[0], block[1] + 1)))   # rows[e]: back in coverage
            if e <= s:
                continue
            # the block arrives just after the fix that ends it, in its own order
            arrival[rows[s:e]] = arrival[rows[e]] + 0.001 * (1 + np.arange(e - s)) / (e - s + 1)
            if escape > 0 and escape_rng.random() < escape:
                far, heading = escape_rng.uniform(*ESCAPE_M), escape_rng.uniform(0, 2 * math.pi)
                here = rows[s:e]
                lat_col[here] = np.round(lat_col[here] + far * math.sin(heading) / M_PER_DEG_LAT, COORD_DECIMALS)
                lon_col[here] = np.round(lon_col[here] + far * math.cos(heading) / (
                    M_PER_DEG_LON_EQ * np.cos(np.radians(lat_col[here]))), COORD_DECIMALS)
    if escape > 0:
        reports["lat"], reports["lon"] = lat_col, lon_col
    order = np.argsort(arrival, kind="stable")
    return reports.iloc[order].reset_index(drop=True)


def simulate(cfg: SimConfig = SimConfig()) -> Simulation:
    fence_ss, herd_ss = np.random.SeedSequence(cfg.seed).spawn(2)
    farms, fences = make_farms_and_fences(cfg, np.random.default_rng(fence_ss))
    rng = np.random.default_rng(herd_ss)
    D, F, Hf = cfg.devices, len(farms), cfg.herds_per_farm
    steps = _steps_for(cfg)
    dt = cfg.report_interval_s

    # devices: contiguous blocks per farm, then per herd
    dev_farm = np.repeat(np.arange(F), _split(D, F))
    dev_herd = np.empty(D, dtype=int)                                       # global herd index f*Hf + k
    for f in range(F):
        idx = np.flatnonzero(dev_farm == f)
        dev_herd[idx] = f * Hf + np.repeat(np.arange(Hf), _split(len(idx), Hf))
    device_ids = np.array([f"cow-{i:06d}" for i in range(D)], dtype=object)

    xy = _walk(cfg, farms, dev_herd, steps, rng)                            # (steps, D, 2) metres

    # what the collar reports: GPS noise on every fix, plus rare single multipath strays
    noisy = xy + rng.normal(0, cfg.gps_sigma_m, xy.shape)
    stray = rng.random((steps, D)) < cfg.stray_prob
    ang = rng.uniform(0, 2 * math.pi, (steps, D))
    dist = rng.uniform(15, 60, (steps, D)) * stray
    noisy[..., 0] += dist * np.cos(ang)
    noisy[..., 1] += dist * np.sin(ang)

    # timestamps: a per-device phase plus per-report jitter, strictly increasing per device
    interval_ms = int(round(dt * 1000))
    phase = rng.integers(0, max(1, int(interval_ms * 0.8)), D)
    jitter = rng.integers(0, max(1, int(interval_ms * cfg.interval_jitter)), (steps, D))
    ts = cfg.start_ms + np.arange(steps)[:, None] * interval_ms + phase[None, :] + jitter

    # battery drains; silent devices die at a random step and stop reporting
    silent = rng.random(D) < cfg.silent_fraction
    death = np.where(silent, rng.integers(max(1, int(0.2 * steps)), max(2, int(0.9 * steps)), D), steps)
    b0 = rng.uniform(60, 100, D)
    drain = np.where(silent, b0 / np.maximum(death, 1), rng.uniform(0.001, 0.01, D) * dt / 60)
    battery = np.clip(b0[None, :] - drain[None, :] * np.arange(1, steps + 1)[:, None], 0, 100).round(1)

    alive = np.arange(steps)[:, None] < death[None, :]
    dev_idx = np.broadcast_to(np.arange(D), (steps, D))[alive]
    ts_f = ts[alive]
    order = np.argsort(ts_f, kind="stable")
    if cfg.points is not None:
        order = order[: cfg.points]
    plane = _Plane(*cfg.center)
    lon, lat = plane.to_lonlat(noisy[..., 0][alive][order], noisy[..., 1][alive][order])
    reports = pd.DataFrame({
        "device_id": device_ids[dev_idx[order]],
        "ts": ts_f[order].astype(np.int64),
        "lat": lat,
        "lon": lon,
        "battery": battery[alive][order],
    })
    if cfg.late_fraction > 0:
        reports = late_uploads(reports, cfg.late_fraction, cfg.late_block, np.random.default_rng([cfg.seed, 21]),
                               cfg.late_escape, np.random.default_rng([cfg.seed, 22]))
    herd_names = [f"{farms[h // Hf].farm_id}-{HERD_NAMES[(h % Hf) % len(HERD_NAMES)]}" for h in range(F * Hf)]
    return Simulation(
        config=cfg, farms=farms, fences=fences, device_ids=device_ids,
        device_farm={d: farms[f].farm_id for d, f in zip(device_ids, dev_farm)},
        device_herd={d: herd_names[h] for d, h in zip(device_ids, dev_herd)},
        reports=reports, silent_devices=device_ids[silent].tolist())

