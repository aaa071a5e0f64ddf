"""FenceIndex.match against shapely ground truth, and the semantics the events rely on."""
from __future__ import annotations

import numpy as np
import pytest
import shapely

from fencing.model.geometry import cover, parse_fence_geometry
from fencing.model.h3util import cells_for_points
from fencing.model.keys import FENCE_RES
from fencing.model.membership import FenceIndex, _Rings, contains_exact, vectorized_limit
from tests.unit.test_geometry import TEST_FENCES, poly, random_points_near


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


def _star(rng, cx, cy, r, k, inner=0.0):
    """A random non-convex star polygon (k spikes) around (cx, cy), optionally holed."""
    ang = np.sort(rng.uniform(0, 2 * np.pi, k))
    rad = r * rng.uniform(0.5, 1.0, k)
    shell = np.c_[cx + rad * np.cos(ang), cy + rad * np.sin(ang)].round(7)
    holes = []
    if inner:
        a = np.linspace(0, 2 * np.pi, 7)[:-1]
        holes = [np.c_[cx + inner * r * np.cos(a), cy + inner * r * np.sin(a)].round(7)]
    return shapely.Polygon(shell, holes)


def _random_fences(rng, n: int) -> list:
    """Stars with and without holes, two-part MultiPolygons, circles, and a grid of rectangles that
    share edges and corners exactly; all overlapping each other in a ~3 x 3 km area."""
    out = []
    xs, ys = 7.0 + np.cumsum(rng.uniform(0.003, 0.006, 6)), 45.0 + np.cumsum(rng.uniform(0.003, 0.006, 6))
    out += [shapely.box(xs[i], ys[j], xs[i + 1], ys[j + 1]) for i in range(5) for j in range(5)]
    while len(out) < n:
        cx, cy = rng.uniform(7.0, 7.04), rng.uniform(45.0, 45.04)
        kind = len(out) % 4
        if kind == 0:
            g = _star(rng, cx, cy, rng.uniform(0.001, 0.006), int(rng.integers(5, 40)))
        elif kind == 1:
            g = _star(rng, cx, cy, rng.uniform(0.002, 0.006), int(rng.integers(5, 40)), inner=0.3)
        elif kind == 2:
            r = rng.uniform(0.001, 0.003)
            g = shapely.MultiPolygon([_star(rng, cx, cy, r, 9), _star(rng, cx + 3 * r, cy + r, r, 12, 0.3)])
        else:
            g = shapely.Point(cx, cy).buffer(rng.uniform(0.001, 0.004), quad_segs=8)
        if g.is_valid:                     # as fences are (fencing.model.geometry rejects the rest)
            out.append(g)
    return out


