"""Point-in-fence membership, vectorized: the per-task fence cache of the fencing job.

How `FenceIndex.match` works (no per-point Python):
  1. a pair table, sorted by cell: one row per (cell, fence) of every fence's cover, with a flag
     saying whether the cell is interior to the fence; rebuilt lazily after upserts/removes;
  2. a batch of more than `_CHUNK` points is taken in cell order (one stable argsort) and in chunks:
     table rows, fence boxes and ring edges are then read nearly in memory order, and each chunk's
     temporaries stay in the CPU cache. One index of 190k fences (a partition's share of 1M) holds
     ~130 MB of tables; random reads into those, not arithmetic, made the per-point cost grow;
  3. each point's cell is looked up among the table's distinct cells (one np.searchsorted), and the
     point is expanded into one candidate pair per fence row of that cell (np.repeat arithmetic);
  4. interior pairs are accepted as they are; boundary pairs are first cut by the fence's bounding
     box (small paddocks cover a fraction of a res-9 cell: this drops about two thirds of them), then
     get the exact test, `_Rings.intersects`: GEOS's own ray-crossing rule evaluated with numpy over
     one contiguous vertex table (only the few edges of the fence's horizontal band that holds the
     point are read). Where float arithmetic cannot decide an edge (point within ~1e-15 relative of
     its line) that pair goes to shapely.intersects_xy, so results equal GEOS's exactly. A chunk
     with few boundary pairs (a small batch, e.g. one cell group's points) gives them all to one
     shapely.intersects_xy call instead: cheaper than ~40 numpy calls, and the table is never built;
  5. the pairs are put back in point order with a scatter (no second sort).
Inside means "the fence intersects the point": the boundary counts as inside, holes do not.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import shapely
from shapely.geometry.base import BaseGeometry

from fencing.model.h3util import resolution_of
from fencing.model.keys import FENCE_RES

_CHUNK = 8192          # points per pass: ~40k candidate pairs, so a pass's arrays fit in L2
_FEW_PAIRS = 256       # below this many boundary pairs in a chunk, GEOS tests them
_MAX_BANDS = 64        # horizontal bands per fence: about one per edge, at most this many
_POLYGONAL = (int(shapely.GeometryType.POLYGON), int(shapely.GeometryType.MULTIPOLYGON))


@dataclass(frozen=True)
class _Fence:
    geom: BaseGeometry
    interior: np.ndarray  # uint64
    boundary: np.ndarray  # uint64


def _band(y: np.ndarray, miny: np.ndarray, height: np.ndarray, nbands: np.ndarray) -> np.ndarray:
    """Band of each y in its fence's box. Monotone in y (a rounded subtract, divide and floor are),
    so an edge listed in the bands of its two end y's is listed for every y between them."""
    return np.clip(np.floor((y - miny) / height), 0, nbands - 1).astype(np.int64)


