"""Point-in-fence membership, vectorized: the per-task fence cache of the fencing job.

How `FenceIndex.match` works (no per-point Python):
  1. a pair table, sorted by cell: one row per (cell, fence) of every fence's cover, with a flag
     saying whether the cell is interior to the fence; rebuilt lazily after upserts/removes;
  2. each point's cell is looked up among the table's distinct cells (one np.searchsorted), and the
     point is expanded into one candidate pair per fence row of that cell (np.repeat arithmetic);
  3. interior pairs are accepted as they are; boundary pairs are first cut by the fence's bounding
     box (numpy compares: small paddocks cover a fraction of a res-9 cell, so this drops about
     half of the pairs for ~3% of the cost of the exact test), then get one elementwise
     shapely.intersects_xy over (prepared fence, x, y) arrays.
Inside means "the fence intersects the point": the boundary counts as inside.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import shapely
from shapely.geometry.base import BaseGeometry

from fencing.h3util import resolution_of
from fencing.keys import FENCE_RES


@dataclass(frozen=True)
class _Fence:
    geom: BaseGeometry  # prepared
    interior: np.ndarray  # uint64
    boundary: np.ndarray  # uint64


@dataclass(frozen=True)
class _PairTable:
    """Immutable snapshot of the index, laid out for searchsorted joins."""

    uids: np.ndarray  # object[str], one per fence slot
    geoms: np.ndarray  # object[prepared geometry], aligned with uids
    bounds: np.ndarray  # float64 (n, 4) minx, miny, maxx, maxy, aligned with uids
    cells: np.ndarray  # uint64, distinct cells, sorted
    start: np.ndarray  # int64: rows of cells[i] are pair_fence[start[i]:start[i+1]]
    pair_fence: np.ndarray  # int32 fence slot of each row
    pair_interior: np.ndarray  # bool: the cell lies wholly inside that fence

    @classmethod
    def build(cls, fences: dict[str, _Fence]) -> _PairTable:
        uids = np.array(list(fences), dtype=object)
        geoms = np.array([f.geom for f in fences.values()], dtype=object)
        parts = [(f.interior, f.boundary) for f in fences.values()]
        cells = np.concatenate([np.concatenate(p) for p in parts] or [np.empty(0, np.uint64)]).astype(np.uint64)
        fence = np.repeat(np.arange(len(parts), dtype=np.int32), [len(i) + len(b) for i, b in parts])
        interior = np.concatenate([np.r_[np.ones(len(i), bool), np.zeros(len(b), bool)] for i, b in parts]
                                  or [np.empty(0, bool)])
        order = np.argsort(cells, kind="stable")
        cells, fence, interior = cells[order], fence[order], interior[order]
        distinct, start = np.unique(cells, return_index=True)
        bounds = shapely.bounds(geoms).reshape(len(geoms), 4)
        return cls(uids, geoms, bounds, distinct, np.r_[start, len(cells)].astype(np.int64), fence, interior)


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
        interior = np.asarray(interior, dtype=np.uint64)
        boundary = np.asarray(boundary, dtype=np.uint64)
        both = np.concatenate([interior, boundary])
        if len(both) and (resolution_of(both) != self.res).any():
            raise ValueError(f"fence {uid}: cover cells must be at resolution {self.res}")
        shapely.prepare(geom)  # prepared once here, reused by every boundary test of every batch
        self._fences[uid] = _Fence(geom, interior, boundary)
        self._table = None

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

        # 1. which distinct table cell (if any) each point falls in
        pos = np.minimum(np.searchsorted(t.cells, cells), len(t.cells) - 1)
        found = t.cells[pos] == cells
        lo = np.where(found, t.start[pos], 0)
        n = np.where(found, t.start[pos + 1] - t.start[pos], 0)
        # 2. expand every point into its candidate rows: row = lo[p] + k, k = 0..n[p]-1
        point = np.repeat(np.arange(len(cells), dtype=np.int64), n)
        first = np.cumsum(n) - n  # index of each point's first candidate in the expansion
        row = np.repeat(lo - first, n) + np.arange(len(point), dtype=np.int64)
        fence = t.pair_fence[row]
        # 3. interior rows are inside by construction; boundary rows get the exact test
        hit = t.pair_interior[row].copy()
        edge = np.flatnonzero(~hit)
        x, y, b = lon[point[edge]], lat[point[edge]], t.bounds[fence[edge]]
        in_box = (x >= b[:, 0]) & (x <= b[:, 2]) & (y >= b[:, 1]) & (y <= b[:, 3])
        edge, x, y = edge[in_box], x[in_box], y[in_box]
        if len(edge):
            hit[edge] = shapely.intersects_xy(t.geoms[fence[edge]], x, y)
        return point[hit], t.uids[fence[hit]]


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
