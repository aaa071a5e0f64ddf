"""Fence parsing (reasons for every rejection) and the completeness of the H3 cover."""
from __future__ import annotations

import h3
from h3.api import basic_int as h3i
import numpy as np
import pytest
import shapely

from fencing.model import h3util
from fencing.model.geometry import MAX_VERTICES, FenceError, area_km2, cover, groups_of, parse_fence_geometry
from fencing.model.keys import FENCE_RES, GROUP_RES


def poly(*rings) -> dict:
    return {"type": "Polygon", "coordinates": [list(map(list, r)) for r in rings]}


SQUARE = [(7.0, 45.0), (7.01, 45.0), (7.01, 45.01), (7.0, 45.01), (7.0, 45.0)]


def rejects(geometry, *words: str) -> str:
    with pytest.raises(FenceError) as e:
        parse_fence_geometry(geometry)
    msg = str(e.value)
    for w in words:
        assert w in msg, msg
    return msg


# --- parsing ------------------------------------------------------------------------------------


def test_accepts_polygon_with_hole_and_multipolygon():
    hole = [(7.003, 45.003), (7.006, 45.003), (7.006, 45.006), (7.003, 45.006), (7.003, 45.003)]
    g = parse_fence_geometry(poly(SQUARE, hole))
    assert len(g.interiors) == 1
    other = [(x + 0.02, y) for x, y in SQUARE]
    m = parse_fence_geometry({"type": "MultiPolygon", "coordinates": [[SQUARE], [other]]})
    assert m.geom_type == "MultiPolygon" and len(m.geoms) == 2


def test_accepts_altitude_and_ints():
    g = parse_fence_geometry(poly([(7, 45, 300), (8, 45, 300), (8, 45.1, 0), (7, 45, 300)]))
    assert not g.has_z


def test_bowtie_rejected_as_self_intersection():
    rejects(poly([(7, 45), (7.01, 45.01), (7.01, 45), (7, 45.01), (7, 45)]), "self-intersection")


def test_unclosed_ring_rejected():
    rejects(poly(SQUARE[:-1] + [(7.0, 45.005)]), "not closed")


def test_too_few_positions_rejected():
    rejects(poly([(7, 45), (7.01, 45), (7, 45)]), "at least 4 positions")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_rejected(bad):
    rejects(poly([(7, 45), (bad, 45), (7.01, 45.01), (7, 45)]), "finite")


@pytest.mark.parametrize("bad", ["7", None, True, [7]])
def test_non_numeric_rejected(bad):
    rejects(poly([(7, 45), (bad, 45), (7.01, 45.01), (7, 45)]), "numbers")


def test_out_of_range_rejected():
    rejects(poly([(7, 45), (181, 45), (7.01, 45.01), (7, 45)]), "longitude")
    rejects(poly([(45, 7), (45, 95), (45.01, 7.01), (45, 7)]), "latitude")


def test_antimeridian_rejected():
    rejects(poly([(179.9, 10), (-179.9, 10), (-179.9, 10.1), (179.9, 10.1), (179.9, 10)]),
            "antimeridian", "±180")


@pytest.mark.parametrize("geometry, words", [
    ({"type": "Point", "coordinates": [7, 45]}, ["Polygon or MultiPolygon"]),
    ("POLYGON((0 0))", ["GeoJSON object"]),
    ({"type": "Polygon"}, ["list of linear rings"]),
    ({"type": "Polygon", "coordinates": []}, ["exterior ring"]),
    ({"type": "Polygon", "coordinates": [7, 45]}, ["list of [lon, lat] positions"]),
    ({"type": "Polygon", "coordinates": [[[[7, 45]]]]}, ["numbers"]),
    ({"type": "MultiPolygon", "coordinates": []}, ["at least one polygon"]),
    ({"type": "MultiPolygon", "coordinates": [SQUARE]}, ["expected a [lon, lat] position"]),
])
def test_bad_structure_rejected(geometry, words):
    rejects(geometry, *words)


def test_hole_outside_shell_rejected():
    out = [(8, 46), (8.01, 46), (8.01, 46.01), (8, 46)]
    rejects(poly(SQUARE, out), "hole lies outside")


