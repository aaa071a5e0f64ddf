"""Fence properties (warn_m, active window), APPROACH, windows and inferred crossings through the
job's computing core (fencing.stream.batch_core) — and the same cases through the reference."""
from __future__ import annotations

import pytest
import shapely

from fencing.model.fence_store import FenceRules
from fencing.model.geometry import FenceError
from loadgen.reference import RefReport, Reference
from tests.unit.sparse_harness import Job, feature, lonlat, ref_fence

T0 = 1_767_225_600_000          # 2026-01-01T00:00:00Z
MIN = 60_000


def box_m(x0, y0, x1, y1) -> shapely.Geometry:
    (a, c), (b, d) = lonlat([x0, x1], [y0, y1])
    return shapely.box(a, b, c, d)


def at(device: str, t: int, x: float, y: float, accuracy: float | None = None) -> RefReport:
    lon, lat = lonlat(x, y)
    return RefReport(f"farm-a/{device}", t, float(lat), float(lon), accuracy)


def run_both(fences: dict[str, tuple[shapely.Geometry, dict]], batches: list[list[RefReport]]):
    job = Job({uid: feature(g, **p) for uid, (g, p) in fences.items()})
    ref = Reference([ref_fence(uid, g, **p) for uid, (g, p) in fences.items()])
    for batch in batches:
        job.batch(batch)
        ref.feed_batch(batch)
    got = [(e.device_id, e.fence_id, e.type, e.ts, e.inferred, e.late) for e in job.events]
    want = [(e.device_id, e.fence_id, e.type, e.ts, e.inferred, e.late) for e in ref.events]
    return got, want, job


@pytest.mark.parametrize("props, word", [
    ({"warn_m": -1}, "warn_m"), ({"warn_m": "20"}, "warn_m"), ({"warn_m": float("nan")}, "warn_m"),
    ({"active_from": "yesterday"}, "active_from"), ({"active_to": True}, "active_to"),
    ({"active_from": "2026-01-02T00:00:00Z", "active_to": "2026-01-01T00:00:00Z"}, "active_to"),
    ({"active_from": 1_767_225_600_000, "active_to": 1_767_225_600_000}, "active_to"),
])
def test_bad_fence_properties_are_refused_naming_the_property(props, word):
    with pytest.raises(FenceError, match=word):
        FenceRules.from_properties(props)


def test_window_accepts_iso_and_epoch_ms_and_answers_iso():
    rules = FenceRules.from_properties({"warn_m": 20, "active_from": T0, "active_to": "2026-01-01T06:00:00Z"})
    assert (rules.warn_m, rules.active_from, rules.active_to) == (20.0, T0, T0 + 6 * 3600_000)
    assert rules.active(T0) and not rules.active(T0 + 6 * 3600_000) and not rules.active(T0 - 1)
    props = rules.normalized({"name": "strip", "active_from": T0})
    assert props["active_from"] == "2026-01-01T00:00:00.000Z"


def test_walking_toward_the_edge_gives_one_approach_rearmed_once_deeper():
    paddock = box_m(0, 0, 200, 200)
    xs = [100, 100, 120, 150, 170, 185, 190, 185, 150, 120, 150, 185]     # edge at x=200, warn 20 m
    reports = [at("cow", T0 + i * MIN, x, 100) for i, x in enumerate(xs)]
    got, want, _ = run_both({"farm-a/p": (paddock, {"warn_m": 20})}, [reports[:5], reports[5:]])
    assert got == want
    approaches = [e for e in got if e[2] == "approach"]
    assert [e[3] for e in approaches] == [T0 + 5 * MIN, T0 + 11 * MIN]   # 185 m (15 m from edge), then again


def test_approach_distance_is_metres_on_the_ground_not_degrees():
    paddock = box_m(0, 0, 200, 200)
    # 25 m from the east edge: outside warn_m 20 (a degree-based distance would be ~0.0003)
    reports = [at("cow", T0 + i * MIN, x, 100) for i, x in enumerate([100, 100, 175, 100, 181])]
    got, want, _ = run_both({"farm-a/p": (paddock, {"warn_m": 20})}, [reports])
    assert got == want
    assert [e[3] for e in got if e[2] == "approach"] == [T0 + 4 * MIN]


