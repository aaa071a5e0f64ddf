"""Per-device fence state machine: debounced ENTER/EXIT (and DWELL, APPROACH), inferred crossings,
deterministic event ids.

For each (device, fence) a confirmed state (initially outside) and a streak of reports that contradict
it. A streak of `debounce_reports` reports, or one lasting `debounce_seconds` of report time, flips the
confirmed state and emits the event, stamped with the confirming report's time. Reports older than the
device's last processed report, or repeating it exactly, are skipped: state never rewinds.
A fence outside its active window does not exist for a report: its state is dropped without an event.
APPROACH: a confirmed-inside device whose report lies within `warn_m` of the boundary, once armed
(armed by a report deeper inside than `warn_m`). Inferred crossings (`crossings.implied`) are checked
against the state before each report's step and never change it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fencing.model.crossings import Segment, implied
from fencing.model.fence_store import FenceRules

DEFAULT_RULES = FenceRules()
EMPTY: frozenset[str] = frozenset()
LATE_HORIZON_MS = 24 * 3600 * 1000      # late fixes older than this (before the last processed one) are not replayed
MAX_STAYS = 8                           # ended stays kept per device for late fixes (state size)
# processed fixes kept per device to judge late fixes against (fencing.model.late): a buffered night's
# return is often seen live first; a collar uploads its buffer within a few fixes of being back
MAX_LIVE_FIXES = 4


@dataclass(slots=True)     # slots: a batch builds one per device and fence, and reads them often
class FenceState:
    inside: bool = False
    streak: int = 0
    streak_t0: int = 0
    since: int | None = None
    dwelled: bool = False
    armed: bool = False          # APPROACH: the device was deeper inside than warn_m since its last one

    def to_list(self) -> list:
        return [int(self.inside), self.streak, self.streak_t0, self.since, int(self.dwelled), int(self.armed)]

    @classmethod
    def from_list(cls, v: list) -> "FenceState":
        return cls(bool(v[0]), int(v[1]), int(v[2]), v[3], bool(v[4]), bool(v[5]) if len(v) > 5 else False)


@dataclass(slots=True)
class DeviceState:
    last_ts: int | None = None
    last_lat: float | None = None
    last_lon: float | None = None
    battery: float | None = None
    cell: str | None = None                       # res-7 cell of the latest position (pull index)
    fences: dict[str, FenceState] = field(default_factory=dict)
    seen: int | None = None                       # arrival (ms) last written to the last-seen index
    accuracy: float | None = None                 # accuracy_m of the last processed report, if it said
    # what late fixes are judged against (fencing.model.late), all bounded: the confirmed stays that
    # ended in the last 24 h (uid, from, to), the time from which they are complete, the late fixes
    # kept (ts, lat, lon, fences), and the late events already emitted (id, ts); the last processed
    # fixes in their stored form (`live_fixes`: None = none kept), and whether a late excursion waits
    # for live fixes
    stays: list = field(default_factory=list)
    known_from: int | None = None
    late: list = field(default_factory=list)
    emitted: list = field(default_factory=list)
    live: list | None = None        # the fixes before the last report, oldest first, each as `_older`
    live_last: list | None = None   # the fences the last report disagreed with (None: none)
    live_gap: int | None = None     # ms from the oldest kept fix back to the newest forgotten (None: none)
    open: bool = False

    def to_dict(self) -> dict:
        out = {"t": self.last_ts, "la": self.last_lat, "lo": self.last_lon, "bt": self.battery, "c": self.cell,
               "f": {u: s.to_list() for u, s in self.fences.items()}, "sn": self.seen}
        if self.accuracy is not None:
            out["ac"] = self.accuracy
        if self.known_from is not None:
            out["kf"] = self.known_from
        if self.stays:      # times stored as ms before the last report: short numbers in every write
            last = self.last_ts or 0
            out["st"] = [[u, last - a, last - b] for u, a, b in self.stays]
        for key, value in (("lf", self.late), ("em", self.emitted)):
            if value:
                out[key] = value
        if self.live is not None:
            out["lv"] = self.live
            if self.live_last is not None:
                out["lm"] = self.live_last
            if self.live_gap is not None:
                out["lg"] = self.live_gap
        if self.open:
            out["op"] = 1
        return out

    @classmethod
    def from_dict(cls, d: dict | None) -> "DeviceState":
        if not d:
            return cls()
        state = cls(d.get("t"), d.get("la"), d.get("lo"), d.get("bt"), d.get("c"),
                    {u: FenceState.from_list(v) for u, v in d.get("f", {}).items()}, d.get("sn"), d.get("ac"),
                    known_from=d.get("kf"))
        if "st" in d or "lf" in d or "em" in d:     # stored only when there are some
            last = state.last_ts or 0
            state.stays = [[u, last - a, last - b] for u, a, b in d.get("st") or ()]
            state.late, state.emitted = d.get("lf") or [], d.get("em") or []
        if "lv" in d:       # stored as kept: decoded only when late fixes are judged (`live_fixes`)
            state.live, state.live_last, state.live_gap = d["lv"], d.get("lm"), d.get("lg")
        state.open = "op" in d
        return state

    def close_stay(self, uid: str, since: int | None, t: int) -> None:
        """A confirmed stay in `uid` ended at t (EXIT, or its window closed): kept for late fixes,
        24 h and MAX_STAYS at most (what falls off moves `known_from` on). Stays end in time order."""
        if since is None:
            return
        stays = self.stays
        stays.append([uid, since, t])
        while len(stays) > MAX_STAYS or stays[0][2] < t - LATE_HORIZON_MS:
            gone = stays.pop(0)
            if self.known_from is not None:
                self.known_from = max(self.known_from, gone[2])

    def remember(self, before: tuple | None, fixes: list[list]) -> None:
        """Processed fixes [ts, lat, lon, disagreeing fences or None], in order, the last of them now
        the last report, join the last MAX_LIVE_FIXES kept (late fixes are judged against them); the
        newest forgotten one is remembered by its time (a late excursion that began before it cannot
        be witnessed by live fixes). `before`: (ts, lat, lon) of the last report before them (None: a
        new device). Only the fixes added are encoded: a steady device pays for one a batch."""
        older = self.live
        if older is not None and before is not None and len(fixes) == 1 and len(older) == MAX_LIVE_FIXES - 1:
            fix = fixes[0]          # the usual: one more fix, the oldest forgotten
            step = [fix[0] - before[0], _near(before[1], fix[1]), _near(before[2], fix[2])]
            if self.live_last is not None:
                step.append(self.live_last)
            self.live_gap, self.live, self.live_last = older[0][0], older[1:] + [step], fix[3]
            return
        if older is None:           # a new device, or one kept from before live fixes were
            older = []
            if before is not None:
                self.live_gap = fixes[0][0] - before[0]
        elif before is not None:
            fixes = [[before[0], before[1], before[2], self.live_last]] + fixes
        # the stored list would be `older` + each fix relative to the next: only its last
        # MAX_LIVE_FIXES - 1 are kept, so only those are encoded; the newest dropped gives the gap
        keep, pairs = MAX_LIVE_FIXES - 1, len(fixes) - 1
        new = [_older(fixes[i], fixes[i + 1]) for i in range(max(0, pairs - keep), pairs)]
        dropped = len(older) + pairs - keep - 1          # its index in that list (< 0: none dropped)
        if dropped >= 0:
            self.live_gap = older[dropped][0] if dropped < len(older) else \
                fixes[dropped - len(older) + 1][0] - fixes[dropped - len(older)][0]
        self.live = older[max(0, len(older) - (keep - len(new))):] + new if len(new) < keep else new
        self.live_last = fixes[-1][3]

    def live_fixes(self) -> tuple[list[list], int | None]:
        """The kept live fixes [ts, lat, lon, disagreeing fences or None] oldest first (the last one:
        the last report), and the time of the newest one forgotten (None: none; a state from before
        live fixes were kept has them all forgotten)."""
        if self.last_ts is None:
            return [], None
        if self.live is None:
            return [], self.last_ts
        t, la, lo = self.last_ts, self.last_lat, self.last_lon
        out = [[t, la, lo, self.live_last]]
        for step in reversed(self.live):
            t, la, lo = t - step[0], _far(step[1], la), _far(step[2], lo)
            out.append([t, la, lo, step[3] if len(step) > 3 else None])
        out.reverse()
        return out, None if self.live_gap is None else out[0][0] - self.live_gap

    def inside_fences(self) -> list[str]:
        return sorted(u for u, s in self.fences.items() if s.inside)

    def accept(self, t: int, lat: float, lon: float) -> bool:
        """A report counts unless it is older than the last processed one, or repeats it (same time and
        place: a retried post) — so state never rewinds and a retry never pushes a debounce streak."""
        if self.last_ts is not None:
            if t < self.last_ts or (t == self.last_ts and (lat, lon) == (self.last_lat, self.last_lon)):
                return False
        if self.known_from is None:       # stays are complete from here on (see `take`)
            self.known_from = t if self.last_ts is None else self.last_ts
        self.last_ts, self.last_lat, self.last_lon = t, lat, lon
        return True

    def take(self, t: int, lat: float, lon: float) -> None:
        """Make (t, lat, lon) the last processed report. Stays are complete from the first one on (a
        state from before stays were kept: from its last report)."""
        if self.known_from is None:
            self.known_from = t if self.last_ts is None else self.last_ts
        self.last_ts, self.last_lat, self.last_lon = t, lat, lon


def _older(a: list, b: list) -> list:
    """A kept fix `a` as stored, relative to the one after it, `b`: [ms before b, lat, lon(, fences it
    disagreed with)] — a chain, so a new fix leaves the stored ones as they are."""
    out = [b[0] - a[0], _near(a[1], b[1]), _near(a[2], b[2])]
    if a[3] is not None:
        out.append(a[3])
    return out


def _near(value: float, ref: float) -> float | int:
    """A kept fix's coordinate as stored: whole 1e-7 degrees from the last report's when that gives it
    back exactly (a GPS fix has 7 decimals at most: 3-5 digits instead of 10-17), else itself. An
    integer of 1e-7 degrees divided by 1e7 is the float nearest that decimal, the one JSON gave."""
    steps = round(value * 1e7)
    return steps - round(ref * 1e7) if steps / 1e7 == value else value


def _far(stored: float | int, ref: float) -> float:
    return (stored + round(ref * 1e7)) / 1e7 if type(stored) is int else stored


@dataclass(slots=True)        # not frozen: one is built per device and batch (see Event)
class Advanced:
    events: list["Event"]
    last: int            # index of the last report that counted, -1 when none did
    dropped: list[tuple[str, int]] = field(default_factory=list)   # (uid, ts): left members silently


@dataclass
class Event:
    """A fence event (never changed once made; not frozen: a frozen dataclass takes ~1.5 µs to build
    against ~0.3 µs, at hundreds of thousands of events a batch of sparse collars)."""
    event_id: str
    type: str
    farm_id: str
    device_id: str
    fence_id: str
    ts: int
    lat: float
    lon: float
    inferred: bool = False       # implied by the segment between two fixes
    late: bool = False           # revealed by a fix older than the device's last processed one


def state_before(record: dict | None, version: str) -> dict | None:
    """A device's stored state record → its state before batch `version`.

    Records are {"b": version that wrote it, "s": state after, "d": what the state before had
    different from "s", "x": keys of "s" the state before did not have} ("d" absent: there was no
    state before); a replay of the batch that wrote the record (same `version`, "<run id>:<batch
    id>") must start from the state before, any later batch from "s". Records written before the
    delta (issue 23) carry the whole state before as "p". The one reader of these records: the
    process stage and load shedding both use it."""
    if record is None:
        return None
    if record.get("b") != version:
        return record.get("s")
    if "d" in record:
        gone = record.get("x") or ()
        before = {k: v for k, v in (record.get("s") or {}).items() if k not in gone}
        before.update(record["d"])
        return before
    return record.get("p")


def state_record(version: str, after: dict, before: dict | None) -> dict:
    """The record `state_before` reads: the state before stored as its difference from the state
    after (a batch changes a few fields of a device; the rest would be a second copy in Redis)."""
    if before is None:
        return {"b": version, "s": after}
    record = {"b": version, "s": after, "d": {k: v for k, v in before.items() if k not in after or after[k] != v}}
    gone = [k for k in after if k not in before]
    if gone:
        record["x"] = gone
    return record


def event_id(fence_uid: str, device_id: str, kind: str, ts: int, tag: str = "") -> str:
    """sha of fence, device, kind, ts (and "inferred"/"late" for those): a replay makes the same id."""
    text = f"{fence_uid}|{device_id}|{kind}|{ts}" + (f"|{tag}" if tag else "")
    return hashlib.sha1(text.encode()).hexdigest()[:24]


def make_event(uid: str, device_id: str, kind: str, t: int, lat: float, lon: float,
               inferred: bool = False, late: bool = False) -> Event:
    farm_id, _, fence_id = uid.partition("/")
    tag = "inferred" if inferred else ("late" if late else "")
    return Event(event_id(uid, device_id, kind, t, tag), kind, farm_id, device_id, fence_id, t, lat, lon,
                 inferred, late)


def advance(state: DeviceState, device_id: str, ts: list[int], lat: list[float], lon: list[float],
            matched: list[frozenset[str]], rules: dict[str, FenceRules], deleted: set[str],
            uniform: bool | None = None, last_accepted: int | None = None,
            near: list[frozenset[str]] | None = None, segments: dict[int, Segment] | None = None,
            recent: list[int] | None = None) -> Advanced:
    """Apply one device's reports (in arrival order) to its state in place. `uniform`: whether every
    report matched the same fences, when the caller knows (it computed that for a whole batch).
    `last_accepted` and `recent`: the index of the last report `DeviceState.accept` takes (-1: none)
    and of the last MAX_LIVE_FIXES + 1 it takes (the oldest: the newest one forgotten), when the
    caller computed them for the whole batch (`sparse_batch.taken_rows`): a steady device then skips
    the per-report loop. `near`: per report,
    the matched fences whose boundary is within their warn_m (None: none anywhere). `segments`: report
    index → the segment from the previous processed fix to it, with the fences to check for inferred
    crossings (the caller found them). The reports taken are kept as live fixes (`DeviceState.remember`:
    late fixes are judged against them), each with the fences it disagreed with right after its step."""
    settled = _settled(state, rules, deleted)
    steady = uniform is not False and settled is not None and not segments and (
        not matched or (matched[0] == settled if uniform else all(m == settled for m in matched)))
    if steady and last_accepted is not None and recent is not None:
        advance_steady(state, ts, lat, lon, 0, last_accepted, recent)
        return Advanced([], last_accepted)
    before = None if state.last_ts is None else (state.last_ts, state.last_lat, state.last_lon)
    events: list[Event] = []
    dropped: list[tuple[str, int]] = []
    last = -1
    taken: list[int] = []
    disagreed: dict[int, list[str]] = {}
    for i, (t, la, lo, inside_now) in enumerate(zip(ts, lat, lon, matched)):
        if not state.accept(t, la, lo):
            continue
        last = i
        taken.append(i)
        if segments and i in segments:
            infer_crossings(state, device_id, segments[i], inside_now, rules, deleted, la, lo, events)
        if settled is not None and inside_now == settled:
            continue            # agrees with the confirmed state, nothing pending or timed: no change
        step_report(state, device_id, t, la, lo, inside_now, rules, deleted, events,
                    near[i] if near is not None else EMPTY, dropped)
        settled = _settled(state, rules, deleted)
        if recent is None or i in recent:      # only the reports kept as live fixes need them
            differ = disagreeing(state, inside_now, t, rules)
            if differ:
                disagreed[i] = differ
    if taken:
        state.remember(before, [[ts[i], lat[i], lon[i], disagreed.get(i)] for i in taken[-MAX_LIVE_FIXES - 1:]])
    return Advanced(events, last, dropped)


def is_steady(state: DeviceState, first_matched: frozenset[str], rules: dict[str, FenceRules],
              deleted: set[str]) -> bool:
    """Whether reports that all matched `first_matched` leave the device's fences as they are: nothing
    pending, timed or deleted, and the reports agree with the confirmed state (the common case)."""
    return _settled(state, rules, deleted) == first_matched


def advance_steady(state: DeviceState, ts: list[int], lat: list[float], lon: list[float], at: int,
                   last_accepted: int, recent: list[int]) -> None:
    """A steady device's reports ts[at:...] (`is_steady`; `last_accepted` and `recent` relative to
    `at`, as `advance` takes them): only its last report and its live fixes change."""
    if last_accepted < 0:
        return
    before = None if state.last_ts is None else (state.last_ts, state.last_lat, state.last_lon)
    if state.known_from is None:
        state.take(ts[at], lat[at], lon[at])            # a new device's first report is always taken
    last = at + last_accepted
    state.take(ts[last], lat[last], lon[last])
    state.remember(before, [[ts[at + i], lat[at + i], lon[at + i], None] for i in recent])


def disagreeing(state: DeviceState, inside_now: frozenset[str], t: int, rules: dict[str, FenceRules]
                ) -> list[str] | None:
    """The fences a processed report's membership differs from the confirmed state on, right after its
    step (a stray, a streak not yet confirmed; a fence outside its window counts as not matched)."""
    confirmed = {u for u, s in state.fences.items() if s.inside}
    if inside_now == confirmed:
        return None
    differ = sorted(u for u in inside_now ^ confirmed if u in confirmed or rules.get(u, DEFAULT_RULES).active(t))
    return differ or None


def infer_crossings(state: DeviceState, device_id: str, segment: Segment, inside_now: frozenset[str],
                    rules: dict[str, FenceRules], deleted: set[str], lat: float, lon: float,
                    events: list[Event]) -> None:
    """Implied events of the segment ending at this report, judged on the state before its step: a
    fence the device is not in at all (no state) and this report is outside, or one it is confirmed
    inside with nothing pending and this report is inside. Each event needs the fence active at its
    time; the events carry this report's position."""
    for uid, stretches in segment.fences:
        if uid in deleted:
            continue
        fence_state = state.fences.get(uid)
        if fence_state is None and uid not in inside_now:
            both_inside = False
        elif fence_state is not None and fence_state.inside and not fence_state.streak and uid in inside_now:
            both_inside = True
        else:
            continue
        rule = rules.get(uid, DEFAULT_RULES)
        found = implied(segment, stretches, both_inside)
        for k in range(0, len(found), 2):
            (kind_a, t_a), (kind_b, t_b) = found[k], found[k + 1]
            if rule.active(t_a) and rule.active(t_b):
                events += [make_event(uid, device_id, kind_a, t_a, lat, lon, inferred=True),
                           make_event(uid, device_id, kind_b, t_b, lat, lon, inferred=True)]