def test_overlapping_multipolygon_parts_rejected():
    shifted = [(x + 0.005, y) for x, y in SQUARE]
    rejects({"type": "MultiPolygon", "coordinates": [[SQUARE], [shifted]]}, "overlap")


def test_too_many_vertices_rejected():
    n = MAX_VERTICES + 1
    ang = np.linspace(0, 2 * np.pi, n, endpoint=False)
    ring = [(7 + 0.01 * np.cos(a), 45 + 0.01 * np.sin(a)) for a in ang]
    rejects(poly(ring + [ring[0]]), "too many vertices")


def test_area_limit():
    # 0.5° x 0.4° at 45°N is ~1740 km²: accepted; 1° x 1° (~8,700 km²) is not
    ok = parse_fence_geometry(poly([(7, 45), (7.5, 45), (7.5, 45.4), (7, 45.4), (7, 45)]))
    assert 1700 < area_km2(ok) < 1780
    rejects(poly([(7, 45), (8, 45), (8, 46), (7, 46), (7, 45)]), "too large")


def test_area_matches_h3_cells():
    # independent check of the equal-area approximation: a polygon made of H3 cells
    cells = h3.grid_disk(h3.latlng_to_cell(52.0, 5.0, 7), 3)
    shape = h3.cells_to_h3shape(cells)
    expected = sum(h3.cell_area(c, "km^2") for c in cells)
    geom = shapely.geometry.shape(shape.__geo_interface__)
    assert area_km2(geom) == pytest.approx(expected, rel=2e-3)


# --- cover --------------------------------------------------------------------------------------


