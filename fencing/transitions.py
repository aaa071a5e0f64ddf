"""Per-device fence state machine: debounced ENTER/EXIT (and DWELL), deterministic event ids.

For each (device, fence) a confirmed state (initially outside) and a streak of reports that contradict
it. A streak of `debounce_reports` reports, or one lasting `debounce_seconds` of report time, flips the
confirmed state and emits the event, stamped with the confirming report's time. Reports older than the
device's last processed report are skipped: state never rewinds.
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
    cell: str | None = None                       # res-7 cell of the latest position (pull index)
    fences: dict[str, FenceState] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"t": self.last_ts, "c": self.cell, "f": {u: s.to_list() for u, s in self.fences.items()}}

    @classmethod
    def from_dict(cls, d: dict | None) -> "DeviceState":
        if not d:
            return cls()
        return cls(d.get("t"), d.get("c"), {u: FenceState.from_list(v) for u, v in d.get("f", {}).items()})

    def inside_fences(self) -> list[str]:
        return sorted(u for u, s in self.fences.items() if s.inside)


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
            matched: list[frozenset[str]], rules: dict[str, FenceRules], deleted: set[str]) -> list[Event]:
    """Apply one device's reports (in arrival order) to its state in place; returns the events."""
    if _steady(state, matched, rules, deleted):
        newest = max(ts)
        state.last_ts = newest if state.last_ts is None else max(state.last_ts, newest)
        return []
    events: list[Event] = []
    for t, la, lo, inside_now in zip(ts, lat, lon, matched):
        if state.last_ts is not None and t < state.last_ts:
            continue
        state.last_ts = t
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
    return events


def _steady(state: DeviceState, matched: list[frozenset[str]], rules: dict[str, FenceRules],
            deleted: set[str]) -> bool:
    """Fast path: every report agrees with the confirmed state (the common case: a cow grazing inside
    its paddock, or outside all fences) and nothing is pending or timed — nothing can change."""
    confirmed = frozenset(u for u, s in state.fences.items() if s.inside)
    if any(s.streak for s in state.fences.values()) or (deleted and not deleted.isdisjoint(state.fences)):
        return False
    if any(rules.get(u, DEFAULT_RULES).dwell_seconds for u in confirmed):
        return False
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
