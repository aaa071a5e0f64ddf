"""Fence geometry: strict GeoJSON parsing, and the H3 cover that lets most points skip the polygon test.

Semantics (shared with fencing/model/membership.py): a fence is a shapely polygon in planar (lon, lat)
degrees, and a point is inside when the polygon *intersects* it (boundary counts as inside).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import pandas as pd
import shapely
from h3ronpy import ContainmentMode
from h3ronpy.vector import cells_to_wkb_polygons, geometry_to_cells
from shapely.geometry import MultiPolygon, Polygon

from fencing.model.h3util import cells_for_points, cells_to_strs, parent
from fencing.model.keys import FENCE_RES, GROUP_RES

MAX_VERTICES = 10_000
MAX_AREA_KM2 = 2_500.0
_EARTH_AUTHALIC_KM = 6371.0072  # radius of the sphere with the WGS84 ellipsoid's area


class FenceError(ValueError):
    """A fence geometry that cannot be accepted; str(e) is a reason fit for an API's 422 `detail`."""


Fence = Polygon | MultiPolygon


# ---------------------------------------------------------------------------------------------
# parsing


def parse_fence_geometry(geometry: dict) -> Fence:
    """GeoJSON Polygon/MultiPolygon ([lon, lat], holes allowed) -> valid shapely geometry, or
    FenceError naming the first problem found."""
    if not isinstance(geometry, dict):
        raise FenceError("geometry must be a GeoJSON object")
    gtype = geometry.get("type")
    if gtype not in ("Polygon", "MultiPolygon"):
        raise FenceError(f"geometry type must be Polygon or MultiPolygon, got {gtype!r}")
    coords = geometry.get("coordinates")
    if gtype == "Polygon":
        polys = [_parse_polygon(coords, "coordinates")]
    else:
        _require_list(coords, "coordinates", "a list of polygons")
        if not coords:
            raise FenceError("coordinates: a MultiPolygon needs at least one polygon")
        polys = [_parse_polygon(p, f"coordinates[{i}]") for i, p in enumerate(coords)]

    nverts = sum(len(ring) for rings in polys for ring in rings)
    if nverts > MAX_VERTICES:
        raise FenceError(f"too many vertices: {nverts} > {MAX_VERTICES}")
    lons = [pt[0] for rings in polys for pt in rings[0]]
    if max(lons) - min(lons) > 180.0:
        raise FenceError("the fence crosses the antimeridian; split it into two polygons at ±180")

    shapes = [Polygon(rings[0], rings[1:]) for rings in polys]
    geom: Fence = shapes[0] if gtype == "Polygon" else MultiPolygon(shapes)
    reason = shapely.is_valid_reason(geom)
    if reason != "Valid Geometry":
        raise FenceError(_explain_invalid(reason, gtype))
    area = area_km2(geom)
    if area > MAX_AREA_KM2:
        raise FenceError(f"fence too large: {area:.0f} km² > {MAX_AREA_KM2:.0f} km²")
    return geom


def _require_list(value, where: str, what: str) -> None:
    if not isinstance(value, (list, tuple)):
        raise FenceError(f"{where}: expected {what}, got {type(value).__name__}")


def _parse_polygon(rings, where: str) -> list[list[tuple[float, float]]]:
    _require_list(rings, where, "a list of linear rings")
    if not rings:
        raise FenceError(f"{where}: a polygon needs an exterior ring")
    return [_parse_ring(r, f"{where}[{i}]") for i, r in enumerate(rings)]


def _parse_ring(ring, where: str) -> list[tuple[float, float]]:
    _require_list(ring, where, "a list of [lon, lat] positions")
    pts = [_parse_position(p, f"{where}[{i}]") for i, p in enumerate(ring)]
    if len(pts) < 4:
        raise FenceError(f"{where}: a linear ring needs at least 4 positions, got {len(pts)}")
    if pts[0] != pts[-1]:
        raise FenceError(f"{where}: ring is not closed (first position {list(pts[0])} != last {list(pts[-1])})")
    return pts


def _parse_position(pos, where: str) -> tuple[float, float]:
    _require_list(pos, where, "a [lon, lat] position")
    if len(pos) not in (2, 3):  # a third value (altitude) is legal GeoJSON and ignored
        raise FenceError(f"{where}: a position has 2 or 3 numbers, got {len(pos)}")
    # bool is an int subclass in Python; true/false in JSON are not coordinates
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in pos):
        raise FenceError(f"{where}: coordinates must be numbers, got {pos!r}")
    try:
        lon, lat = float(pos[0]), float(pos[1])
    except OverflowError:      # an integer literal with hundreds of digits
        raise FenceError(f"{where}: coordinates out of range, got a number too large for a float") from None
    if not (math.isfinite(lon) and math.isfinite(lat)):
        raise FenceError(f"{where}: coordinates must be finite, got {pos!r}")
    if not -180.0 <= lon <= 180.0:
        raise FenceError(f"{where}: longitude {lon} out of range [-180, 180] (positions are [lon, lat])")
    if not -90.0 <= lat <= 90.0:
        raise FenceError(f"{where}: latitude {lat} out of range [-90, 90] (positions are [lon, lat])")
    return lon, lat