def test_window_closing_drops_the_member_silently_and_opening_gives_enter():
    paddock = box_m(0, 0, 200, 200)
    window = {"active_from": T0 + 10 * MIN, "active_to": T0 + 20 * MIN}
    reports = [at("cow", T0 + i * MIN, 100 + (i % 2), 100) for i in range(25)]
    got, want, job = run_both({"farm-a/p": (paddock, window)}, [reports[:12], reports[12:]])
    assert got == want
    assert [(e[2], e[3]) for e in got] == [("enter", T0 + 11 * MIN)]          # no exit when it closed
    assert job.dropped == [("farm-a/p", "farm-a/cow", T0 + 20 * MIN)]


def test_two_fixes_either_side_of_a_strip_give_inferred_enter_and_exit():
    strip = box_m(100, -500, 130, 500)        # a 30 m wide road corridor
    reports = [at("cow", T0, 0, 0), at("cow", T0 + 10 * MIN, 200, 0)]
    got, want, job = run_both({"farm-a/road": (strip, {})}, [[reports[0]], [reports[1]]])
    assert got == want
    assert got == [("cow", "road", "enter", T0 + 5 * MIN, True, False),
                   ("cow", "road", "exit", T0 + int(6.5 * MIN), True, False)]
    assert job.stored["farm-a/cow"]["f"] == {}          # inferred events change no state


def test_a_short_stretch_or_a_poor_fix_is_no_crossing():
    corner = box_m(0, 200, 100, 300)
    # the 57 m segment cuts the corner over ~7 m: below the 10 m floor
    short = [at("a", T0, -30, 265), at("a", T0 + 10 * MIN, 10, 305)]
    # 30 m through the strip, but the fixes say ±20 m: 40 m needed
    poor = [at("b", T0, -50, 50, accuracy=20), at("b", T0 + 10 * MIN, 150, 50, accuracy=5)]
    strip = box_m(20, -500, 50, 500)
    got, want, _ = run_both({"farm-a/c": (corner, {}), "farm-a/s": (strip, {})},
                            [[short[0], poor[0]], [short[1], poor[1]]])
    assert got == want == []


def test_a_segment_under_30_m_implies_nothing():
    strip = box_m(100, -500, 112, 500)        # 12 m wide: crossed by a 28 m segment
    reports = [at("cow", T0, 92, 0), at("cow", T0 + 10 * MIN, 120, 0)]
    got, want, _ = run_both({"farm-a/lane": (strip, {})}, [reports])
    assert got == want == []


def test_leaving_and_reentering_a_fence_between_two_inside_fixes():
    u_shape = shapely.difference(box_m(0, 0, 300, 300), box_m(100, 50, 200, 400))   # a bay cut from the north
    reports = [at("cow", T0 + i * MIN, 50, 250) for i in range(3)] + [at("cow", T0 + 13 * MIN, 250, 250)]
    got, want, _ = run_both({"farm-a/u": (u_shape, {})}, [reports[:3], reports[3:]])
    assert got == want
    assert [(e[2], e[4]) for e in got] == [("enter", False), ("exit", True), ("enter", True)]


def test_another_farms_fence_is_never_crossed():
    strip = box_m(100, -500, 130, 500)
    reports = [at("cow", T0, 0, 0), at("cow", T0 + 10 * MIN, 200, 0)]
    got, want, _ = run_both({"farm-b/road": (strip, {})}, [reports])
    assert got == want == []


def test_a_buffered_night_upload_reveals_the_excursion_once_without_changing_the_state():
    paddock = box_m(0, 0, 300, 300)
    evening = [at("cow", T0 + i * 15 * MIN, 150, 150) for i in range(3)]            # inside: ENTER
    night = [at("cow", T0 + (3 + i) * 15 * MIN, x, 150) for i, x in enumerate([150, 400, 420, 410, 150, 160])]
    morning = [at("cow", T0 + 10 * 15 * MIN, 155, 150)]
    # the morning fix arrives first, the buffered night after it, then the same upload again (a retry)
    got, want, job = run_both({"farm-a/p": (paddock, {})}, [evening, morning, night[:3], night[3:], night])
    assert got == want
    assert [(e[2], e[3], e[5]) for e in got] == [
        ("enter", T0 + 15 * MIN, False),
        ("exit", T0 + 5 * 15 * MIN, True),          # confirmed by the second fix outside (debounce 2)
        ("enter", T0 + 8 * 15 * MIN, True)]         # confirmed by the second fix back inside
    state = job.stored["farm-a/cow"]
    assert state["t"] == T0 + 10 * 15 * MIN and state["f"]["farm-a/p"][0] == 1      # still inside, latest fix