def _points_on_and_near(rng, fences: list, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Uniform points, every vertex exactly, points on edges (interpolated: within rounding of the
    edge, on either side), and points a hair off the edges."""
    xy = shapely.get_coordinates(fences)
    x0, y0 = xy.min(axis=0) - 0.002
    x1, y1 = xy.max(axis=0) + 0.002
    t = rng.uniform(0, 1, n)
    i = rng.integers(0, len(xy) - 1, n)
    on = xy[i] + t[:, None] * (xy[i + 1] - xy[i])
    near = on + rng.normal(0, 1e-9, on.shape)
    lon = np.r_[rng.uniform(x0, x1, n), xy[:, 0], on[:, 0], near[:, 0]]
    lat = np.r_[rng.uniform(y0, y1, n), xy[:, 1], on[:, 1], near[:, 1]]
    return lon, lat


def _dyadic_fence(rng):
    """A star with coordinates on a 2^-20 grid, and its edge midpoints: exactly on the edges, where
    float orientation is undecided (the filter defers them to GEOS)."""
    fence = shapely.Polygon(np.round(shapely.get_coordinates(_star(rng, 7.02, 45.02, 0.004, 30)) * 2**20) / 2**20)
    v = shapely.get_coordinates(fence)
    return fence, (v[:-1] + v[1:]) / 2                               # exact: dyadic coordinates


def test_randomized_equivalence_with_shapely():
    """The vectorized ring test (large batches) and the GEOS path (small ones) against plain
    shapely.intersects_xy: ~150 overlapping fences with holes, MultiPolygons, shared edges, and
    points exactly on vertices and edges."""
    rng = np.random.default_rng(11)
    fences = _random_fences(rng, 150)
    dyadic, mid = _dyadic_fence(rng)
    fences.append(dyadic)
    idx = FenceIndex()
    for k, g in enumerate(fences):
        c = cover(g)
        idx.upsert(f"f{k}", g, c.interior, c.boundary)
    lon, lat = _points_on_and_near(rng, fences, 20_000)
    lon, lat = np.r_[mid[:, 0], lon], np.r_[mid[:, 1], lat]
    truth = {(int(i), f"f{k}") for k, g in enumerate(fences)
             for i in np.flatnonzero(shapely.intersects_xy(g, lon, lat))}
    assert len(truth) > 20_000
    cells = cells_for_points(lat, lon, FENCE_RES)
    assert match_set(idx, lon, lat) == truth                          # chunks, ring test
    assert "rings" in vars(idx._pairs())                               # (it did run)
    small = [idx.match(lon[s:s + 50], lat[s:s + 50], cells[s:s + 50]) for s in range(0, 3000, 50)]
    got = {(int(p) + s, u) for (ps, us), s in zip(small, range(0, 3000, 50)) for p, u in zip(ps, us)}
    assert got == {(i, u) for i, u in truth if i < 3000}              # small batches: GEOS


def test_ring_test_decides_or_defers_to_geos():
    """_Rings.intersects over every (fence, point-in-box) pair: where it decides, it equals shapely;
    it defers the pairs that float arithmetic cannot decide (the dyadic fence's edge midpoints)."""
    rng = np.random.default_rng(12)
    fences = _random_fences(rng, 60)
    dyadic, mid = _dyadic_fence(rng)
    fences.append(dyadic)
    geoms = np.array(fences, dtype=object)
    bounds = shapely.bounds(geoms)
    lon, lat = _points_on_and_near(rng, fences, 5_000)
    lon, lat = np.r_[lon, mid[:, 0]], np.r_[lat, mid[:, 1]]
    f, p = np.nonzero((lon >= bounds[:, [0]]) & (lon <= bounds[:, [2]])
                      & (lat >= bounds[:, [1]]) & (lat <= bounds[:, [3]]))
    rings = _Rings.build(geoms, bounds)
    inside, unsure = rings.intersects(f, lon[p], lat[p], bounds[f, 1])
    truth = shapely.intersects_xy(geoms[f], lon[p], lat[p])
    decided = np.ones(len(f), bool)
    decided[unsure] = False
    assert 10 < len(unsure) < 0.01 * len(f)
    assert np.array_equal(inside[decided], truth[decided])
    assert truth.sum() > 10_000 and (~truth).sum() > 10_000
    assert truth[unsure].all()                                       # the midpoints are on the boundary


@pytest.mark.parametrize("fences, most", [(40, 3), (100_000, 8)])   # a point in up to `most` of `fences`
def test_matched_sets_number_each_points_fences_as_one_set(fences, most):
    """fencing.stream.process._matched_sets: per point, exactly the fences it matched (empty set: none),
    one shared frozenset per distinct combination."""
    import numpy as np
    from fencing.stream.process import _matched_sets

    rng = np.random.default_rng(3)
    names = np.array([f"farm/f{i}" for i in range(fences)], dtype=object)
    n = 500
    pool = rng.choice(fences, size=min(fences, 12), replace=False)     # few fences: sets repeat
    truth = [sorted(rng.choice(pool, size=rng.integers(0, most + 1), replace=False).tolist()) for _ in range(n)]
    point_idx = np.array([p for p, fs in enumerate(truth) for _ in fs], dtype=np.int64)
    codes = np.array([f for fs in truth for f in fs], dtype=np.int64)
    sets, set_of_point = _matched_sets(n, point_idx, codes, names)
    assert [sets[j] for j in set_of_point] == [frozenset(names[fs].tolist()) for fs in truth]
    assert len(sets) == len({frozenset(fs) for fs in truth} | {frozenset()})
