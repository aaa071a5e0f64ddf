"""Batch-level preparation of the per-report extras of `transitions.advance`, vectorized over a
whole micro-batch: which matched fences each report is within `warn_m` of (APPROACH), and the
segments between consecutive processed fixes that may imply crossings.

Dense, in-order tracks pay little: no fence with warn_m → no distance; a segment is tested only when
it is at least `crossings.MIN_SEGMENT_M` long (and as long as the stretch it would need), and then only
against fences that both or neither of its ends are in.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np
import pandas as pd
import shapely

from fencing.model.crossings import ACCURACY_FACTOR, MIN_SEGMENT_M, MIN_STRETCH_M, Segment, boundary_distance_m, \
    convex_polygons, inside_stretches, min_stretch_m, segment_length_m
from fencing.model.fence_store import FenceRules
from fencing.model.transitions import MAX_LIVE_FIXES, DeviceState, accepted_rows

EMPTY: frozenset[str] = frozenset()


@dataclass(frozen=True)
class FarmFences:
    """The cached fences sorted by farm, with boxes and a convexity flag: a device's segment is tested
    against its own farm's fences only (tenancy), so the candidates of a segment are a box test over a
    few dozen fences, in numpy for all segments at once — no geometry is made for a segment that
    meets none of them."""
    uids: np.ndarray           # object
    geoms: np.ndarray          # object
    bounds: np.ndarray         # float64 (n, 4)
    convex: np.ndarray         # bool
    farms: dict[str, tuple[int, int]]      # farm → its fences' slice
    index: dict[str, int]                  # uid → position

    @cached_property
    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The boxes as four contiguous columns (min x, min y, max x, max y): a gather of one is a
        quarter of a gather of `bounds`' rows."""
        return tuple(np.ascontiguousarray(self.bounds[:, k]) for k in range(4))

    @classmethod
    def build(cls, uids: list[str], geoms: list, fence_farm: dict[str, str], convex: list[bool] | None = None
              ) -> "FarmFences":
        """`convex`: each fence's flag when the caller knows it (fencing.stream.fence_cache keeps them)."""
        farm = np.array([fence_farm.get(u, "") for u in uids], dtype=object)
        order = np.argsort(farm, kind="stable")
        uids_a = np.array(uids, dtype=object)[order] if uids else np.empty(0, object)
        geoms_a = np.array(geoms, dtype=object)[order] if uids else np.empty(0, object)
        farm = farm[order]
        edges = np.flatnonzero(np.r_[True, farm[1:] != farm[:-1], True]) if len(farm) else np.zeros(1, np.int64)
        farms = {farm[a]: (int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])}
        flags = np.asarray(convex, dtype=bool)[order] if convex is not None and uids else convex_polygons(geoms_a)
        return cls(uids_a, geoms_a, shapely.bounds(geoms_a).reshape(-1, 4), flags, farms,
                   {u: i for i, u in enumerate(uids_a.tolist())})

    def candidates(self, farm: np.ndarray, x0, y0, x1, y1, chunk: int = 2_000_000) -> tuple[np.ndarray, np.ndarray]:
        """(segment, fence position) for every segment and fence of its farm whose boxes meet."""
        if not len(farm) or not len(self.uids):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        codes, names = pd.factorize(np.asarray(farm, dtype=object))
        span = np.array([self.farms.get(n, (0, 0)) for n in names], dtype=np.int64).reshape(-1, 2)
        lo, count = span[codes, 0], span[codes, 1] - span[codes, 0]
        x0, y0, x1, y1 = (np.asarray(v, np.float64) for v in (x0, y0, x1, y1))
        sx0, sx1 = np.minimum(x0, x1), np.maximum(x0, x1)
        sy0, sy1 = np.minimum(y0, y1), np.maximum(y0, y1)
        segs, fences = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        ends = np.cumsum(count)
        fx0, fy0, fx1, fy1 = self.columns
        start = 0
        while start < len(farm):          # bounded pair arrays: chunks of about `chunk` pairs
            stop = int(np.searchsorted(ends, (ends[start - 1] if start else 0) + chunk, side="right"))
            stop = max(stop, start + 1)
            n = count[start:stop]
            seg = np.repeat(np.arange(start, stop), n)
            fence = np.repeat(lo[start:stop] - (np.cumsum(n) - n), n) + np.arange(len(seg))
            # boxes meet: x first, then y on the pairs left (a farm's paddocks lie side by side, so
            # most pairs fail on one axis), then the segment itself
            hit = np.flatnonzero((fx0[fence] <= sx1[seg]) & (fx1[fence] >= sx0[seg]))
            seg, fence = seg[hit], fence[hit]
            hit = np.flatnonzero((fy0[fence] <= sy1[seg]) & (fy1[fence] >= sy0[seg]))
            seg, fence = seg[hit], fence[hit]
            hit = _crosses_box(self.bounds[fence], x0[seg], y0[seg], x1[seg], y1[seg])
            segs.append(seg[hit])
            fences.append(fence[hit])
            start = stop
        return np.concatenate(segs), np.concatenate(fences)


