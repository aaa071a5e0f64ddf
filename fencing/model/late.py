"""Late fixes: reports older than the device's last processed one (a collar's buffered fixes), within
24 h, judged together with the live fixes around them against what the device was confirmed inside
at their times. They never change the current state; the excursions they reveal are emitted with
`late: true`.

Rule (docs/events.md, late uploads), per fence, over one timeline in time order: the device's kept late
fixes and its last processed (live) fixes. A late fix *disagrees* when its membership differs from
the confirmed one at its time (a confirmed stay, or the current stay since its ENTER); a live fix
when it differed from the confirmed state right after its own step (a stray, an unconfirmed streak).
Disagreement is debounced with the fence's own rule (`transitions.step_fence`, the live state
machine's debounce): the fix that confirms it is the departure, the fix that then confirms agreement
again is the return. An excursion needs a departure whose streak holds a late fix, and a return,
with the same confirmed membership at both ends: then EXIT at the departure and ENTER at the return
(or ENTER, EXIT for a fence it was outside of), both `late`. The return may be a live fix — the
usual night escape: the collar is back in coverage when the animal is back, its live fixes arrive
before its buffer — and then the ENTER is at the live fix that confirms the return (with the default
debounce, the second one back inside): the time the live state machine gives when the buffer
arrives first, so both arrival orders put the events at the same times.

Live fixes are bounded (transitions.MAX_LIVE_FIXES): an excursion whose departure streak began at
or before the newest live fix forgotten is judged on late fixes only (live fixes between might have
ended it). One stray fix is no excursion, nor is an upload that only shows the device leaving (its
real EXIT came, or will come, from the live fixes). An excursion still waiting for its return
(`state.open`) is judged again after each live fix.

Each excursion comes out once and whole: none whose EXIT or ENTER came out before. An upload split
over two micro-batches is judged on its first part when that batch ends; if the part after holds the
fixes back inside, the return stays the live fix the first judgement found (no second ENTER).

Bounded: the kept late fixes (MAX_LATE_FIXES, 24 h), the stays (transitions.MAX_STAYS, 24 h), the
live fixes and the ids of late events already emitted (MAX_EMITTED, 24 h), so a late fix arriving in
a later batch re-runs the judgement over all kept fixes and only new excursions come out: exactly
once.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import lru_cache

from fencing.model.fence_store import FenceRules
from fencing.model.transitions import DEFAULT_RULES, LATE_HORIZON_MS, DeviceState, Event, FenceState, make_event, \
    step_fence

MAX_LATE_FIXES = 96
MAX_EMITTED = 128


def confirmed_inside(state: DeviceState, uid: str) -> "Callable[[int], bool]":
    """Whether the device was confirmed inside `uid` at a time, as far as its state remembers: a test
    of t, with the stays of `uid` picked out once (a replay asks it for every kept fix, for every
    fence it judges: the common shapes, no stay or only the current one, get a test of their own)."""
    current = state.fences.get(uid)
    since = current.since if current is not None and current.inside else None
    spans = [(s[1], s[2]) for s in state.stays if s[0] == uid]
    if not spans:
        return _never if since is None else lambda t: since <= t

    def at(t: int) -> bool:
        if since is not None and since <= t:
            return True
        for a, b in spans:
            if a <= t < b:
                return True
        return False
    return at


def _never(_t: int) -> bool:
    return False


@lru_cache(maxsize=4096)
def _without_dwell(rule: FenceRules) -> FenceRules:
    """The rule a late judgement debounces by: the fence's own, without dwell (an excursion is no stay)."""
    return dataclasses.replace(rule, dwell_seconds=None)


def replay(state: DeviceState, device_id: str, fixes: list[tuple[int, float, float, frozenset[str]]],
           rules: dict[str, FenceRules], deleted: set[str]) -> list[Event]:
    """Add the batch's late fixes (ts, lat, lon, fences matched) to the kept ones and return the late
    events not emitted before. Only the late-fix fields of `state` change."""
    if state.last_ts is None or state.known_from is None:
        return []
    start = _start(state)
    kept = {(f[0], f[1], f[2]): f for f in state.late if f[0] >= start}
    live = {(f[0], f[1], f[2]) for f in state.live_fixes()[0]}       # a retried upload of live fixes
    added = False
    for t, lat, lon, fences in fixes:
        if start <= t < state.last_ts and (t, lat, lon) not in kept and (t, lat, lon) not in live:
            kept[(t, lat, lon)] = [t, lat, lon, sorted(fences)]
            added = True
    state.late = sorted(kept.values(), key=lambda f: (f[0], f[1], f[2]))[-MAX_LATE_FIXES:]
    state.emitted = [e for e in state.emitted if e[1] >= start]
    if not added:
        return []
    return _judge(state, device_id, rules, deleted, start)