@dataclass(frozen=True)
class _Rings:
    """Every ring of every fence (shells, holes, all parts) in one vertex table, and per fence its
    edges split into horizontal bands, so a point is tested against a few edges, not all of them."""

    xy: np.ndarray          # float64 (V, 2): closed rings, concatenated; edge i is xy[i] -> xy[i + 1]
    band: np.ndarray        # float64 (n, 3) per fence slot: band height, band count, id of its first band
    band_start: np.ndarray  # int64: edges of band b are band_edge[band_start[b]:band_start[b + 1]]
    band_edge: np.ndarray   # int32 edge ids (vertex index of the edge's first end)

    @classmethod
    def build(cls, geoms: np.ndarray, bounds: np.ndarray) -> _Rings:
        n = len(geoms)
        if n == 0:
            return cls(np.empty((0, 2)), np.empty((0, 3)), np.zeros(1, np.int64), np.empty(0, np.int32))
        # ragged arrays: coordinates plus offsets (ring -> vertices, polygon -> rings, fence ->
        # polygons), without a Python object per part or ring
        _, xy, offsets = shapely.to_ragged_array(geoms)
        ring_at, poly_at, fence_at = offsets if len(offsets) == 3 else (*offsets, np.arange(n + 1))
        vert_ring = np.repeat(np.arange(len(ring_at) - 1), np.diff(ring_at))
        ring_fence = np.repeat(np.repeat(np.arange(n), np.diff(fence_at)), np.diff(poly_at))
        edge = np.flatnonzero(vert_ring[1:] == vert_ring[:-1])      # both ends in the same ring
        edge_fence = ring_fence[vert_ring[edge]]
        nbands = np.clip(np.bincount(edge_fence, minlength=n), 1, _MAX_BANDS).astype(np.float64)
        height = (bounds[:, 3] - bounds[:, 1]) / nbands
        height = np.where(height > 0, height, 1.0)                  # a flat (invalid) fence: one band
        first_band = np.r_[0.0, np.cumsum(nbands)]
        f = edge_fence
        y0, y1 = xy[edge, 1], xy[edge + 1, 1]
        lo = _band(np.minimum(y0, y1), bounds[f, 1], height[f], nbands[f])
        hi = _band(np.maximum(y0, y1), bounds[f, 1], height[f], nbands[f])
        k = hi - lo + 1                                             # an edge is in each band it spans
        rep = np.repeat(np.arange(len(edge)), k)
        band_id = (first_band[f] + lo).astype(np.int64)[rep] + np.arange(len(rep)) - np.repeat(np.cumsum(k) - k, k)
        order = np.argsort(band_id, kind="stable")
        band_start = np.searchsorted(band_id[order], np.arange(int(first_band[-1]) + 1))
        return cls(np.ascontiguousarray(xy), np.column_stack([height, nbands, first_band[:-1]]),
                   band_start, edge[rep[order]].astype(np.int32))

    def intersects(self, fence: np.ndarray, x: np.ndarray, y: np.ndarray, miny: np.ndarray):
        """(inside bool per pair, indices of the pairs float arithmetic could not decide) for pairs
        (fence slot, point x, y) with the point inside the fence's box (miny: the box's min y)."""
        h, nb, b0 = self.band.take(fence, axis=0).T
        b = b0.astype(np.int64) + _band(y, miny, h, nb)
        lo = self.band_start.take(b)
        n = self.band_start.take(b + 1) - lo
        pair = np.repeat(np.arange(len(fence)), n)
        e = self.band_edge.take(np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(len(pair)))
        p1, p2 = self.xy.take(e, axis=0), self.xy.take(e + 1, axis=0)
        py = y.take(pair)
        y1, y2 = p1[:, 1], p2[:, 1]
        # only edges that straddle the point's horizontal line or touch it can count or hold the point
        k = np.flatnonzero(((y1 > py) != (y2 > py)) | (y1 == py) | (y2 == py))
        pair, py, y1, y2 = pair.take(k), py.take(k), y1.take(k), y2.take(k)
        x1, x2, px = p1[:, 0].take(k), p2[:, 0].take(k), x.take(pair)
        # GEOS RayCrossingCounter::countSegment, per edge: a ray from the point towards +x
        right = (x1 >= px) | (x2 >= px)                             # edges wholly left are skipped
        at_end = (px == x2) & (py == y2)
        on_flat = (y1 == py) & (y2 == py) & (px >= np.minimum(x1, x2)) & (px <= np.maximum(x1, x2))
        cross = right & ~at_end & ((y1 > py) != (y2 > py))
        # orientation of the point to the edge, with GEOS's orientationIndexFilter: the sign of det is
        # exact unless dl, dr have the same sign and |det| < 1e-15 (|dl| + |dr|)
        dl = (x1 - px) * (y2 - py)
        dr = (y1 - py) * (x2 - px)
        det = dl - dr
        unsure = cross & (((dl > 0) & (dr > 0)) | ((dl < 0) & (dr < 0))) & \
            (np.abs(det) < 1e-15 * (np.abs(dl) + np.abs(dr)))
        sure = cross & ~unsure
        on = right & (at_end | on_flat | (sure & (det == 0)))
        counted = sure & (det != 0) & ((det > 0) == (y2 > y1))     # upward edge with the point on its left
        inside = (np.bincount(pair.compress(counted), minlength=len(fence)) & 1).astype(bool)
        inside[pair.compress(on)] = True
        return inside, np.unique(pair.compress(unsure & ~on))


