"""Ground geometry of sparse fixes, vectorized with shapely 2: distances to a fence's boundary in
metres (APPROACH) and the stretches of a straight segment between two fixes that lie inside a fence
(inferred crossings), plus the rule that turns those stretches into implied ENTER/EXIT.

Metres: each distance is measured on a local equirectangular plane centred on the point (or on the
segment's middle): exact to well under 1% at farm scale, and far cheaper than a geodesic. A segment
is straight in lon/lat, which at these distances is the same line as on the ground.

Noise rule (docs/events.md): only segments at least MIN_SEGMENT_M (30 m) long imply
anything, and a stretch inside a fence that both fixes are outside of (or outside a fence both are
inside) counts only when it is at least `min_stretch_m` long: max(MIN_STRETCH_M (10 m), 2 x the larger
`accuracy_m` of its two fixes). GPS jitter of a few metres near an edge then never makes a crossing,
and a collar that says its fix is poor needs a longer stretch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import shapely

M_PER_DEG_LAT = 110_574.0
M_PER_DEG_LON_EQ = 111_320.0
MIN_STRETCH_M = 10.0        # the shortest stretch that can count whatever the accuracy
# the shortest segment that implies anything: below it the fixes themselves (debounced) tell where the
# animal was, and its path between two close fixes is anything but straight (grazing, not walking)
MIN_SEGMENT_M = 30.0
ACCURACY_FACTOR = 2.0       # accuracy_m is about one sigma; two of them cover ~95% of fixes


def min_stretch_m(acc0: float | None, acc1: float | None) -> float:
    """The shortest stretch inside (or outside) a fence that counts for a segment between two fixes."""
    worst = max((a for a in (acc0, acc1) if a is not None and a == a), default=0.0)
    return max(MIN_STRETCH_M, ACCURACY_FACTOR * worst)


def segment_length_m(lon0, lat0, lon1, lat1) -> np.ndarray:
    """Length in metres of straight segments (arrays), on the plane at their middle latitude."""
    mid = np.radians((np.asarray(lat0, np.float64) + np.asarray(lat1, np.float64)) / 2.0)
    dx = (np.asarray(lon1, np.float64) - lon0) * M_PER_DEG_LON_EQ * np.cos(mid)
    dy = (np.asarray(lat1, np.float64) - lat0) * M_PER_DEG_LAT
    return np.hypot(dx, dy)


def convex_polygons(geoms: np.ndarray) -> np.ndarray:
    """Per geometry: a Polygon without holes equal to its convex hull (a segment between two of its
    points stays inside it). Areas compared to 1e-9: a paddock's rectangle is, a notched one is not."""
    geoms = np.asarray(geoms, dtype=object)
    if not len(geoms):
        return np.empty(0, bool)
    polygon = shapely.get_type_id(geoms) == int(shapely.GeometryType.POLYGON)
    out = np.zeros(len(geoms), bool)
    k = np.flatnonzero(polygon)
    k = k[shapely.get_num_interior_rings(geoms[k]) == 0]
    area = shapely.area(geoms[k])
    out[k] = shapely.area(shapely.convex_hull(geoms[k])) <= area * (1 + 1e-9)
    return out


def boundary_distance_m(geoms: np.ndarray, lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Distance in metres from each point to the boundary of its geometry (pairs, equal length):
    every ring counts, holes too. The boundary is moved to the plane centred on its point."""
    n = len(geoms)
    if n == 0:
        return np.empty(0)
    rings = shapely.boundary(np.asarray(geoms, dtype=object))
    xy, which = shapely.get_coordinates(rings, return_index=True)
    lon = np.asarray(lon, np.float64)
    lat = np.asarray(lat, np.float64)
    sx = M_PER_DEG_LON_EQ * np.cos(np.radians(lat))
    local = np.column_stack([(xy[:, 0] - lon[which]) * sx[which], (xy[:, 1] - lat[which]) * M_PER_DEG_LAT])
    moved = shapely.set_coordinates(shapely.transform(rings, lambda c: c), local)   # a copy, then moved
    return shapely.distance(moved, shapely.points(np.zeros(n), np.zeros(n)))


def inside_stretches(geoms: np.ndarray, segs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For pairs (geometry, two-point LineString): the stretches of the segment inside the geometry
    (boundary counts), as fractions [lo, hi] of the way from its first to its second point, merged
    where they touch, sorted. Returns (pair index, lo, hi); one intersection call for all pairs."""
    n = len(geoms)
    if n == 0:
        return np.empty(0, np.int64), np.empty(0), np.empty(0)
    cut = shapely.intersection(np.asarray(geoms, dtype=object), segs)
    parts, pair = shapely.get_parts(cut, return_index=True)
    lines = (shapely.get_type_id(parts) == int(shapely.GeometryType.LINESTRING)) & ~shapely.is_empty(parts)
    parts, pair = parts[lines], pair[lines]
    if not len(parts):
        return np.empty(0, np.int64), np.empty(0), np.empty(0)
    a = shapely.line_locate_point(segs[pair], shapely.get_point(parts, 0), normalized=True)
    b = shapely.line_locate_point(segs[pair], shapely.get_point(parts, -1), normalized=True)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    order = np.lexsort((lo, pair))
    pair, lo, hi = pair[order], lo[order], hi[order]
    # merge touching stretches of the same pair: a new run starts where a stretch begins after the
    # furthest end reached so far in its pair
    # furthest end reached so far in its pair (fractions are in [0, 1]: 2 x pair keeps pairs apart)
    reach = np.maximum.accumulate(hi + 2.0 * pair) - 2.0 * pair
    new = np.r_[True, (pair[1:] != pair[:-1]) | (lo[1:] > reach[:-1])]
    first = np.flatnonzero(new)
    return pair[first], lo[first], np.maximum.reduceat(hi, first)


@dataclass(frozen=True)
class Segment:
    """The straight segment from a device's previous processed fix to this one, with the fences it
    meets that neither or both of its ends are inside: (fence uid, inside stretches as fractions)."""
    t0: int
    t1: int
    length_m: float
    min_m: float
    fences: tuple[tuple[str, tuple[tuple[float, float], ...]], ...]

    def at(self, fraction: float) -> int:
        """Report time interpolated along the segment (ms)."""
        return int(self.t0 + math.floor(fraction * (self.t1 - self.t0) + 0.5))


def implied(segment: Segment, stretches: tuple[tuple[float, float], ...], both_inside: bool
            ) -> list[tuple[str, int]]:
    """The implied (kind, ts) events of one fence on one segment. Both ends outside: each stretch
    inside that touches neither end and is long enough → enter, exit. Both ends inside: each gap
    between stretches that is long enough → exit, enter."""
    out: list[tuple[str, int]] = []
    if both_inside:
        for (_, gap_lo), (gap_hi, _) in zip(stretches, stretches[1:]):
            if (gap_hi - gap_lo) * segment.length_m >= segment.min_m:
                out += [("exit", segment.at(gap_lo)), ("enter", segment.at(gap_hi))]
    else:
        for lo, hi in stretches:
            if lo > 0.0 and hi < 1.0 and (hi - lo) * segment.length_m >= segment.min_m:
                out += [("enter", segment.at(lo)), ("exit", segment.at(hi))]
    return out
