"""The per-device state machine, without Spark: debounce, dwell, out-of-order, deletes, ids."""
from __future__ import annotations

from fencing.fence_store import FenceRules
from fencing.transitions import DeviceState, advance, event_id

F, G = "farm-a/f1", "farm-a/f2"


def run(state, ts, inside_sets, rules=None, deleted=()):
    n = len(ts)
    return advance(state, "cow", list(ts), [47.0] * n, [8.0 + i * 1e-5 for i in range(n)],
                   [frozenset(s) for s in inside_sets], rules or {}, set(deleted)).events


def test_two_consecutive_reports_confirm_enter_and_exit():
    state = DeviceState()
    events = run(state, [1000, 2000, 3000, 4000], [{F}, {F}, set(), set()])
    assert [(e.type, e.fence_id, e.ts) for e in events] == [("enter", "f1", 2000), ("exit", "f1", 4000)]


def test_a_single_stray_report_is_no_event():
    state = DeviceState()
    assert run(state, [1, 2, 3, 4], [set(), {F}, set(), set()]) == []
    assert state.fences == {}


def test_time_debounce_confirms_after_seconds_of_report_time():
    rules = {F: FenceRules(debounce_reports=5, debounce_seconds=30)}
    state = DeviceState()
    events = run(state, [0, 10_000, 29_999, 30_000], [{F}] * 4, rules)
    assert [(e.type, e.ts) for e in events] == [("enter", 30_000)]


def test_older_reports_are_skipped_and_state_never_rewinds():
    state = DeviceState()
    run(state, [10_000, 11_000], [{F}, {F}])
    assert run(state, [5_000, 6_000], [set(), set()]) == []
    assert state.last_ts == 11_000 and state.inside_fences() == [F]


def test_overlapping_fences_each_get_their_event_and_ids_are_deterministic():
    a, b = DeviceState(), DeviceState()
    first = run(a, [1, 2], [{F, G}, {F, G}])
    again = run(b, [1, 2], [{F, G}, {F, G}])
    assert sorted(e.fence_id for e in first) == ["f1", "f2"]
    assert [e.event_id for e in first] == [e.event_id for e in again]
    assert first[0].event_id == event_id(F, "cow", "enter", 2)


def test_deleted_fence_emits_nothing_more():
    state = DeviceState()
    run(state, [1, 2], [{F}, {F}])
    assert run(state, [3, 4], [set(), set()], deleted={F}) == []
    assert state.fences == {}


def test_dwell_once_per_stay_and_state_round_trips():
    rules = {F: FenceRules(dwell_seconds=60)}
    state = DeviceState()
    events = run(state, [0, 1_000, 30_000, 61_000, 90_000], [{F}] * 5, rules)
    assert [(e.type, e.ts) for e in events] == [("enter", 1_000), ("dwell", 61_000)]
    assert DeviceState.from_dict(state.to_dict()) == state


def test_a_retried_report_does_not_count_twice_but_a_new_place_at_the_same_time_does():
    state = DeviceState()
    done = advance(state, "cow", [1_000, 1_000], [47.0, 47.0], [8.0, 8.0], [frozenset({F})] * 2, {}, set())
    assert done.events == [] and done.last == 0 and state.fences[F].streak == 1
    done = advance(state, "cow", [1_000], [47.0], [8.1], [frozenset({F})], {}, set())
    assert [e.type for e in done.events] == ["enter"] and done.last == 0
