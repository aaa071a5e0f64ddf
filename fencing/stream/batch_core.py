"""The computing core of the process stage, without Redis or Spark: a batch's reports (grouped by
device, arrival order) matched against the fence cache, then every device's state advanced — with
the batch-wide extras (approach distances, segments of sparse fixes) found once for all devices.
`process.py` reads and writes around it; the unit tests drive it directly against the reference."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from fencing.model import late
from fencing.model.sparse_batch import Track, batch_segments, near_rows, taken_rows
from fencing.model.transitions import DeviceState, Event, advance, advance_steady, is_steady


@dataclass(frozen=True)
class BatchReports:
    """A process task's reports as columns, grouped by device, each device's in arrival order: the
    last form a report takes before the state machine (fencing.stream.rows names the others)."""
    farm_id: np.ndarray     # object (str)
    ts: np.ndarray          # int64, epoch ms
    lat: np.ndarray         # float64
    lon: np.ndarray         # float64
    battery: np.ndarray     # float64, NaN: not given
    accuracy: np.ndarray    # float64 (accuracy_m), NaN: not given
    cell: np.ndarray        # uint64, the res-9 cell
    grp: np.ndarray         # object (str), the cell group

    def __len__(self) -> int:
        return len(self.ts)

    @classmethod
    def from_arrow(cls, table: pa.Table, order: np.ndarray | None = None) -> "BatchReports":
        """From STAGE_REPORT columns (fencing.stream.rows), their rows taken in `order` (None: as they are)."""
        if order is not None:
            table = table.take(pa.array(order))

        def floats(name: str) -> np.ndarray:      # nulls become NaN
            return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)

        def objects(name: str) -> np.ndarray:
            return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=object)
        return cls(objects("farm_id"), np.asarray(table.column("ts").to_numpy(), dtype=np.int64), floats("lat"),
                   floats("lon"), floats("battery"), floats("accuracy_m"),
                   np.asarray(table.column("cell").to_numpy(), dtype=np.int64).view(np.uint64), objects("grp"))


@dataclass(frozen=True)
class Matches:
    """The batch's (row, fence) matches of the row's own farm; codes index `fence_uids`."""
    point_idx: np.ndarray
    fence_codes: np.ndarray
    fence_uids: np.ndarray
    sets: list[frozenset[str]]
    set_of_point: np.ndarray

    @property
    def matched(self) -> list[frozenset[str]]:
        return [self.sets[j] for j in self.set_of_point.tolist()]


@dataclass(frozen=True)
class Outcome:
    events: list[Event]
    dropped: list[tuple[str, str, int]]     # (fence uid, device key, ts): left a closed fence silently
    latest_row: np.ndarray                  # per device its last report that counted (-1: none)
    ts: list[int]
    lat: list[float]
    lon: list[float]


def match_batch(cache, reports: BatchReports) -> Matches:
    point_idx, uids = cache.match(reports.lon, reports.lat, reports.cell, reports.grp)
    fence_codes, fence_uids = pd.factorize(uids) if len(uids) else (np.empty(0, np.int64), np.empty(0, object))
    if len(point_idx):   # tenancy: a farm's devices are tested against that farm's fences only
        farm_of_fence = np.array([cache.fence_farm.get(u, "") for u in fence_uids], dtype=object)
        own = farm_of_fence[fence_codes] == reports.farm_id[point_idx]
        point_idx, fence_codes = point_idx[own], fence_codes[own]
    sets, set_of_point = matched_sets(len(reports), point_idx, fence_codes, fence_uids)
    return Matches(point_idx, fence_codes, fence_uids, sets, set_of_point)


def advance_batch(cache, reports: BatchReports, found: Matches, bounds: np.ndarray, ends: np.ndarray,
                  dkeys: list[str], states: list[DeviceState], deleted) -> Outcome:
    """Advance each device's state (in place) over its rows bounds[d]:ends[d]; dkeys "farm/device"."""
    ts, lat, lon = reports.ts.tolist(), reports.lat.tolist(), reports.lon.tolist()
    battery, accuracy = reports.battery, reports.accuracy
    matched = found.matched
    events: list[Event] = []
    dropped: list[tuple[str, str, int]] = []
    latest_row = np.full(len(bounds), -1, dtype=np.int64)
    # devices whose reports all matched the same fences (most of them: grazing inside one paddock)
    device_of_row = np.repeat(np.arange(len(bounds)), ends - bounds)
    differs = found.set_of_point != found.set_of_point[bounds][device_of_row]
    uniform = (np.bincount(device_of_row, weights=differs, minlength=len(bounds)) == 0).tolist()
    track = Track(bounds, ends, reports.farm_id, reports.ts, reports.lat, reports.lon, accuracy)
    taken = taken_rows(track, states)
    # sparse fixes and approach warnings: per-report extras, found for the whole batch at once
    segments = batch_segments(cache, track, states, taken.rows, found.point_idx, found.fence_codes, found.fence_uids)
    near = near_rows(cache, found.point_idx, found.fence_codes, found.fence_uids, track.lon, track.lat)
    extra_rows = np.array(sorted(set(segments) | set(near)), dtype=np.int64)
    extra_devices = set(device_of_row[extra_rows].tolist()) if len(extra_rows) else set()
    late_rows = np.flatnonzero(taken.older)
    late_devices = set(device_of_row[late_rows].tolist()) if len(late_rows) else set()
    last_taken = taken.last.tolist()

    def run(d: int, state: DeviceState, device_id: str, a: int, b: int, whole: bool) -> int:
        """Advance device d over rows a:b (`whole`: all its rows); the index of the last one taken."""
        device_segments = device_near = None
        if extra_devices and d in extra_devices:
            device_segments = {r - a: segments[r] for r in range(a, b) if r in segments}
            device_near = [near.get(r, frozenset()) for r in range(a, b)] if near else None
        recent = taken.recent[taken.recent_from[d]:taken.recent_from[d + 1]] if whole else None
        done = advance(state, device_id, ts[a:b], lat[a:b], lon[a:b], matched[a:b], cache.rules, deleted,
                       uniform=uniform[d] if whole else None, last_accepted=last_taken[d] if whole else None,
                       near=device_near, segments=device_segments, recent=recent)
        if done.last >= 0:
            latest_row[d] = a + done.last
        if done.events:
            events.extend(done.events)
        if done.dropped:
            dropped.extend((uid, dkeys[d], t) for uid, t in done.dropped)
        return done.last

    rules, recent_rows, recent_from = cache.rules, taken.recent, taken.recent_from
    batteries, accuracies = battery.tolist(), accuracy.tolist()
    for d, (lo, hi) in enumerate(zip(bounds.tolist(), ends.tolist())):
        state = states[d]
        if uniform[d] and not state.open and d not in extra_devices and d not in late_devices \
                and is_steady(state, matched[lo], rules, deleted):
            # the common case (`advance`'s steady branch), without a call per device
            last = last_taken[d]
            advance_steady(state, ts, lat, lon, lo, last, recent_rows[recent_from[d]:recent_from[d + 1]])
            if last >= 0:
                row = lo + last
                latest_row[d] = row
                _keep_readings(state, batteries[row], accuracies[row])
            continue
        device_id = dkeys[d].partition("/")[2]
        if late_devices and d in late_devices:
            # buffered fixes are replayed where they arrived: before the device's next counted report
            # (a stay that report ends, or one it makes the device forget, is not yet in the state)
            rows = late_rows[np.searchsorted(late_rows, lo):np.searchsorted(late_rows, hi)]
            pieces = late_pieces(rows, np.flatnonzero(taken.rows[lo:hi]) + lo, lo, hi)
        else:
            pieces = [(lo, hi, None)]
        for a, b, replayed in pieces:
            while a < b and state.open:
                # a late excursion waits for its return: judged again after each counted report
                if run(d, state, device_id, a, a + 1, False) >= 0:
                    events += late.follow(state, device_id, cache.rules, deleted)
                a += 1
            if a < b:
                run(d, state, device_id, a, b, (a, b) == (lo, hi))
            if replayed is not None:
                events += late.replay(state, device_id, [(ts[r], lat[r], lon[r], matched[r]) for r in replayed],
                                      cache.rules, deleted)
        row = int(latest_row[d])
        if row >= 0:
            _keep_readings(state, batteries[row], accuracies[row])
    return Outcome(events, dropped, latest_row, ts, lat, lon)