def step_report(state: DeviceState, device_id: str, t: int, lat: float, lon: float, inside_now: frozenset[str],
                rules: dict[str, FenceRules], deleted: set[str], events: list[Event],
                near: frozenset[str] = frozenset(), dropped: list[tuple[str, int]] | None = None) -> None:
    """The rule for one counting report: every fence it or the state names takes a step (its events
    appended to `events`); deleted fences are forgotten, fences outside their window too (a confirmed
    member goes to `dropped`). `near`: the fences whose boundary the report is within warn_m of."""
    for uid in sorted(inside_now | state.fences.keys()):
        if uid in deleted:
            state.fences.pop(uid, None)
            continue
        rule = rules.get(uid, DEFAULT_RULES)
        watched = rule.watched
        if watched and rule.windowed and not rule.active(t):
            gone = state.fences.pop(uid, None)
            if gone is not None and gone.inside:
                state.close_stay(uid, gone.since, t)
                if dropped is not None:
                    dropped.append((uid, t))
            continue
        fence_state = state.fences.get(uid) or FenceState()
        since = fence_state.since
        kind = step_fence(fence_state, uid in inside_now, t, rule)
        if kind:
            farm_id, _, fence_id = uid.partition("/")     # make_event, inlined: the hot path's events
            events.append(Event(event_id(uid, device_id, kind, t), kind, farm_id, device_id, fence_id, t, lat, lon))
            if kind == "exit":
                state.close_stay(uid, since, t)
        if watched and rule.warn_m and fence_state.inside and uid in inside_now:
            if uid not in near:
                fence_state.armed = True
            elif fence_state.armed:
                fence_state.armed = False
                events.append(make_event(uid, device_id, "approach", t, lat, lon))
        if fence_state.inside or fence_state.streak:
            state.fences[uid] = fence_state
        else:
            state.fences.pop(uid, None)