def _crosses_box(box: np.ndarray, x0, y0, x1, y1) -> np.ndarray:
    """Whether each segment meets its box (closed; Liang-Barsky clipping): a segment that misses a
    fence's box misses the fence, whatever their boxes do."""
    dx, dy = x1 - x0, y1 - y0
    t0, t1 = np.zeros(len(x0)), np.ones(len(x0))
    ok = np.ones(len(x0), bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        for p, q in ((-dx, x0 - box[:, 0]), (dx, box[:, 2] - x0), (-dy, y0 - box[:, 1]), (dy, box[:, 3] - y0)):
            flat = p == 0
            ok &= ~(flat & (q < 0))
            t = q / p
            t0 = np.where(~flat & (p < 0), np.maximum(t0, t), t0)
            t1 = np.where(~flat & (p > 0), np.minimum(t1, t), t1)
    return ok & (t0 <= t1)


class Fences(Protocol):
    """What this module needs of the job's fence cache."""
    rules: dict[str, FenceRules]
    fence_farm: dict[str, str]

    def geometry(self, uid: str) -> shapely.Geometry: ...

    def farm_fences(self) -> FarmFences: ...


@dataclass(frozen=True)
class Track:
    """One batch's reports grouped by device in arrival order (device d: rows starts[d]:ends[d])."""
    starts: np.ndarray
    ends: np.ndarray
    farm: np.ndarray        # object: farm of each row
    ts: np.ndarray          # int64
    lat: np.ndarray
    lon: np.ndarray
    accuracy: np.ndarray    # float, NaN = not given


def near_rows(fences: Fences, point_idx: np.ndarray, code: np.ndarray, distinct: np.ndarray, lon: np.ndarray,
              lat: np.ndarray) -> dict[int, frozenset[str]]:
    """row → the fences it matched whose boundary is within their warn_m (only rows with one). The
    matches are (point_idx, code) pairs, code indexing the distinct fence uids `distinct`."""
    if not len(point_idx):
        return {}
    warn = np.array([fences.rules[u].warn_m if u in fences.rules else 0.0 for u in distinct], dtype=np.float64)
    if not warn.any():
        return {}
    k = np.flatnonzero(warn[code] > 0)
    if not len(k):
        return {}
    geoms = np.array([fences.geometry(u) for u in distinct], dtype=object)
    rows, pair_codes = point_idx[k], code[k]
    dist = boundary_distance_m(geoms[pair_codes], lon[rows], lat[rows])
    hit = dist <= warn[pair_codes]
    out: dict[int, set[str]] = {}
    for row, c in zip(rows[hit].tolist(), pair_codes[hit].tolist()):
        out.setdefault(row, set()).add(distinct[c])
    return {r: frozenset(s) for r, s in out.items()}


@dataclass(frozen=True)
class Taken:
    rows: np.ndarray        # bool per report: `DeviceState.accept` takes it
    older: np.ndarray       # bool per report: older than its device's newest report so far (late)
    last: np.ndarray        # per device: index of its last taken report in its run (-1: none)
    recent: list[int]       # the last MAX_LIVE_FIXES + 1 taken reports of each device (index in its run)
    recent_from: list[int]  # per device (and one past the last): where its rows start in `recent`


def taken_rows(track: Track, states: list[DeviceState]) -> Taken:
    """`DeviceState.accept` for the whole batch (ties resolved by that rule itself)."""
    taken, older, tied = accepted_rows(track.starts, track.ts, [s.last_ts for s in states])
    for d in np.flatnonzero(tied).tolist():          # rare: a repeated time; the per-report rule
        probe = DeviceState(states[d].last_ts, states[d].last_lat, states[d].last_lon)
        lo, hi = int(track.starts[d]), int(track.ends[d])
        for i, (t, a, o) in enumerate(zip(track.ts[lo:hi].tolist(), track.lat[lo:hi].tolist(),
                                          track.lon[lo:hi].tolist()), lo):
            older[i] = probe.last_ts is not None and t < probe.last_ts
            taken[i] = probe.accept(t, a, o)
    n = len(track.ts)
    if not n:
        return Taken(taken, older, np.empty(0, np.int64), [], [0] * (len(track.starts) + 1))
    last = np.maximum.reduceat(np.where(taken, np.arange(n), -1), track.starts)
    # each device's last few taken rows (kept as its live fixes), for all devices at once
    rows = np.flatnonzero(taken)
    count = np.add.reduceat(taken.astype(np.int64), track.starts)
    through = np.cumsum(count)                   # taken rows up to and including each device's
    device = np.repeat(np.arange(len(count)), count)
    keep = through[device] - np.arange(len(rows)) <= MAX_LIVE_FIXES + 1
    kept = np.minimum(count, MAX_LIVE_FIXES + 1)
    return Taken(taken, older, np.where(last >= 0, last - track.starts, -1),
                 (rows[keep] - track.starts[device[keep]]).tolist(), np.r_[0, np.cumsum(kept)].tolist())


def batch_segments(fences: Fences, track: Track, states: list[DeviceState], taken: np.ndarray,
                   point_idx: np.ndarray, code: np.ndarray, distinct: np.ndarray) -> dict[int, Segment]:
    """row → the segment from the device's previous processed fix to it, with the fences to check
    (both or neither end inside, the stretches inside each). Only rows with such a fence. States are
    the devices' states before the batch, `taken` the reports they take (`taken_rows`);
    (point_idx, code) the batch's (row, fence) matches, code indexing the fence uids `distinct`."""
    rows = np.flatnonzero(taken)
    if not len(rows):
        return {}
    device = np.repeat(np.arange(len(track.starts)), track.ends - track.starts)[rows]
    first = np.r_[True, device[1:] != device[:-1]]
    prev = np.r_[-1, rows[:-1]]
    prev[first] = -1                                 # the device's first fix here: its state's last
    known = np.array([s.last_ts is not None and s.last_lat is not None for s in states], dtype=bool)
    has_prev = ~first | known[device]
    rows, prev, device = rows[has_prev], prev[has_prev], device[has_prev]
    from_state = prev < 0
    state_lat = np.array([s.last_lat if s.last_lat is not None else np.nan for s in states], np.float64)
    state_lon = np.array([s.last_lon if s.last_lon is not None else np.nan for s in states], np.float64)
    state_ts = np.array([s.last_ts if s.last_ts is not None else 0 for s in states], np.int64)
    state_acc = np.array([s.accuracy if s.accuracy is not None else np.nan for s in states], np.float64)
    p = np.maximum(prev, 0)
    lat0 = np.where(from_state, state_lat[device], track.lat[p])
    lon0 = np.where(from_state, state_lon[device], track.lon[p])
    t0 = np.where(from_state, state_ts[device], track.ts[p])
    acc0 = np.where(from_state, state_acc[device], track.accuracy[p])
    acc1 = track.accuracy[rows]
    length = segment_length_m(lon0, lat0, track.lon[rows], track.lat[rows])
    need = np.maximum(MIN_STRETCH_M, ACCURACY_FACTOR * np.fmax(np.nan_to_num(acc0, nan=0.0), np.nan_to_num(acc1, nan=0.0)))
    long = (length >= need) & (length >= MIN_SEGMENT_M)
    if not long.any():
        return {}
    rows, prev, device, from_state = rows[long], prev[long], device[long], from_state[long]
    lat0, lon0, t0, acc0, acc1, length = lat0[long], lon0[long], t0[long], acc0[long], acc1[long], length[long]
    table = fences.farm_fences()
    lon1, lat1 = track.lon[rows], track.lat[rows]
    seg, fence = table.candidates(track.farm[rows], lon0, lat0, lon1, lat1)   # own farm only (tenancy)
    if not len(seg):
        return {}
    # which end is inside each fence: the batch's matches for rows here, the state's fences for a
    # previous fix of an earlier batch (a fence it was inside is in its state unless it ended); keys
    # row * width + the fence's position in the table, sorted, for the segments' ends only
    width = len(table.uids) + 1
    position = np.array([table.index.get(u, -1) for u in distinct.tolist()], dtype=np.int64)
    wanted = np.zeros(len(track.ts), dtype=bool)
    wanted[rows[seg]] = True
    wanted[prev[seg][prev[seg] >= 0]] = True
    point_idx = np.asarray(point_idx, np.int64)
    sub = wanted[point_idx] if len(point_idx) else np.zeros(0, bool)
    at = position[np.asarray(code, np.int64)[sub]] if len(point_idx) else np.zeros(0, np.int64)
    matched_keys = np.sort((point_idx[sub] * width + at)[at >= 0])
    in1 = _member(rows[seg] * width + fence, matched_keys)
    in0 = _member(np.maximum(prev[seg], 0) * width + fence, matched_keys)
    state_keys = np.array([d * width + table.index[u] for d in np.unique(device[from_state]).tolist()
                           for u in states[d].fences if u in table.index], dtype=np.int64)
    in0 = np.where(from_state[seg], _member(device[seg] * width + fence, np.sort(state_keys)), in0)
    # both ends in a convex fence (a paddock's rectangle): the segment stays inside, no gap to find
    keep = (in0 == in1) & ~(in1 & table.convex[fence])
    seg, fence, both = seg[keep], fence[keep], in1[keep]
    if not len(seg):
        return {}
    # geometry only now, for the segments left: prepared fences, cheap tests first (a segment inside
    # a fence both ends are in has no gap; one missing a fence neither end is in has no stretch)
    need, local = np.unique(seg, return_inverse=True)
    ends = np.empty((len(need), 2, 2))     # (segment, end, x/y): one line each, no index array (~40% faster)
    ends[:, 0, 0], ends[:, 0, 1], ends[:, 1, 0], ends[:, 1, 1] = lon0[need], lat0[need], lon1[need], lat1[need]
    lines = shapely.linestrings(ends)[local]
    geoms = table.geoms[fence]
    b = np.flatnonzero(both)
    k = np.flatnonzero(~both)
    keep = np.zeros(len(seg), bool)
    keep[b] = ~shapely.covers(geoms[b], lines[b])
    keep[k] = shapely.intersects(geoms[k], lines[k])
    seg, seg_uid, geoms, lines = seg[keep], table.uids[fence[keep]], geoms[keep], lines[keep]
    pair, lo, hi = inside_stretches(geoms, lines)
    stretches: dict[int, list[tuple[float, float]]] = {}
    for q, a, b in zip(pair.tolist(), lo.tolist(), hi.tolist()):
        stretches.setdefault(q, []).append((a, b))
    by_segment: dict[int, list[tuple[str, tuple[tuple[float, float], ...]]]] = {}
    for q, (s, u) in enumerate(zip(seg.tolist(), seg_uid.tolist())):
        by_segment.setdefault(s, []).append((u, tuple(stretches.get(q, ()))))
    out: dict[int, Segment] = {}
    for s, found in by_segment.items():
        out[int(rows[s])] = Segment(int(t0[s]), int(track.ts[rows[s]]), float(length[s]),
                                    min_stretch_m(_given(acc0[s]), _given(acc1[s])), tuple(sorted(found)))
    return out


def _member(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """keys found in `sorted_keys` (a binary search each: cheaper than np.isin's sort of both)."""
    if not len(sorted_keys):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] == keys


def _given(value: float) -> float | None:
    return None if value != value else float(value)