def _keep_readings(state: DeviceState, battery: float, accuracy: float) -> None:
    """The device's last counted report's battery (NaN: not given, the last known one stays) and
    accuracy (NaN: not given, so none)."""
    if battery == battery:
        state.battery = battery
    state.accuracy = None if accuracy != accuracy else accuracy


def late_pieces(late_rows: np.ndarray, counted_rows: np.ndarray, lo: int, hi: int
                ) -> list[tuple[int, int, list[int] | None]]:
    """One device's rows lo:hi cut where its late fixes are replayed: (start, stop, late rows replayed
    after advancing start:stop, or None). Each late fix is replayed before the first counted report
    after it, or at the end: its outcome then does not depend on where the batches fall."""
    nxt = np.searchsorted(counted_rows, late_rows)
    after = np.r_[counted_rows, hi]                  # no counted report after: at the end
    at = after[nxt]
    pieces: list[tuple[int, int, list[int] | None]] = []
    start = lo
    cuts, first = np.unique(at, return_index=True)
    for cut, group in zip(cuts.tolist(), np.split(late_rows, first[1:])):
        pieces.append((start, cut, group.tolist()))
        start = cut
    if start < hi:
        pieces.append((start, hi, None))
    return pieces


def matched_sets(n: int, point_idx: np.ndarray, codes: np.ndarray, names: np.ndarray
                  ) -> tuple[list[frozenset[str]], np.ndarray]:
    """The distinct fence sets the points fell in, and each point's set (index; 0 = no fence).
    One frozenset per distinct set, not per point: the points' fence codes are rows of a matrix
    (padded with -1), numbered by their distinct values."""
    set_of_point = np.zeros(n, dtype=np.int64)
    if not len(point_idx):
        return [frozenset()], set_of_point
    # point_idx is in point order and a point's fences come in the index's fixed order, so equal
    # sets give equal rows (were one ever listed in another order, it would only count as distinct)
    starts = np.flatnonzero(np.r_[True, point_idx[1:] != point_idx[:-1]])
    sizes = np.diff(np.r_[starts, len(point_idx)])
    rows = np.full((len(starts), int(sizes.max())), -1, dtype=np.int64)
    rows[np.repeat(np.arange(len(starts)), sizes), np.arange(len(point_idx)) - np.repeat(starts, sizes)] = codes
    # rows numbered by their distinct values with a hash, column by column (np.unique(axis=0) sorted
    # the rows: ~3% of a sparse flood's workers, whose points meet several fences of 100k): each step
    # numbers (number so far, next column), in order of first appearance, so a row is a set's first
    # where its number exceeds all before it
    which = np.zeros(len(rows), dtype=np.int64)
    for column in rows.T:
        which, _ = pd.factorize(which * (len(names) + 1) + (column + 1))
    first = np.flatnonzero(np.r_[True, which[1:] > np.maximum.accumulate(which)[:-1]])
    distinct = rows[first]
    sets = [frozenset()] + [frozenset(names[row[row >= 0]].tolist()) for row in distinct]
    set_of_point[point_idx[starts]] = which.ravel() + 1
    return sets, set_of_point
