"""Per-device fence state machine: debounced ENTER/EXIT (and DWELL), deterministic event ids.

For each (device, fence) a confirmed state (initially outside) and a streak of reports that contradict
it. A streak of `debounce_reports` reports, or one lasting `debounce_seconds` of report time, flips the
confirmed state and emits the event, stamped with the confirming report's time. Reports older than the
device's last processed report, or repeating it exactly, are skipped: state never rewinds.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fencing.model.fence_store import FenceRules

DEFAULT_RULES = FenceRules()


@dataclass
class FenceState:
    inside: bool = False
    streak: int = 0
    streak_t0: int = 0
    since: int | None = None
    dwelled: bool = False

    def to_list(self) -> list:
        return [int(self.inside), self.streak, self.streak_t0, self.since, int(self.dwelled)]

    @classmethod
    def from_list(cls, v: list) -> "FenceState":
        return cls(bool(v[0]), int(v[1]), int(v[2]), v[3], bool(v[4]))


@dataclass
class DeviceState:
    last_ts: int | None = None
    last_lat: float | None = None
    last_lon: float | None = None
    battery: float | None = None
    cell: str | None = None                       # res-7 cell of the latest position (pull index)
    fences: dict[str, FenceState] = field(default_factory=dict)
    seen: int | None = None                       # arrival (ms) last written to the last-seen index

    def to_dict(self) -> dict:
        return {"t": self.last_ts, "la": self.last_lat, "lo": self.last_lon, "bt": self.battery, "c": self.cell,
                "f": {u: s.to_list() for u, s in self.fences.items()}, "sn": self.seen}

    @classmethod
    def from_dict(cls, d: dict | None) -> "DeviceState":
        if not d:
            return cls()
        return cls(d.get("t"), d.get("la"), d.get("lo"), d.get("bt"), d.get("c"),
                   {u: FenceState.from_list(v) for u, v in d.get("f", {}).items()}, d.get("sn"))

    def inside_fences(self) -> list[str]:
        return sorted(u for u, s in self.fences.items() if s.inside)

    def accept(self, t: int, lat: float, lon: float) -> bool:
        """A report counts unless it is older than the last processed one, or repeats it (same time and
        place: a retried post) — so state never rewinds and a retry never pushes a debounce streak."""
        if self.last_ts is not None:
            if t < self.last_ts or (t == self.last_ts and (lat, lon) == (self.last_lat, self.last_lon)):
                return False
        self.last_ts, self.last_lat, self.last_lon = t, lat, lon
        return True


@dataclass(frozen=True)
class Advanced:
    events: list["Event"]
    last: int            # index of the last report that counted, -1 when none did


@dataclass(frozen=True)
class Event:
    event_id: str
    type: str
    farm_id: str
    device_id: str
    fence_id: str
    ts: int
    lat: float
    lon: float


def state_before(record: dict | None, version: str) -> dict | None:
    """A device's stored state record → its state before batch `version`.

    Records are {"b": version that wrote it, "s": state after, "p": state before}; a replay of the batch
    that wrote the record (same `version`, "<run id>:<batch id>") must start from "p", any later batch
    from "s". The one reader of these records: the process stage and load shedding both use it."""
    if record is None:
        return None
    return record.get("p") if record.get("b") == version else record.get("s")


def event_id(fence_uid: str, device_id: str, kind: str, ts: int) -> str:
    return hashlib.sha1(f"{fence_uid}|{device_id}|{kind}|{ts}".encode()).hexdigest()[:24]


def advance(state: DeviceState, device_id: str, ts: list[int], lat: list[float], lon: list[float],
            matched: list[frozenset[str]], rules: dict[str, FenceRules], deleted: set[str],
            uniform: bool | None = None, last_accepted: int | None = None) -> Advanced:
    """Apply one device's reports (in arrival order) to its state in place. `uniform`: whether every
    report matched the same fences, when the caller knows (it computed that for a whole batch).
    `last_accepted`: the index of the last report `DeviceState.accept` takes (-1: none), when the
    caller computed it for the whole batch (`last_accepted_reports`): a steady device then skips
    the per-report loop."""
    settled = _settled(state, rules, deleted)
    steady = uniform is not False and settled is not None and (
        not matched or (matched[0] == settled if uniform else all(m == settled for m in matched)))
    if steady and last_accepted is not None:
        if last_accepted >= 0:
            state.last_ts, state.last_lat, state.last_lon = ts[last_accepted], lat[last_accepted], lon[last_accepted]
        return Advanced([], last_accepted)
    events: list[Event] = []
    last = -1
    for i, (t, la, lo, inside_now) in enumerate(zip(ts, lat, lon, matched)):
        if not state.accept(t, la, lo):
            continue
        last = i
        if settled is not None and inside_now == settled:
            continue            # agrees with the confirmed state, nothing pending or timed: no change
        step_report(state, device_id, t, la, lo, inside_now, rules, deleted, events)
        settled = _settled(state, rules, deleted)
    return Advanced(events, last)


def step_report(state: DeviceState, device_id: str, t: int, lat: float, lon: float, inside_now: frozenset[str],
                rules: dict[str, FenceRules], deleted: set[str], events: list[Event]) -> None:
    """The rule for one counting report: every fence it or the state names takes a step (its events
    appended to `events`); deleted fences are forgotten."""
    for uid in sorted(inside_now | state.fences.keys()):
        if uid in deleted:
            state.fences.pop(uid, None)
            continue
        fence_state = state.fences.get(uid) or FenceState()
        kind = _step(fence_state, uid in inside_now, t, rules.get(uid, DEFAULT_RULES))
        if kind:
            farm_id, _, fence_id = uid.partition("/")
            events.append(Event(event_id(uid, device_id, kind, t), kind, farm_id, device_id, fence_id, t, lat, lon))
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
    row = np.arange(n, dtype=np.int64)
    last = np.maximum.reduceat(np.where(value > newest, row, -1), starts) if n else np.empty(0, np.int64)
    tied = np.add.reduceat((value == newest).astype(np.int64), starts) > 0 if n else np.empty(0, bool)
    return np.where(last >= 0, last - starts, -1), tied


def _settled(state: DeviceState, rules: dict[str, FenceRules], deleted: set[str]) -> frozenset[str] | None:
    """The fences the device is confirmed inside when nothing is pending, timed or deleted (the common
    case: a cow grazing inside its paddock, or outside all fences): a report that matches exactly
    those changes nothing. None when a report could change something whatever it matched."""
    for uid, fence_state in state.fences.items():
        if fence_state.streak or not fence_state.inside or (
                not fence_state.dwelled and rules.get(uid, DEFAULT_RULES).dwell_seconds):
            return None
    if deleted and not deleted.isdisjoint(state.fences):
        return None
    return frozenset(state.fences)


def _step(s: FenceState, inside: bool, t: int, rules: FenceRules) -> str | None:
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
    s.inside, s.streak, s.dwelled = inside, 0, False
    s.since = t if inside else None
    return "enter" if inside else "exit"
