"""Per-device fence state machine: debounced ENTER/EXIT (and DWELL), deterministic event ids.

For each (device, fence) a confirmed state (initially outside) and a streak of reports that contradict
it. A streak of `debounce_reports` reports, or one lasting `debounce_seconds` of report time, flips the
confirmed state and emits the event, stamped with the confirming report's time. Reports older than the
device's last processed report, or repeating it exactly, are skipped: state never rewinds.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from fencing.fence_store import FenceRules

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


def event_id(fence_uid: str, device_id: str, kind: str, ts: int) -> str:
    return hashlib.sha1(f"{fence_uid}|{device_id}|{kind}|{ts}".encode()).hexdigest()[:24]


def advance(state: DeviceState, device_id: str, ts: list[int], lat: list[float], lon: list[float],
            matched: list[frozenset[str]], rules: dict[str, FenceRules], deleted: set[str],
            uniform: bool | None = None) -> Advanced:
    """Apply one device's reports (in arrival order) to its state in place. `uniform`: whether every
    report matched the same fences, when the caller knows (it computed that for a whole batch)."""
    steady = uniform is not False and _steady(state, matched, rules, deleted, uniform)
    events: list[Event] = []
    last = -1
    for i, (t, la, lo, inside_now) in enumerate(zip(ts, lat, lon, matched)):
        if not state.accept(t, la, lo):
            continue
        last = i
        if steady:
            continue
        for uid in sorted(inside_now | state.fences.keys()):
            if uid in deleted:
                state.fences.pop(uid, None)
                continue
            fence_state = state.fences.get(uid) or FenceState()
            kind = _step(fence_state, uid in inside_now, t, rules.get(uid, DEFAULT_RULES))
            if kind:
                farm_id, _, fence_id = uid.partition("/")
                events.append(Event(event_id(uid, device_id, kind, t), kind, farm_id, device_id, fence_id,
                                    t, la, lo))
            if fence_state.inside or fence_state.streak:
                state.fences[uid] = fence_state
            else:
                state.fences.pop(uid, None)
    return Advanced(events, last)


def _steady(state: DeviceState, matched: list[frozenset[str]], rules: dict[str, FenceRules],
            deleted: set[str], uniform: bool | None = None) -> bool:
    """Fast path: every report agrees with the confirmed state (the common case: a cow grazing inside
    its paddock, or outside all fences) and nothing is pending or timed — nothing can change."""
    confirmed = frozenset(u for u, s in state.fences.items() if s.inside)
    if any(s.streak for s in state.fences.values()) or (deleted and not deleted.isdisjoint(state.fences)):
        return False
    if any(rules.get(u, DEFAULT_RULES).dwell_seconds for u in confirmed):
        return False
    if uniform:                 # all the same: one comparison
        return not matched or matched[0] == confirmed
    return all(m == confirmed for m in matched)


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