def random_points_near(geom, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Uniform points over the bbox grown by ~2 cells, plus points on/near the fence's edges, where
    a cover would most likely be incomplete."""
    x0, y0, x1, y1 = geom.bounds
    pad = 0.005
    lon = rng.uniform(x0 - pad, x1 + pad, n // 2)
    lat = rng.uniform(y0 - pad, y1 + pad, n // 2)
    edge = shapely.line_interpolate_point(geom.boundary if geom.geom_type == "Polygon"
                                          else shapely.MultiLineString([g.exterior for g in geom.geoms]),
                                          rng.uniform(0, 1, n - n // 2), normalized=True)
    xy = shapely.get_coordinates(edge) + rng.normal(0, 1e-5, (n - n // 2, 2)) * rng.choice([0, 1, 10], (n - n // 2, 1))
    return np.r_[lon, xy[:, 0]], np.r_[lat, xy[:, 1]]


TEST_FENCES = {
    "square": poly(SQUARE),
    # ~2.4 km long, 1-2 m wide: far narrower than a res-9 cell, crosses many cells' edges
    "sliver": poly([(7.0, 45.0), (7.03, 45.0003), (7.03, 45.00031), (7.0, 45.00002), (7.0, 45.0)]),
    "tiny": poly([(7.1, 45.1), (7.1001, 45.1), (7.1001, 45.1001), (7.1, 45.1)]),
    "holed": poly([(7.2, 45.2), (7.23, 45.2), (7.23, 45.23), (7.2, 45.23), (7.2, 45.2)],
                  [(7.205, 45.205), (7.225, 45.205), (7.225, 45.225), (7.205, 45.225), (7.205, 45.205)]),
    "arctic": poly([(20.0, 69.0), (20.05, 69.02), (20.01, 69.04), (20.0, 69.0)]),
}


@pytest.mark.parametrize("name", sorted(TEST_FENCES))
def test_cover_is_complete_and_interior_is_inside(name):
    geom = parse_fence_geometry(TEST_FENCES[name])
    c = cover(geom)
    assert c.res == FENCE_RES and not np.intersect1d(c.interior, c.boundary).size
    lon, lat = random_points_near(geom, 50_000, np.random.default_rng(1))
    # and points within 1e-9° of the corners of every cell around the fence: where H3 may assign a
    # point to the neighbouring cell
    ring = {h3i.grid_disk(int(x), 1)[k] for x in c.cells for k in range(7)}
    corners = np.array([v for x in ring for v in h3i.cell_to_boundary(x)])  # (lat, lng)
    corners = np.repeat(corners, 4, axis=0) + np.random.default_rng(2).normal(0, 1e-9, (len(corners) * 4, 2))
    lon, lat = np.r_[lon, corners[:, 1]], np.r_[lat, corners[:, 0]]
    cells = h3util.cells_for_points(lat, lon, FENCE_RES)
    inside = shapely.intersects_xy(geom, lon, lat)
    assert inside.sum() > 100
    assert np.isin(cells[inside], c.cells).all(), "a covered point lies in no cover cell"
    in_interior = np.isin(cells, c.interior)
    assert inside[in_interior].all(), "a point in an interior cell is outside the fence"


def test_hole_cells_excluded():
    geom = parse_fence_geometry(TEST_FENCES["holed"])
    c = cover(geom)
    centre = h3util.cells_for_points(np.array([45.215]), np.array([7.215]), FENCE_RES)[0]
    assert centre not in c.cells
    assert len(c.interior) > 0


def test_cover_of_polygon_inside_one_cell():
    c = cover(parse_fence_geometry(TEST_FENCES["tiny"]))
    assert len(c.interior) == 0 and 1 <= len(c.boundary) <= 3


def test_groups_of_matches_h3():
    c = cover(parse_fence_geometry(TEST_FENCES["holed"]))
    groups = groups_of(c.cells)
    assert groups.dtype == np.uint64
    assert [int(g) for g in groups] == [h3i.cell_to_parent(int(x), GROUP_RES) for x in c.cells]


def test_h3util_helpers():
    rng = np.random.default_rng(2)
    lat, lon = rng.uniform(-80, 80, 2000), rng.uniform(-180, 180, 2000)
    cells = h3util.cells_for_points(lat, lon, 9)
    assert [int(x) for x in cells] == [h3.str_to_int(h3.latlng_to_cell(a, b, 9)) for a, b in zip(lat, lon)]
    assert [int(x) for x in h3util.parent(cells, 4)] == [h3i.cell_to_parent(int(x), 4) for x in cells]
    bad = h3util.cells_for_points(np.array([np.nan, 91.0, 45.0]), np.array([0.0, 0.0, 200.0]), 9)
    assert (bad == 0).all()
    s = h3util.cell_to_str(cells[0])
    assert h3util.str_to_cell(s) == cells[0] and h3util.cells_to_strs(cells[:2])[0] == s
    with pytest.raises(ValueError):
        h3util.parent(h3util.parent(cells[:1], 3), 5)


def _circle(lon: float, lat: float, radius_km: float, vertices: int) -> dict:
    import math
    ring = [[lon + radius_km / (111.32 * math.cos(math.radians(lat))) * math.cos(2 * math.pi * k / vertices),
             lat + radius_km / 110.57 * math.sin(2 * math.pi * k / vertices)] for k in range(vertices)]
    return {"type": "Polygon", "coordinates": [ring + [ring[0]]]}


def test_a_fence_that_would_cost_too_much_redis_is_refused_naming_the_limit():
    """A ~1,900 km² ranch outlined with 9,000 vertices is stored once per cell group (~60 of them):
    ~9 MiB of Redis for one fence → refused with the limit named; the same ranch with 400 vertices
    is fine. Both the single and the bulk validator say so."""
    from fencing.model.fence_store import MAX_FENCE_REDIS_BYTES, validate_feature, validate_features_bulk
    from fencing.model.geometry import FenceError

    def feature(geometry):
        return {"type": "Feature", "properties": {"name": "ranch"}, "geometry": geometry}
    heavy, light = feature(_circle(10.0, 47.0, 24.5, 9_000)), feature(_circle(10.0, 47.0, 24.5, 400))
    with pytest.raises(FenceError, match="Redis bytes of one fence"):
        validate_feature(heavy)
    ok = validate_feature(light)
    assert len(ok.groups) > 30
    bulk = validate_features_bulk([heavy, light])
    assert isinstance(bulk[0], FenceError) and "MiB" in str(bulk[0]) and not isinstance(bulk[1], Exception)
    assert MAX_FENCE_REDIS_BYTES == 8 << 20