@dataclass(frozen=True)
class _PairTable:
    """Immutable snapshot of the index, laid out for searchsorted joins."""

    uids: np.ndarray  # object[str], one per fence slot
    geoms: np.ndarray  # object[geometry], aligned with uids
    bounds: np.ndarray  # float64 (n, 4) minx, miny, maxx, maxy, aligned with uids
    cells: np.ndarray  # uint64, distinct cells, sorted
    start: np.ndarray  # int64: rows of cells[i] are pair_fence[start[i]:start[i+1]]
    pair_fence: np.ndarray  # int32 fence slot of each row
    pair_interior: np.ndarray  # bool: the cell lies wholly inside that fence

    @cached_property
    def rings(self) -> _Rings:
        """Built on the first call with enough pairs for it (an index only ever matched a few
        points at a time, e.g. one cell group's, never needs it)."""
        return _Rings.build(self.geoms, self.bounds)

    @classmethod
    def build(cls, fences: dict[str, _Fence]) -> _PairTable:
        """Whole-table numpy: one concatenation of every fence's cells, no per-fence arrays (a worker
        loading 100k fences spent seconds in per-fence np.r_ and min calls)."""
        items = list(fences.values())
        n = len(items)
        n_in = np.fromiter((len(f.interior) for f in items), dtype=np.int64, count=n)
        n_bd = np.fromiter((len(f.boundary) for f in items), dtype=np.int64, count=n)
        per_fence = n_in + n_bd
        cells = np.concatenate([c for f in items for c in (f.interior, f.boundary)] or [np.empty(0, np.uint64)]
                               ).astype(np.uint64, copy=False)
        old = np.repeat(np.arange(n, dtype=np.int64), per_fence)
        interior = np.repeat(np.tile(np.array([True, False]), n), np.column_stack([n_in, n_bd]).ravel())
        # fence slots in order of their first cover cell: fences near each other in space (and so
        # met by the same chunk of cell-sorted points) are near each other in every table
        first = np.full(n, ~np.uint64(0), dtype=np.uint64)
        has = per_fence > 0
        if has.any():
            starts = (np.cumsum(per_fence) - per_fence)[has]
            first[has] = np.minimum.reduceat(cells, starts)
        slot_order = np.argsort(first, kind="stable")            # slot -> old position
        slot_of = np.empty(n, dtype=np.int32)
        slot_of[slot_order] = np.arange(n, dtype=np.int32)
        uids = np.array(list(fences.keys()), dtype=object).take(slot_order) if n else np.empty(0, object)
        geoms = np.array([f.geom for f in items], dtype=object).take(slot_order) if n else np.empty(0, object)
        fence = slot_of.take(old) if len(old) else np.empty(0, np.int32)
        order = np.argsort(cells, kind="stable")
        cells, fence, interior = cells[order], fence[order], interior[order]
        distinct, start = np.unique(cells, return_index=True)
        bounds = shapely.bounds(geoms).reshape(n, 4)
        return cls(uids, geoms, bounds, distinct, np.r_[start, len(cells)].astype(np.int64), fence, interior)

    def match_chunk(self, lon: np.ndarray, lat: np.ndarray, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(point, fence slot) pairs for one chunk of points, in point order."""
        pos = np.minimum(np.searchsorted(self.cells, cells), len(self.cells) - 1)
        found = self.cells.take(pos) == cells
        lo = np.where(found, self.start.take(pos), 0)
        n = np.where(found, self.start.take(pos + 1) - lo, 0)
        # expand every point into its candidate rows: row = lo[p] + k, k = 0..n[p]-1
        point = np.repeat(np.arange(len(cells), dtype=np.int64), n)
        row = np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(len(point), dtype=np.int64)
        fence = self.pair_fence.take(row)
        hit = self.pair_interior.take(row)
        # interior rows are inside by construction; boundary rows inside the fence's box get the test
        edge = np.flatnonzero(~hit)
        f, p = fence.take(edge), point.take(edge)
        x, y, b = lon.take(p), lat.take(p), self.bounds.take(f, axis=0)
        k = np.flatnonzero((x >= b[:, 0]) & (x <= b[:, 2]) & (y >= b[:, 1]) & (y <= b[:, 3]))
        edge, f, x, y = edge.take(k), f.take(k), x.take(k), y.take(k)
        if len(k) < _FEW_PAIRS:    # ~40 numpy calls cost more than one GEOS call on a few pairs
            hit[edge] = shapely.intersects_xy(self.geoms.take(f), x, y)
        else:
            inside, unsure = self.rings.intersects(f, x, y, b[:, 1].take(k))
            if len(unsure):
                inside[unsure] = shapely.intersects_xy(self.geoms.take(f.take(unsure)), x.take(unsure), y.take(unsure))
            hit[edge] = inside
        return point.compress(hit), fence.compress(hit)


class FenceIndex:
    """The fences of one task's cell groups, keyed by fence uid; all points of a batch are matched
    against it at once. Cells must be at `res` (the resolution the fences were covered at)."""

    def __init__(self, res: int = FENCE_RES) -> None:
        self.res = res
        self._fences: dict[str, _Fence] = {}
        self._table: _PairTable | None = None

    def __len__(self) -> int:
        return len(self._fences)

    def __contains__(self, uid: str) -> bool:
        return uid in self._fences

    def upsert(self, uid: str, geom: BaseGeometry, interior: np.ndarray, boundary: np.ndarray) -> None:
        self.upsert_many([uid], [geom], [interior], [boundary])

    def upsert_many(self, uids: list[str], geoms, interiors: list, boundaries: list) -> None:
        """Add or replace fences, checked together (one type, resolution and prepare call for all)."""
        if not len(uids):
            return
        geoms = np.asarray(geoms, dtype=object)
        interiors = [np.asarray(c, dtype=np.uint64) for c in interiors]
        boundaries = [np.asarray(c, dtype=np.uint64) for c in boundaries]
        bad = np.flatnonzero(~np.isin(shapely.get_type_id(geoms), _POLYGONAL))
        if len(bad):
            raise ValueError(f"fence {uids[bad[0]]}: a fence must be a Polygon or MultiPolygon")
        every = np.concatenate(interiors + boundaries)
        if len(every) and (resolution_of(every) != self.res).any():
            wrong = next(u for u, i, b in zip(uids, interiors, boundaries)
                         if len(i) + len(b) and (resolution_of(np.concatenate([i, b])) != self.res).any())
            raise ValueError(f"fence {wrong}: cover cells must be at resolution {self.res}")
        shapely.prepare(geoms)  # for the GEOS tests (small batches, undecided pairs); a no-op when done
        for uid, geom, interior, boundary in zip(uids, geoms, interiors, boundaries):
            self._fences[uid] = _Fence(geom, interior, boundary)
        self._table = None

    def geometry(self, uid: str) -> BaseGeometry:
        return self._fences[uid].geom

    def remove(self, uid: str) -> bool:
        """Drop a fence; False when it was not there."""
        if self._fences.pop(uid, None) is None:
            return False
        self._table = None
        return True

    def _pairs(self) -> _PairTable:
        if self._table is None:
            self._table = _PairTable.build(self._fences)
        return self._table

    def build(self) -> None:
        """Build the lookup tables now (else the first `match` after a change does)."""
        if self._fences:
            self._pairs().rings    # noqa: B018 - a cached property: built here, not in a batch

    def match(self, lon: np.ndarray, lat: np.ndarray, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All (point, fence) pairs with the point inside the fence, in point order.

        Returns (point_idx int64, fence_uid object[str]) of equal length; a point inside k
        overlapping fences appears k times. `cells` are the points' cells at `self.res`
        (0 = no cell: matches nothing)."""
        t = self._pairs()
        cells = np.asarray(cells, dtype=np.uint64)
        lon = np.asarray(lon, dtype=np.float64)
        lat = np.asarray(lat, dtype=np.float64)
        if not (len(cells) == len(lon) == len(lat)):
            raise ValueError("lon, lat and cells must have the same length")
        if len(t.cells) == 0 or len(cells) == 0:
            return np.empty(0, np.int64), np.empty(0, object)
        if len(cells) <= _CHUNK:
            point, fence = t.match_chunk(lon, lat, cells)
            return point, t.uids.take(fence)
        by_cell = np.argsort(cells, kind="stable")
        points, fences = [], []
        for s in range(0, len(cells), _CHUNK):
            idx = by_cell[s:s + _CHUNK]
            p, f = t.match_chunk(lon.take(idx), lat.take(idx), cells.take(idx))
            points.append(idx.take(p))
            fences.append(f)
        point, fence = np.concatenate(points), np.concatenate(fences)
        if not len(point):
            return point, t.uids[:0]
        # back to point order: a point's pairs are adjacent; move each run to its point's place
        count = np.bincount(point, minlength=len(cells))
        run = np.r_[0, np.flatnonzero(point[1:] != point[:-1]) + 1]
        at = np.repeat((np.cumsum(count) - count).take(point.take(run)) - run, np.diff(np.r_[run, len(point)]))
        at += np.arange(len(point))
        out_point, out_fence = np.empty_like(point), np.empty_like(fence)
        out_point[at], out_fence[at] = point, fence
        return out_point, t.uids.take(out_fence)


def contains_exact(geom: BaseGeometry | np.ndarray, lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """bool per point: inside `geom` with the same semantics as `FenceIndex.match` (boundary counts).
    For ad-hoc areas (query-within) that have no cover. `geom` may be one geometry or an array
    broadcast against the points."""
    if isinstance(geom, BaseGeometry):
        shapely.prepare(geom)
    return shapely.intersects_xy(geom, np.asarray(lon, np.float64), np.asarray(lat, np.float64))


def vectorized_limit(fences: list[BaseGeometry], lon: np.ndarray, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Baseline for the benchmark: the same membership with plain shapely, no H3 — an STRtree over
    the fences queried with all points at once. Returns (point_idx, fence_idx into `fences`).
    Tree build time is part of the work measured."""
    tree = shapely.STRtree(fences)
    pts = shapely.points(np.asarray(lon, np.float64), np.asarray(lat, np.float64))
    point, fence = tree.query(pts, predicate="intersects")
    return point, fence
