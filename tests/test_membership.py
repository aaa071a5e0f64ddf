"""FenceIndex.match against shapely ground truth, and the semantics the events rely on."""
from __future__ import annotations

import numpy as np
import pytest
import shapely

from fencing.geometry import cover, parse_fence_geometry
from fencing.h3util import cells_for_points
from fencing.keys import FENCE_RES
from fencing.membership import FenceIndex, contains_exact, vectorized_limit
from tests.test_geometry import TEST_FENCES, poly, random_points_near


def index_of(fences: dict) -> FenceIndex:
    idx = FenceIndex()
    for uid, geometry in fences.items():
        geom = parse_fence_geometry(geometry)
        c = cover(geom)
        idx.upsert(uid, geom, c.interior, c.boundary)
    return idx


def match_set(idx: FenceIndex, lon, lat) -> set[tuple[int, str]]:
    lon, lat = np.asarray(lon, float), np.asarray(lat, float)
    p, f = idx.match(lon, lat, cells_for_points(lat, lon, FENCE_RES))
    assert len(p) == len(f) and (np.diff(p) >= 0).all(), "pairs come in point order"
    return set(zip(p.tolist(), f.tolist()))


SQ = [(7.0, 45.0), (7.01, 45.0), (7.01, 45.01), (7.0, 45.01), (7.0, 45.0)]


def test_hole_excluded_and_ring_included():
    idx = index_of({"holed": TEST_FENCES["holed"]})
    #               in hole          in the ring       outside
    got = match_set(idx, [7.215, 7.202, 7.3], [45.215, 45.202, 45.2])
    assert got == {(1, "holed")}


def test_either_part_of_multipolygon():
    other = [(x + 0.05, y) for x, y in SQ]
    idx = index_of({"m": {"type": "MultiPolygon", "coordinates": [[SQ], [other]]}})
    assert match_set(idx, [7.005, 7.055, 7.03], [45.005, 45.005, 45.005]) == {(0, "m"), (1, "m")}


def test_three_overlapping_fences_three_matches():
    idx = index_of({
        "a": poly(SQ),
        "b": poly([(x + 0.004, y) for x, y in SQ]),
        "c": poly([(x, y + 0.004) for x, y in SQ]),
    })
    assert match_set(idx, [7.006], [45.006]) == {(0, "a"), (0, "b"), (0, "c")}


def test_boundary_point_counts_as_inside():
    idx = index_of({"sq": poly(SQ)})
    # on an edge, on a vertex
    assert match_set(idx, [7.005, 7.01], [45.0, 45.01]) == {(0, "sq"), (1, "sq")}
    assert contains_exact(parse_fence_geometry(poly(SQ)), np.array([7.005]), np.array([45.0])).all()


def test_upsert_replaces_and_remove():
    idx = index_of({"sq": poly(SQ)})
    assert match_set(idx, [7.005], [45.005]) == {(0, "sq")}
    moved = parse_fence_geometry(poly([(x + 1, y) for x, y in SQ]))
    c = cover(moved)
    idx.upsert("sq", moved, c.interior, c.boundary)
    assert len(idx) == 1
    assert match_set(idx, [7.005, 8.005], [45.005, 45.005]) == {(1, "sq")}
    assert idx.remove("sq") and not idx.remove("sq") and len(idx) == 0
    assert match_set(idx, [8.005], [45.005]) == set()


def test_null_cells_and_empty_input():
    idx = index_of({"sq": poly(SQ)})
    p, f = idx.match(np.array([7.005]), np.array([45.005]), np.zeros(1, np.uint64))
    assert len(p) == 0 and len(f) == 0
    p, f = idx.match(np.empty(0), np.empty(0), np.empty(0, np.uint64))
    assert len(p) == 0


def test_rejects_cells_of_another_resolution():
    geom = parse_fence_geometry(poly(SQ))
    with pytest.raises(ValueError, match="resolution"):
        FenceIndex().upsert("x", geom, cover(geom, res=8).interior, cover(geom, res=8).boundary)


def test_match_equals_shapely_ground_truth():
    """50k random points per fence (bbox + near edges) over all test fences (sliver, hole, a cell-sized
    one, high latitude) plus overlapping squares: match() must equal brute-force shapely exactly."""
    fences = dict(TEST_FENCES)
    fences["sq"] = poly(SQ)
    fences["sq2"] = poly([(x + 0.003, y + 0.002) for x, y in SQ])
    geoms = {uid: parse_fence_geometry(g) for uid, g in fences.items()}
    idx = index_of(fences)
    rng = np.random.default_rng(7)
    pts = [random_points_near(g, 50_000, rng) for g in geoms.values()]
    lon, lat = np.concatenate([p[0] for p in pts]), np.concatenate([p[1] for p in pts])
    truth = {(int(i), uid) for uid, g in geoms.items() for i in np.flatnonzero(shapely.intersects_xy(g, lon, lat))}
    assert len(truth) > 50_000
    assert match_set(idx, lon, lat) == truth
    # and the baseline agrees too
    uids = list(geoms)
    p, f = vectorized_limit(list(geoms.values()), lon, lat)
    assert {(int(i), uids[j]) for i, j in zip(p, f)} == truth
