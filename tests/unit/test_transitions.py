"""The per-device state machine, without Spark: debounce, dwell, out-of-order, deletes, ids."""
from __future__ import annotations

from fencing.model.fence_store import FenceRules
from fencing.model.transitions import DeviceState, advance, event_id

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


def test_whole_batch_accept_agrees_with_the_per_report_rule():
    """last_accepted_reports (one pass over a batch) picks the same last counting report as
    DeviceState.accept report by report, and flags every device whose outcome hinges on a tie."""
    import numpy as np
    from fencing.model.transitions import last_accepted_reports

    rng = np.random.default_rng(7)
    for _ in range(50):
        sizes = rng.integers(1, 8, size=rng.integers(1, 30))
        starts = np.r_[0, np.cumsum(sizes)[:-1]]
        ts = rng.integers(0, 12, size=int(sizes.sum())) * 1000 + 1_700_000_000_000
        last_ts = [None if rng.random() < 0.3 else int(rng.integers(0, 12)) * 1000 + 1_700_000_000_000
                   for _ in sizes]
        last, tied = last_accepted_reports(starts, ts, last_ts)
        for d, (lo, n) in enumerate(zip(starts.tolist(), sizes.tolist())):
            state = DeviceState(last_ts=last_ts[d], last_lat=0.0, last_lon=0.0)
            taken = [i for i in range(n) if state.accept(int(ts[lo + i]), 47.0, 8.0 + i)]
            newest = last_ts[d]
            ties = False
            for t in ts[lo:lo + n].tolist():
                ties |= newest is not None and t == newest
                newest = t if newest is None else max(newest, t)
            assert bool(tied[d]) == ties
            if not ties:
                assert int(last[d]) == (taken[-1] if taken else -1)


def test_a_steady_device_with_the_batch_wide_answer_skips_the_loop_but_moves_on():
    state = DeviceState()
    run(state, [1_000, 2_000], [{F}, {F}])
    done = advance(state, "cow", [3_000, 2_500, 4_000, 3_500], [47.0] * 4, [8.0, 8.1, 8.2, 8.3],
                   [frozenset({F})] * 4, {}, set(), uniform=True, last_accepted=2, recent=[0, 2])
    assert done.events == [] and done.last == 2
    assert (state.last_ts, state.last_lon) == (4_000, 8.2) and state.inside_fences() == [F]
    assert [f[0] for f in state.live_fixes()[0]] == [1_000, 2_000, 3_000, 4_000]       # the fixes taken, kept
    assert DeviceState.from_dict(state.to_dict()) == state


def _every_report_every_fence(state, ts, lat, lon, matched, rules, deleted):
    """The rule without shortcuts: each counting report steps every fence it or the state names and is
    kept as a live fix with the fences it disagreed with (the oracle for advance's skips)."""
    from fencing.model.transitions import disagreeing, step_report
    events = []
    for t, la, lo, inside_now in zip(ts, lat, lon, matched):
        before = None if state.last_ts is None else (state.last_ts, state.last_lat, state.last_lon)
        if state.accept(t, la, lo):
            step_report(state, "cow", t, la, lo, inside_now, rules, deleted, events)
            state.remember(before, [[t, la, lo, disagreeing(state, inside_now, t, rules)]])
    return events


def test_advance_with_its_shortcuts_matches_the_rule_report_by_report():
    import random
    rng = random.Random(11)
    fences = ["farm-a/f1", "farm-a/f2", "farm-a/f3"]
    rules = {"farm-a/f2": FenceRules(dwell_seconds=20), "farm-a/f3": FenceRules(debounce_reports=3, debounce_seconds=15)}
    for _ in range(300):
        fast, slow = DeviceState(), DeviceState()
        t = 0
        for _batch in range(4):
            n = rng.randint(1, 12)
            ts = []
            for _i in range(n):
                t += rng.choice([0, 1_000, 5_000, 12_000, -3_000])
                ts.append(t)
            lat, lon = [47.0] * n, [8.0 + rng.choice([0, 1]) * 1e-4 for _ in range(n)]
            place = rng.choice([frozenset(), frozenset(fences[:1]), frozenset(fences[1:])])
            matched = [place if rng.random() < 0.8 else frozenset(rng.sample(fences, rng.randint(0, 2)))
                       for _ in range(n)]
            deleted = {"farm-a/f1"} if rng.random() < 0.05 else set()
            got = advance(fast, "cow", ts, lat, lon, matched, rules, deleted,
                          uniform=len(set(matched)) == 1)
            want = _every_report_every_fence(slow, ts, lat, lon, matched, rules, deleted)
            assert got.events == want
            assert fast.to_dict() == slow.to_dict()