def last_accepted_reports(starts: np.ndarray, ts: np.ndarray, last_ts: list[int | None]
                          ) -> tuple[np.ndarray, np.ndarray]:
    """`DeviceState.accept` for a whole batch at once. The reports are grouped by device (device d's
    run starts at starts[d]) in arrival order; last_ts[d] is the device's last processed report time.
    A report counts when it is newer than every earlier one of its device (and than last_ts), so
    the running maximum decides, except for a report at exactly that maximum: then accept compares
    positions, which the per-report loop does. Returns the index of each device's last counting
    report (-1: none) and a per-device flag: a tie, leave it to the loop."""
    taken, tie = _accept_scan(starts, ts, last_ts)
    n = len(ts)
    row = np.arange(n, dtype=np.int64)
    last = np.maximum.reduceat(np.where(taken, row, -1), starts) if n else np.empty(0, np.int64)
    tied = np.add.reduceat(tie.astype(np.int64), starts) > 0 if n else np.empty(0, bool)
    return np.where(last >= 0, last - starts, -1), tied


def accepted_rows(starts: np.ndarray, ts: np.ndarray, last_ts: list[int | None]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per report: whether `DeviceState.accept` takes it, whether it is older than the newest report
    of its device at its arrival (a late fix), and per device whether a tie leaves that to the
    per-report rule (then the row flags of that device are not decided here)."""
    taken, tie = _accept_scan(starts, ts, last_ts)
    tied = np.add.reduceat(tie.astype(np.int64), starts) > 0 if len(ts) else np.empty(0, bool)
    return taken, ~taken & ~tie, tied


def _accept_scan(starts: np.ndarray, ts: np.ndarray, last_ts: list[int | None]) -> tuple[np.ndarray, np.ndarray]:
    """(newer than every earlier report of its device, equal to the newest so far) per report."""
    n = len(ts)
    sizes = np.diff(np.r_[starts, n])
    device_of_row = np.repeat(np.arange(len(starts)), sizes)
    # times as ranks among the batch's distinct times, doubled: a report's time t is 2k+1, a device's
    # last_ts between two of them 2k, so order and ties are kept in a small integer range
    rank, distinct = pd.factorize(np.asarray(ts, dtype=np.int64), sort=True)
    value = 2 * rank.astype(np.int64) + 1
    before = np.zeros(len(starts), dtype=np.int64)            # 0: below every report
    known = np.array([t is not None for t in last_ts], dtype=bool)
    if known.any():
        lt = np.array([t for t in last_ts if t is not None], dtype=np.int64)
        at = np.searchsorted(distinct, lt, side="left")
        equal = (at < len(distinct)) & (distinct[np.minimum(at, len(distinct) - 1)] == lt)
        before[known] = 2 * at + equal
    # running maximum per device: offset each device's values above all earlier devices' values
    span = 2 * len(distinct) + 2
    running = np.maximum.accumulate(device_of_row * span + value)
    earlier = np.full(n, -1, dtype=np.int64)
    earlier[1:] = running[:-1] - device_of_row[1:] * span     # negative at a device's first report
    newest = np.maximum(earlier, before[device_of_row])
    return value > newest, value == newest


def _settled(state: DeviceState, rules: dict[str, FenceRules], deleted: set[str]) -> frozenset[str] | None:
    """The fences the device is confirmed inside when nothing is pending, timed or deleted (the common
    case: a cow grazing inside its paddock, or outside all fences): a report that matches exactly
    those changes nothing. None when a report could change something whatever it matched."""
    for uid, fence_state in state.fences.items():
        if fence_state.streak or not fence_state.inside:
            return None
        rule = rules.get(uid, DEFAULT_RULES)
        if rule.watched or (rule.dwell_seconds and not fence_state.dwelled):
            return None
    if deleted and not deleted.isdisjoint(state.fences):
        return None
    return frozenset(state.fences)


def step_fence(s: FenceState, inside: bool, t: int, rules: FenceRules) -> str | None:
    """One fence's debounce: a report inside or not; "enter"/"exit" when it confirms a flip, "dwell"."""
    if inside == s.inside:
        s.streak = 0
        if inside and rules.dwell_seconds and not s.dwelled and s.since is not None \
                and t - s.since >= rules.dwell_seconds * 1000:
            s.dwelled = True
            return "dwell"
        return None
    if s.streak == 0:
        s.streak_t0 = t
    s.streak += 1
    if s.streak < rules.debounce_reports and t - s.streak_t0 < rules.debounce_seconds * 1000:
        return None
    s.inside, s.streak, s.dwelled, s.armed = inside, 0, False, False
    s.since = t if inside else None
    return "enter" if inside else "exit"