def follow(state: DeviceState, device_id: str, rules: dict[str, FenceRules], deleted: set[str]) -> list[Event]:
    """After a live fix of a device whose late excursion waits for its return (`state.open`): the
    late events that fix completes."""
    if not state.open or state.last_ts is None or state.known_from is None:
        return []
    start = _start(state)
    state.late = [f for f in state.late if f[0] >= start]
    state.emitted = [e for e in state.emitted if e[1] >= start]
    return _judge(state, device_id, rules, deleted, start)


def _start(state: DeviceState) -> int:
    return max(state.last_ts - LATE_HORIZON_MS, state.known_from)


def _judge(state: DeviceState, device_id: str, rules: dict[str, FenceRules], deleted: set[str], start: int
           ) -> list[Event]:
    if not state.late:
        state.open = False
        return []
    # the live fixes of the last 24 h (from where the stays are complete); older ones count as forgotten
    fixes, gap = state.live_fixes()
    live = []
    for f in fixes:
        if f[0] >= start:
            live.append((f[0], f[1], f[2], f[3], False))
        elif gap is None or f[0] > gap:
            gap = f[0]
    timeline = sorted([(f[0], f[1], f[2], f[3], True) for f in state.late] + live, key=lambda f: f[:3])
    candidates = {u for f in state.late for u in f[3]} | set(state.fences) | {s[0] for s in state.stays}
    found: list[Event] = []
    waiting = False
    for uid in sorted(candidates - deleted):
        events, open_ = _excursions(state, device_id, uid, rules.get(uid, DEFAULT_RULES), timeline, gap)
        found += events
        waiting |= open_
    state.open = waiting
    # an excursion comes out whole or not at all: one whose departure or return came out before was
    # judged on fewer fixes (an upload split over batches: its ENTER at the live fix stays the one)
    emitted = {e[0] for e in state.emitted}
    new = [e for pair in zip(found[::2], found[1::2]) if not emitted.intersection(x.event_id for x in pair)
           for e in pair]
    state.emitted = sorted(state.emitted + [[e.event_id, e.ts] for e in new], key=lambda e: e[1])[-MAX_EMITTED:]
    return new


def _excursions(state: DeviceState, device_id: str, uid: str, rule: FenceRules, timeline: list[tuple],
                gap: int | None) -> tuple[list[Event], bool]:
    """One fence's late excursions over the timeline (ts, lat, lon, fences, late), and whether one
    waits for live fixes at its end. The scan's own debounce state: `inside` = away from the confirmed
    membership (no dwell: it is no stay)."""
    out: list[Event] = []
    rule = _without_dwell(rule)
    windowed = rule.windowed      # else active at every time: no call per fix
    scan = FenceState()
    departure = None              # (ts, lat, lon, confirmed membership, streak held a late fix)
    with_late = old = False
    inside_at = confirmed_inside(state, uid)
    for t, lat, lon, fences, late in timeline:
        if old and not late:
            continue              # an episode begun before a forgotten live fix: late fixes only
        base = inside_at(t)
        if late:
            disagree = (uid in fences and (not windowed or rule.active(t))) != base
        else:
            disagree = fences is not None and uid in fences
        if disagree == scan.inside:
            scan.streak = 0
            if not scan.inside:
                old = False       # nothing pending: the next episode starts afresh
            continue
        if scan.streak == 0:
            with_late = False
            if not scan.inside:
                old = gap is not None and t <= gap
        with_late |= late
        kind = step_fence(scan, disagree, t, rule)
        if kind == "enter":       # away: the departure
            departure = (t, lat, lon, base, with_late)
        elif kind == "exit":      # back: the return
            if departure is not None and departure[4] and departure[3] == base:
                first, second = ("exit", "enter") if base else ("enter", "exit")
                out += [make_event(uid, device_id, first, departure[0], departure[1], departure[2], late=True),
                        make_event(uid, device_id, second, t, lat, lon, late=True)]
            departure, old = None, False
    waiting = not old and ((scan.inside and departure is not None and departure[4])
                           or (not scan.inside and scan.streak > 0 and with_late))
    return out, waiting
