"""Late fixes: reports older than the device's last processed one (a collar's buffered fixes), within
24 h, replayed against what the device was confirmed inside at their times. They never change the
current state; the excursions they reveal are emitted with `late: true` at the fixes' own times.

Rule (docs/events.md, "Late uploads"), per fence, over the device's kept late fixes in time order: a fix
*disagrees* when its membership differs from the confirmed one at its time (a confirmed stay, or the
current stay since its ENTER). Disagreement is debounced with the fence's own rule (debounce_reports
fixes in a row, or a streak lasting debounce_seconds): the fix that confirms it is the departure,
the fix that then confirms agreement again is the return. An excursion needs both, with the same
confirmed membership at both ends: then EXIT at the departure and ENTER at the return (or ENTER,
EXIT for a fence it was outside of). One stray fix is no excursion, nor is an upload that only shows
the device leaving (its real EXIT came, or will come, from the live fixes).

Bounded: the kept late fixes (MAX_LATE_FIXES, 24 h), the stays (transitions.MAX_STAYS, 24 h) and the
ids of late events already emitted (MAX_EMITTED, 24 h), so a late fix arriving in a later batch
re-runs the replay over all kept fixes and only new excursions come out: exactly once.
"""
from __future__ import annotations

from collections.abc import Callable

from fencing.model.fence_store import FenceRules
from fencing.model.transitions import DEFAULT_RULES, LATE_HORIZON_MS, DeviceState, Event, make_event

MAX_LATE_FIXES = 96
MAX_EMITTED = 128


def confirmed_inside(state: DeviceState, uid: str) -> "Callable[[int], bool]":
    """Whether the device was confirmed inside `uid` at a time, as far as its state remembers: a test
    of t, with the stays of `uid` picked out once (a replay asks it for every kept fix)."""
    current = state.fences.get(uid)
    since = current.since if current is not None and current.inside else None
    spans = [(s[1], s[2]) for s in state.stays if s[0] == uid]

    def at(t: int) -> bool:
        return (since is not None and since <= t) or any(a <= t < b for a, b in spans)
    return at


def replay(state: DeviceState, device_id: str, fixes: list[tuple[int, float, float, frozenset[str]]],
           rules: dict[str, FenceRules], deleted: set[str]) -> list[Event]:
    """Add the batch's late fixes (ts, lat, lon, fences matched) to the kept ones and return the late
    events not emitted before. Only the late-fix fields of `state` change."""
    if state.last_ts is None or state.known_from is None:
        return []
    start = max(state.last_ts - LATE_HORIZON_MS, state.known_from)
    kept = {(f[0], f[1], f[2]): f for f in state.late if f[0] >= start}
    added = False
    for t, lat, lon, fences in fixes:
        if start <= t < state.last_ts and (t, lat, lon) not in kept:
            kept[(t, lat, lon)] = [t, lat, lon, sorted(fences)]
            added = True
    state.late = sorted(kept.values(), key=lambda f: (f[0], f[1], f[2]))[-MAX_LATE_FIXES:]
    state.emitted = [e for e in state.emitted if e[1] >= start]
    if not added:
        return []
    candidates = {u for f in state.late for u in f[3]} | set(state.fences) | {s[0] for s in state.stays}
    found: list[Event] = []
    for uid in sorted(candidates - deleted):
        found += _excursions(state, device_id, uid, rules.get(uid, DEFAULT_RULES))
    emitted = {e[0] for e in state.emitted}
    new = [e for e in found if e.event_id not in emitted]
    state.emitted = sorted(state.emitted + [[e.event_id, e.ts] for e in new], key=lambda e: e[1])[-MAX_EMITTED:]
    return new


def _excursions(state: DeviceState, device_id: str, uid: str, rule: FenceRules) -> list[Event]:
    out: list[Event] = []
    away, streak, t0 = False, 0, 0
    departure = None
    inside_at = confirmed_inside(state, uid)
    for t, lat, lon, fences in state.late:
        base = inside_at(t)
        disagree = (uid in fences and rule.active(t)) != base
        if disagree == away:
            streak = 0
            continue
        if streak == 0:
            t0 = t
        streak += 1
        if streak < rule.debounce_reports and t - t0 < rule.debounce_seconds * 1000:
            continue
        streak, away = 0, disagree
        if away:
            departure = (t, lat, lon, base)
            continue
        if departure is not None and departure[3] == base:
            first, second = ("exit", "enter") if base else ("enter", "exit")
            out += [make_event(uid, device_id, first, departure[0], departure[1], departure[2], late=True),
                    make_event(uid, device_id, second, t, lat, lon, late=True)]
        departure = None
    return out
