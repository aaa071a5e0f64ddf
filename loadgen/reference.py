"""Reference of the full event semantics, report by report, with plain shapely: the oracle the
vectorized job is checked against (tests/unit/test_sparse_property.py) and the benchmarks' expected
events for tracks with sparse and late fixes.

On purpose naive and written apart from the job: one device, one report, one fence at a time;
membership is `covers` of the point (boundary counts), distances and segment stretches are shapely
calls on single geometries. The rules (docs/events.md):

* a report counts unless it is older than the device's last counted one, or repeats it exactly;
* a fence outside its window [active_from, active_to) does not exist for a report: its state is
  dropped without an event;
* debounce: `debounce_reports` reports in a row, or a streak lasting `debounce_seconds`, flip the
  confirmed state (ENTER/EXIT at the confirming report's ts); DWELL once per stay;
* APPROACH: confirmed inside, this report inside and within warn_m metres of the boundary, armed
  (a report since the last APPROACH, or since ENTER, was deeper than warn_m);
* inferred: on the segment from the previous counted report, before this report's step: a fence the
  device has no state for and this report is outside → each stretch inside touching neither end and
  at least min_stretch long gives ENTER, EXIT; a fence confirmed inside, nothing pending, this report
  inside → each gap between stretches at least min_stretch long gives EXIT, ENTER; interpolated ts,
  fence active at both; min_stretch = max(10 m, 2 x the larger accuracy_m of the two reports); a
  segment shorter than 30 m implies nothing;
* late: a report older than the device's last counted one, at most 24 h older, not before its first
  counted one nor before the end of a stay it has forgotten (it remembers 8), is kept (unless it
  repeats a live fix the device remembers); each time late fixes are added, per fence, over the kept
  late fixes and the device's last 4 counted (live) fixes of the last 24 h in time order: a late fix
  disagrees when its membership differs from the confirmed one at its time, a live fix when its
  membership differed from the confirmed state right after its own step; disagreement debounced by
  the fence's rule confirms a departure, agreement debounced again confirms the return; a departure
  whose streak holds a late fix and a return with the same confirmed membership at both give
  EXIT+ENTER (ENTER+EXIT when it was outside) at the two fixes, late, unless either of the two came
  out before (each excursion once, whole). A
  departure streak that began at or before the newest live fix the device forgot (or one older than
  24 h) is judged on late fixes only until it ends. While a departure (or a departure streak) with a
  late fix waits at the end of the timeline, each new counted report is followed by the same
  judgement. Late fixes are replayed where they arrived: before the device's next report that is not
  late (or at the end of the batch), so where the batches fall does not matter.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import shapely
from shapely.geometry import LineString, Point

MIN_STRETCH_M = 10.0
MIN_SEGMENT_M = 30.0


@dataclass(frozen=True)
class RefFence:
    uid: str                     # "farm/fence"
    geometry: shapely.Geometry
    debounce_reports: int = 2
    debounce_seconds: float = 30.0
    dwell_seconds: float | None = None
    warn_m: float = 0.0
    active_from: int | None = None
    active_to: int | None = None

    def active(self, t: int) -> bool:
        return (self.active_from is None or t >= self.active_from) and (self.active_to is None or t < self.active_to)


@dataclass(frozen=True)
class RefReport:
    device: str                  # "farm/device"
    ts: int
    lat: float
    lon: float
    accuracy: float | None = None


@dataclass(frozen=True)
class RefEvent:
    device_id: str
    fence_id: str
    type: str
    ts: int
    inferred: bool = False
    late: bool = False
    farm_id: str = ""

    @property
    def event_id(self) -> str:
        tag = "inferred" if self.inferred else ("late" if self.late else "")
        text = f"{self.farm_id}/{self.fence_id}|{self.device_id}|{self.type}|{self.ts}" + (f"|{tag}" if tag else "")
        return hashlib.sha1(text.encode()).hexdigest()[:24]


@dataclass
class _Fence:
    inside: bool = False
    streak: int = 0
    t0: int = 0
    since: int | None = None
    dwelled: bool = False
    armed: bool = False


@dataclass
class _Device:
    last: RefReport | None = None
    first_ts: int | None = None
    fences: dict[str, _Fence] = field(default_factory=dict)
    stays: list[tuple[str, int, int]] = field(default_factory=list)    # every confirmed stay that ended
    late: dict[tuple[int, float, float], set[str]] = field(default_factory=dict)
    emitted: set[str] = field(default_factory=set)
    # the last LIVE counted reports: (ts, lat, lon, fences it disagreed with right after its step)
    live: list[tuple[int, float, float, frozenset[str]]] = field(default_factory=list)
    forgot: int | None = None           # ts of the newest counted report no longer in `live`
    waiting: bool = False               # a late departure waits for its return

    def end_stay(self, uid: str, since: int | None, t: int) -> None:
        """A stay ended; the oldest ones are forgotten, and late fixes before their end with them."""
        if since is None:
            return
        self.stays.append((uid, since, t))
        while len(self.stays) > MAX_STAYS or self.stays[0][2] < t - HORIZON_MS:
            self.first_ts = max(self.first_ts, self.stays.pop(0)[2])

    def was_inside(self, uid: str, t: int) -> bool:
        now = self.fences.get(uid)
        if now is not None and now.inside and now.since is not None and now.since <= t:
            return True
        return any(u == uid and a <= t < b for u, a, b in self.stays)


HORIZON_MS = 24 * 3600 * 1000
MAX_STAYS = 8           # the device remembers its last 8 ended stays (and 24 h of them at most)
LIVE = 4                # ... and its last 4 counted reports


def _metres(lon0: float, lat0: float):
    """Local plane at (lon0, lat0): degrees → metres."""
    kx = 111_320.0 * math.cos(math.radians(lat0))
    return lambda x, y: ((x - lon0) * kx, (y - lat0) * 110_574.0)


def boundary_distance(geom: shapely.Geometry, lon: float, lat: float) -> float:
    to_m = _metres(lon, lat)
    coords = shapely.get_coordinates(geom.boundary)
    x, y = to_m(coords[:, 0], coords[:, 1])
    moved = shapely.set_coordinates(shapely.transform(geom.boundary, lambda c: c), list(zip(x, y)))
    return moved.distance(Point(0.0, 0.0))


def _length_m(a: RefReport, b: RefReport) -> float:
    mid = math.radians((a.lat + b.lat) / 2.0)
    return math.hypot((b.lon - a.lon) * 111_320.0 * math.cos(mid), (b.lat - a.lat) * 110_574.0)


def _stretches(geom: shapely.Geometry, a: RefReport, b: RefReport) -> list[tuple[float, float]]:
    line = LineString([(a.lon, a.lat), (b.lon, b.lat)])
    pieces = []
    for part in shapely.get_parts(geom.intersection(line)):
        if part.geom_type != "LineString" or part.is_empty:
            continue
        f0 = line.project(Point(part.coords[0]), normalized=True)
        f1 = line.project(Point(part.coords[-1]), normalized=True)
        pieces.append((min(f0, f1), max(f0, f1)))
    merged: list[list[float]] = []
    for lo, hi in sorted(pieces):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def _at(a: RefReport, b: RefReport, fraction: float) -> int:
    return int(a.ts + math.floor(fraction * (b.ts - a.ts) + 0.5))


def _inferred(dev: _Device, fence: RefFence, inside_now: bool, a: RefReport, b: RefReport,
              line: LineString) -> list[tuple[str, int]]:
    state = dev.fences.get(fence.uid)
    if state is None and not inside_now:
        both_inside = False
    elif state is not None and state.inside and not state.streak and inside_now:
        both_inside = True
    else:
        return []
    minx, miny, maxx, maxy = fence.geometry.bounds
    if max(a.lon, b.lon) < minx or min(a.lon, b.lon) > maxx or max(a.lat, b.lat) < miny or min(a.lat, b.lat) > maxy:
        return []
    if not fence.geometry.intersects(line):
        return []
    length = _length_m(a, b)
    accuracies = [x for x in (a.accuracy, b.accuracy) if x is not None]
    need = max(MIN_STRETCH_M, 2.0 * max(accuracies, default=0.0))
    if length < need:
        return []
    stretches = _stretches(fence.geometry, a, b)
    out = []
    if both_inside:
        for (_, lo), (hi, _) in zip(stretches, stretches[1:]):
            if (hi - lo) * length >= need:
                out.append((("exit", _at(a, b, lo)), ("enter", _at(a, b, hi))))
    else:
        for lo, hi in stretches:
            if lo > 0.0 and hi < 1.0 and (hi - lo) * length >= need:
                out.append((("enter", _at(a, b, lo)), ("exit", _at(a, b, hi))))
    return [e for pair in out if fence.active(pair[0][1]) and fence.active(pair[1][1]) for e in pair]


def _step(state: _Fence, fence: RefFence, inside: bool, t: int) -> str | None:
    if inside == state.inside:
        state.streak = 0
        if inside and fence.dwell_seconds and not state.dwelled and state.since is not None \
                and t - state.since >= fence.dwell_seconds * 1000:
            state.dwelled = True
            return "dwell"
        return None
    if state.streak == 0:
        state.t0 = t
    state.streak += 1
    if state.streak < fence.debounce_reports and t - state.t0 < fence.debounce_seconds * 1000:
        return None
    state.inside, state.streak, state.dwelled, state.armed = inside, 0, False, False
    state.since = t if inside else None
    return "enter" if inside else "exit"


class Reference:
    """Feed reports in arrival order (`feed`), read `events`. Fences apply to devices of their farm."""

    def __init__(self, fences: list[RefFence]):
        self.fences = sorted(fences, key=lambda f: f.uid)
        self.devices: dict[str, _Device] = {}
        self.events: list[RefEvent] = []
        self._by_farm: dict[str, list[RefFence]] = {}
        for f in self.fences:                   # grouped once: a scan per farm is quadratic at 100k fences
            self._by_farm.setdefault(f.uid.partition("/")[0], []).append(f)

    def feed_batch(self, reports: list[RefReport]) -> None:
        """Reports arriving together: each in turn; a device's late ones are replayed together before
        its next report that is not late, or at the end of the batch."""
        late: dict[str, list[RefReport]] = {}
        for report in reports:
            self.feed_arriving(report, late)
        for device, fixes in late.items():
            self._replay(device, fixes)

    def feed_arriving(self, report: RefReport, late: dict[str, list[RefReport]],
                      inside: dict[str, bool] | None = None) -> None:
        """One report of a batch: a late one waits in `late` (device → fixes) for its device's next
        report that is not late, which first replays them; `inside` as for `feed`."""
        dev = self.devices.get(report.device)
        if dev is not None and dev.last is not None and report.ts < dev.last.ts:
            late.setdefault(report.device, []).append(report)
            return
        waiting = late.pop(report.device, None)
        if waiting:
            self._replay(report.device, waiting)
        self.feed(report, inside)

    def _mine(self, device: str) -> list[RefFence]:
        return self.fences_of_farm(device.partition("/")[0])

    def fences_of_farm(self, farm: str) -> list[RefFence]:
        return self._by_farm.get(farm, [])

    def _replay(self, device: str, fixes: list[RefReport]) -> None:
        dev = self.devices[device]
        start = max(dev.last.ts - HORIZON_MS, dev.first_ts)
        dev.late = {k: v for k, v in dev.late.items() if k[0] >= start}
        remembered = {(t, lat, lon) for t, lat, lon, _ in dev.live}
        added = False
        for r in fixes:
            key = (r.ts, r.lat, r.lon)
            if r.ts >= start and key not in dev.late and key not in remembered:
                point = Point(r.lon, r.lat)
                dev.late[key] = {f.uid for f in self._mine(device) if f.geometry.covers(point)}
                added = True
        if added:
            self._judge(device)

    def _judge(self, device: str) -> None:
        dev = self.devices[device]
        start = max(dev.last.ts - HORIZON_MS, dev.first_ts)
        dev.late = {k: v for k, v in dev.late.items() if k[0] >= start}
        dev.waiting = False
        if not dev.late:
            return
        forgot = max([t for t, _, _, _ in dev.live if t < start] + ([dev.forgot] if dev.forgot is not None else []),
                     default=None)
        fixes = [(k, True, v) for k, v in dev.late.items()]
        fixes += [((t, lat, lon), False, d) for t, lat, lon, d in dev.live if t >= start]
        fixes.sort(key=lambda f: f[0])
        farm, _, device_id = device.partition("/")
        for fence in self._mine(device):
            away, streak, t0 = False, 0, 0
            departure = None                # (ts, confirmed inside, a late fix in its streak)
            late_in_streak = only_late = False
            for (t, lat, lon), is_late, fences in fixes:
                if only_late and not is_late:
                    continue
                base = dev.was_inside(fence.uid, t)
                if is_late:
                    disagree = (fence.uid in fences and fence.active(t)) != base
                else:
                    disagree = fence.uid in fences
                if disagree == away:
                    streak = 0
                    if not away:
                        only_late = False
                    continue
                if streak == 0:
                    t0, late_in_streak = t, False
                    if not away:
                        only_late = forgot is not None and t <= forgot
                late_in_streak = late_in_streak or is_late
                streak += 1
                if streak < fence.debounce_reports and t - t0 < fence.debounce_seconds * 1000:
                    continue
                streak, away = 0, disagree
                if away:
                    departure = (t, base, late_in_streak)
                    continue
                if departure is not None and departure[2] and departure[1] == base:
                    kinds = ("exit", "enter") if base else ("enter", "exit")
                    pair = [RefEvent(device_id, fence.uid.partition("/")[2], kind, at, late=True, farm_id=farm)
                            for kind, at in zip(kinds, (departure[0], t))]
                    if all(e.event_id not in dev.emitted for e in pair):     # whole, once
                        dev.emitted.update(e.event_id for e in pair)
                        self.events += pair
                departure, only_late = None, False
            if not only_late and ((away and departure is not None and departure[2])
                                  or (not away and streak and late_in_streak)):
                dev.waiting = True

    def feed(self, report: RefReport, inside: dict[str, bool] | None = None) -> None:
        """One report; `inside`: its membership per fence of its farm, when the caller computed it."""
        dev = self.devices.setdefault(report.device, _Device())
        last = dev.last
        if last is not None and (report.ts < last.ts or (report.ts == last.ts and (report.lat, report.lon)
                                                        == (last.lat, last.lon))):
            return
        if dev.first_ts is None:
            dev.first_ts = report.ts
        farm, _, device_id = report.device.partition("/")
        mine = self._mine(report.device)
        if inside is None:
            point = Point(report.lon, report.lat)
            inside = {f.uid: f.geometry.covers(point) for f in mine}
        if last is not None and _length_m(last, report) >= MIN_SEGMENT_M:    # shorter: implies nothing
            line = LineString([(last.lon, last.lat), (report.lon, report.lat)])
            for fence in mine:
                for kind, t in _inferred(dev, fence, inside[fence.uid], last, report, line):
                    self.events.append(RefEvent(device_id, fence.uid.partition("/")[2], kind, t, inferred=True,
                                                farm_id=farm))
        dev.last = report
        for fence in mine:
            if not fence.active(report.ts):
                gone = dev.fences.pop(fence.uid, None)
                if gone is not None and gone.inside:
                    dev.end_stay(fence.uid, gone.since, report.ts)
                continue
            state = dev.fences.get(fence.uid) or _Fence()
            now_in = inside[fence.uid]
            since = state.since
            kind = _step(state, fence, now_in, report.ts)
            if kind == "exit":
                dev.end_stay(fence.uid, since, report.ts)
            if kind:
                self.events.append(RefEvent(device_id, fence.uid.partition("/")[2], kind, report.ts, farm_id=farm))
            if fence.warn_m and state.inside and now_in:
                if boundary_distance(fence.geometry, report.lon, report.lat) > fence.warn_m:
                    state.armed = True
                elif state.armed:
                    state.armed = False
                    self.events.append(RefEvent(device_id, fence.uid.partition("/")[2], "approach", report.ts,
                                                farm_id=farm))
            if state.inside or state.streak:
                dev.fences[fence.uid] = state
            else:
                dev.fences.pop(fence.uid, None)
        after = {u for u, s in dev.fences.items() if s.inside}
        differ = frozenset(f.uid for f in mine if (inside[f.uid] and f.active(report.ts)) != (f.uid in after))
        dev.live.append((report.ts, report.lat, report.lon, differ))
        if len(dev.live) > LIVE:
            dev.forgot = dev.live.pop(0)[0]
        if dev.waiting:
            self._judge(report.device)

    def members(self, uid: str) -> set[str]:
        return {d for d, dev in self.devices.items() if uid in dev.fences and dev.fences[uid].inside}


def expected_events(reports_df, fences, device_farm, workers: int | None = None) -> "pd.DataFrame":
    """The benchmarks' oracle over a whole run: loadgen.oracle.expected_events (this reference, one
    farm at a time)."""
    from loadgen.oracle import expected_events as judge
    return judge(reports_df, fences, device_farm, workers)