def test_one_stray_late_fix_or_a_late_fix_before_the_first_is_no_excursion():
    paddock = box_m(0, 0, 300, 300)
    live = [at("cow", T0 + i * 15 * MIN, 150, 150) for i in range(2, 6)]
    late = [at("cow", T0 + int(2.5 * 15 * MIN), 400, 150), at("cow", T0 + 3 * 15 * MIN + 1, 150, 150),
            at("cow", T0, 400, 150), at("cow", T0 + 1, 400, 150)]            # the last two: before the first
    got, want, _ = run_both({"farm-a/p": (paddock, {})}, [live, late])
    assert got == want
    assert [e[2] for e in got] == ["enter"]


def test_a_late_upload_is_judged_where_it_arrived_whatever_follows_in_its_batch():
    """The night's fixes arrive after the morning fix; many stays end after them in the same batch (the
    device forgets the oldest). Judged before the next live fix, the night shows its excursion, in one
    batch as with the upload alone in a batch and every other report in its own."""
    paddock = box_m(0, 0, 300, 300)
    t = [T0 + i * 15 * MIN for i in range(80)]
    evening = [at("cow", t[i], 150, 150) for i in range(3)]
    night = [at("cow", t[3 + i], x, 150) for i, x in enumerate([150, 400, 420, 410, 150, 160])]
    morning = [at("cow", t[10], 155, 150)]
    # then in and out of the paddock twelve times: more ended stays than a device keeps
    day = [at("cow", t[11 + i], 150 if (i // 2) % 2 else 400, 150) for i in range(48)]
    arrival = evening + morning + night + day
    whole, want, _ = run_both({"farm-a/p": (paddock, {})}, [arrival])
    apart, _, _ = run_both({"farm-a/p": (paddock, {})}, [[r] for r in evening + morning] + [night] + [[r] for r in day])
    assert whole == want == apart
    late = [(e[2], e[3]) for e in whole if e[5]]
    assert late == [("exit", t[5]), ("enter", t[8])]


def test_an_upload_split_before_its_return_keeps_the_enter_it_gave_first():
    """The night split over two batches, the fixes back inside in the second: judged on the first part
    and the morning fix, the return is the morning fix; the second part shows it earlier, but the
    excursion already came out (once, whole: no second ENTER)."""
    paddock = box_m(0, 0, 300, 300)
    t = [T0 + i * 15 * MIN for i in range(20)]
    evening = [at("cow", t[i], 150, 150) for i in range(3)]
    night = [at("cow", t[3 + i], x, 150) for i, x in enumerate([400, 420, 410, 150, 160])]
    morning = [at("cow", t[10], 155, 150), at("cow", t[11], 150, 150)]
    got, want, _ = run_both({"farm-a/p": (paddock, {})}, [evening, morning, night[:3], night[3:]])
    assert got == want
    assert [(e[2], e[3], e[5]) for e in got] == [
        ("enter", t[1], False), ("exit", t[4], True), ("enter", t[11], True)]


# --- a night escape whose return is seen live (the collar is back in coverage when the cow is back) ---
EVENING = T0 + 21 * 60 * MIN                    # 21:00, three fixes inside
NIGHT = T0 + 28 * 60 * MIN                      # 04:00 to 05:00, seven buffered fixes, 10 min apart
MORNING = T0 + 29 * 60 * MIN + 10 * MIN         # 05:10, three fixes inside


def _night(device: str = "cow", x_out: float = 550):
    evening = [at(device, EVENING + i * 10 * MIN, 150, 150) for i in range(3)]
    night = [at(device, NIGHT + i * 10 * MIN, x_out + 5 * i, 150) for i in range(7)]
    morning = [at(device, MORNING + i * 10 * MIN, 150 + i, 150) for i in range(3)]
    return evening, night, morning


def _arrivals(evening, night, morning) -> dict[str, list[list[RefReport]]]:
    """The same fixes in every arrival order and batching the issue names (batches as lists)."""
    return {
        "buffer first": [evening, night, morning],
        "buffer first, one batch": [evening + night + morning],
        "buffer last": [evening, morning, night],
        "buffer last, same batch": [evening, morning + night],
        "buffer last, all in one batch": [evening + morning + night],
        "buffer after the first fix back": [evening, morning[:1], night, morning[1:]],
        "buffer after the first fix back, one batch": [evening + morning[:1] + night + morning[1:]],
        "buffer last, a report a batch": [[r] for r in evening + morning] + [night],
        "buffer last, retried": [evening, morning, night, night, night[3:]],
    }


NEIGHBOUR = {"farm-a/p": (box_m(0, 0, 300, 300), {}), "farm-a/n": (box_m(400, 0, 700, 300), {})}


@pytest.mark.parametrize("order", list(_arrivals([], [], [])))
def test_a_night_escape_returned_live_gives_the_same_exit_and_enter_in_every_arrival_order(order):
    """The cow leaves its paddock p for the neighbour's n at night; the buffer's fixes are all in n. The
    departure is the second fix out (debounce 2) and the return the second fix back inside, live or
    late; EXIT/ENTER for p, ENTER/EXIT for n (the intrusion), `late` only when the buffer came after
    the morning's fixes. The state stays what the morning's fixes say."""
    batches = _arrivals(*_night())[order]
    got, want, job = run_both(NEIGHBOUR, batches)
    assert got == want
    late = "buffer last" in order or "after the first fix back" in order
    assert [(e[1], e[2], e[3], e[5]) for e in got] == [
        ("p", "enter", EVENING + 10 * MIN, False),
        ("n", "enter", NIGHT + 10 * MIN, late), ("p", "exit", NIGHT + 10 * MIN, late),
        ("n", "exit", MORNING + 10 * MIN, late), ("p", "enter", MORNING + 10 * MIN, late),
    ] if not late else [
        ("p", "enter", EVENING + 10 * MIN, False),
        ("n", "enter", NIGHT + 10 * MIN, True), ("n", "exit", MORNING + 10 * MIN, True),
        ("p", "exit", NIGHT + 10 * MIN, True), ("p", "enter", MORNING + 10 * MIN, True)]
    state = job.stored["farm-a/cow"]
    assert state["t"] == MORNING + 20 * MIN and list(state["f"]) == ["farm-a/p"] and state["f"]["farm-a/p"][0] == 1


def test_with_debounce_1_the_exit_is_the_first_fix_out_and_the_enter_the_first_fix_back():
    fences = {"farm-a/p": (box_m(0, 0, 300, 300), {"debounce_reports": 1})}
    evening, night, morning = _night()
    for batches in ([evening, night, morning], [evening, morning, night]):
        got, want, _ = run_both(fences, batches)
        assert got == want
        assert [(e[2], e[3]) for e in got] == [("enter", EVENING), ("exit", NIGHT), ("enter", MORNING)]


def test_a_replayed_batch_gives_the_same_late_events_again_and_the_state_after():
    import copy
    evening, night, morning = _night()
    job = Job({uid: feature(g, **p) for uid, (g, p) in NEIGHBOUR.items()})
    job.batch(evening)
    job.batch(morning[:1])
    before = copy.deepcopy(job.stored)
    first = [e.event_id for e in job.batch(night + morning[1:])]
    after = copy.deepcopy(job.stored)
    job.stored = before                         # the batch again, from the state before it
    assert [e.event_id for e in job.batch(night + morning[1:])] == first and len(first) == 4
    assert job.stored == after


def test_a_buffer_seen_after_more_live_fixes_than_kept_is_judged_on_its_own_fixes():
    """Five fixes back inside before the upload: the device no longer remembers the first ones, so
    the return cannot be placed; the night's own fixes show no return, and nothing comes out."""
    evening, night, _ = _night()
    morning = [at("cow", MORNING + i * 10 * MIN, 150, 150) for i in range(5)]
    got, want, _ = run_both({"farm-a/p": NEIGHBOUR["farm-a/p"]}, [evening, morning, night])
    assert got == want
    assert [(e[2], e[5]) for e in got] == [("enter", False)]


def test_one_late_fix_out_is_no_escape_even_with_the_return_seen_live():
    evening, night, morning = _night()
    got, want, _ = run_both({"farm-a/p": NEIGHBOUR["farm-a/p"]}, [evening, morning, night[:1]])
    assert got == want
    assert [(e[2], e[5]) for e in got] == [("enter", False)]