def _explain_invalid(reason: str, gtype: str) -> str:
    """GEOS' terse reasons ("Self-intersection[1 0]") -> a sentence a farmer's UI can show."""
    kind, _, where = reason.partition("[")
    at = f" near [{where.rstrip(']').replace(' ', ', ')}]" if where else ""
    texts = {
        "Self-intersection": "the polygon has a self-intersection (edges cross or touch)"
        + (", or its parts overlap" if gtype == "MultiPolygon" else ""),
        "Ring Self-intersection": "a ring has a self-intersection (it touches itself)",
        "Hole lies outside shell": "a hole lies outside its polygon's exterior ring",
        "Holes are nested": "a hole lies inside another hole",
        "Interior is disconnected": "the holes cut the polygon into pieces",
        "Nested shells": "one polygon of the MultiPolygon lies inside another",
        "Duplicate Rings": "the geometry repeats a ring",
        "Too few points": "a ring has too few distinct points (zero area)",
    }
    return f"invalid geometry: {texts.get(kind, kind.lower())}{at}"


def area_km2(geom: Fence) -> float:
    """Area on the sphere of the polygon, via a sinusoidal projection centred on it (equal-area, so
    exact up to the curvature of edges, which segmentizing to 0.01° makes negligible at fence sizes)."""
    lon0 = (geom.bounds[0] + geom.bounds[2]) / 2.0
    rad = math.pi / 180.0

    def sinusoidal(xy: np.ndarray) -> np.ndarray:
        lat = xy[:, 1] * rad
        return np.column_stack(((xy[:, 0] - lon0) * rad * np.cos(lat), lat)) * _EARTH_AUTHALIC_KM

    return float(shapely.transform(shapely.segmentize(geom, 0.01), sinusoidal).area)


# ---------------------------------------------------------------------------------------------
# cover


@dataclass(frozen=True)
class FenceCover:
    """H3 cells of one fence at one resolution.

    interior: cells whose whole hexagon is inside the fence: their points match without a test.
    boundary: other cells that touch the fence: their points get the exact polygon test.
    Every point the fence covers lies in exactly one of them (`cover` is complete)."""

    res: int
    interior: np.ndarray  # uint64, sorted
    boundary: np.ndarray  # uint64, sorted

    @property
    def cells(self) -> np.ndarray:
        return np.concatenate([self.interior, self.boundary])


def _margin_deg(res: int) -> float:
    """Safety margin (degrees) between H3's cells and their straight-edged (lon, lat) polygons.

    Why: H3 cell edges are great-circle arcs and latlng_to_cell is floating point, while shapely
    tests against straight edges in (lon, lat). At res 9 (edges ~0.2 km) the arc strays < 1e-8°
    from the chord at 60° latitude; 1e-6° (~0.1 m) leaves 100x. The stray grows with edge length
    squared, i.e. 7x per coarser resolution."""
    return 1e-6 * 7.0 ** max(0, 9 - res)


def cover(geom: Fence, res: int = FENCE_RES) -> FenceCover:
    """Complete H3 cover of `geom` at `res`, split into interior and boundary cells.

    Candidates come from an "overlap" polyfill of the fence grown by the margin, plus the cell of
    every vertex (catches fences smaller than a cell, whatever polyfill does with them). Each
    candidate is then classified by shapely against its hexagon grown by the margin, so the split
    never depends on h3's own containment arithmetic:
      interior  <=> the fence covers the grown hexagon (so every point H3 puts in the cell is inside)
      boundary  <=> the grown hexagon intersects the fence but is not covered
      dropped   otherwise (e.g. wholly inside a hole, or an overshoot of the polyfill)."""
    eps = _margin_deg(res)
    candidates = _candidate_cells(geom, res, eps)
    hexes = shapely.from_wkb(np.asarray(cells_to_wkb_polygons(candidates).to_pylist(), dtype=object))
    grown = shapely.buffer(hexes, eps, quad_segs=1, join_style="mitre")
    bounds = shapely.bounds(hexes)
    # hexagons straddling ±180 come back unwrapped (spanning the globe): never call them interior
    straddles = (bounds[:, 2] - bounds[:, 0]) > 180.0
    shapely.prepare(geom)
    inside = shapely.covers(geom, grown) & ~straddles
    touches = straddles | shapely.intersects(geom, grown)
    return FenceCover(res=res, interior=np.sort(candidates[inside]),
                      boundary=np.sort(candidates[touches & ~inside]))


def _candidate_cells(geom: Fence, res: int, eps: float) -> np.ndarray:
    # h3ronpy's Covers mode gave the same cells as h3.h3shape_to_cells_experimental(contain='overlap')
    # on 2,000 paddocks and a 1,700 km² square, 2.7x faster (h3-py spends its time in Python)
    grown = geom.buffer(eps, quad_segs=1, join_style="mitre")
    cells = np.asarray(geometry_to_cells(grown, res, ContainmentMode.Covers), dtype=np.uint64)
    xy = shapely.get_coordinates(geom)
    return np.unique(np.concatenate([cells, cells_for_points(xy[:, 1], xy[:, 0], res)]))


def groups_of(cells: np.ndarray) -> np.ndarray:
    """Cell group (parent at GROUP_RES) of each cell: the unit of routing and of Redis slots."""
    return parent(cells, GROUP_RES)


def group_names(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct groups of `cells` by name (object array) and each cell's index into them: one
    string per group, not one per cell. Groups in order of first appearance (a hash table: ~3x
    faster than np.unique's sort at a batch's 100k+ cells)."""
    code, distinct = pd.factorize(groups_of(cells))
    return np.array(cells_to_strs(distinct), dtype=object), code.astype(np.int64, copy=False)