def test_state_record_keeps_the_state_before_as_a_delta_and_gives_it_back():
    """Redis holds one copy of a device's state (issue 23): the state before the batch that wrote the
    record is its difference from the state after, and a replay of that batch gets it back exactly."""
    import orjson

    from fencing.model.transitions import state_before, state_record
    before = {"t": 1000, "la": 47.1, "lo": 8.5, "bt": 90.0, "c": "871f8d7a4ffffff",
              "f": {"farm/f1": [1, 0, 0, 900, 0, 0]}, "sn": 5, "kf": 900, "lf": [[950, 47.0, 8.4, []]]}
    after = {"t": 2000, "la": 47.2, "lo": 8.5, "bt": 89.5, "c": "871f8d7a4ffffff",
             "f": {"farm/f1": [1, 0, 0, 900, 0, 0], "farm/f2": [0, 1, 2000, None, 0, 0]}, "sn": 5, "kf": 900,
             "ac": 4.0}
    record = orjson.loads(orjson.dumps(state_record("run:7", after, before)))
    assert "p" not in record and set(record["d"]) == {"t", "la", "bt", "f", "lf"} and record["x"] == ["ac"]
    assert state_before(record, "run:7") == before             # a replay of batch 7
    assert state_before(record, "run:8") == after              # any later batch
    assert len(orjson.dumps(record)) < len(orjson.dumps({"b": "run:7", "s": after, "p": before}))
    new = orjson.loads(orjson.dumps(state_record("run:7", after, None)))
    assert state_before(new, "run:7") is None and state_before(new, "run:8") == after
    old_style = {"b": "run:7", "s": after, "p": before}         # written before the delta
    assert state_before(old_style, "run:7") == before and state_before(old_style, "run:8") == after


def test_the_last_live_fixes_are_kept_whatever_the_batches_and_come_back_exactly():
    """A device keeps its last MAX_LIVE_FIXES processed fixes (stored as small steps, GPS coordinates of
    7 decimals as whole 1e-7 degrees, others as they are) and the time of the newest one forgotten,
    the same however its reports fall into batches and through the stored form."""
    import random

    from fencing.model.transitions import MAX_LIVE_FIXES
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 14)
        ts = sorted(rng.sample(range(0, 10_000_000, 1_000), n))
        lat = [round(47 + rng.uniform(-0.01, 0.01), rng.choice([7, 7, 5, 12])) for _ in range(n)]
        lon = [round(8.5 + rng.uniform(-0.01, 0.01), rng.choice([7, 6, 15])) for _ in range(n)]
        matched = [frozenset({F}) if rng.random() < 0.7 else frozenset() for _ in range(n)]
        state, cut = DeviceState(), 0
        while cut < n:
            step = rng.randint(1, 6)
            advance(state, "cow", ts[cut:cut + step], lat[cut:cut + step], lon[cut:cut + step],
                    matched[cut:cut + step], {}, set())
            state = DeviceState.from_dict(orjson_round_trip(state.to_dict()))
            cut += step
        fixes, forgotten = state.live_fixes()
        assert [f[:3] for f in fixes] == [[t, a, o] for t, a, o in zip(ts, lat, lon)][-MAX_LIVE_FIXES:]
        assert forgotten == (ts[-MAX_LIVE_FIXES - 1] if n > MAX_LIVE_FIXES else None)


def orjson_round_trip(d: dict) -> dict:
    import orjson
    return orjson.loads(orjson.dumps(d))
