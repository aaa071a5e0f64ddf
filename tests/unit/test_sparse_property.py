"""Property: the job's vectorized core (membership on the H3 cover, batch-wide segments and
distances, the state machine with its shortcuts) emits exactly the reference's events, in order,
for random fences (holes, strips, windows, warn_m, debounce) and random tracks with sparse, noisy,
shuffled, repeated and late (buffered, uploaded later) fixes split into random batches."""
from __future__ import annotations

import math

import numpy as np
import shapely
import shapely.affinity
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.reference import RefReport, Reference
from tests.unit.sparse_harness import KX, KY, Job, feature, lonlat, ref_fence

T0 = 1_767_225_600_000
MIN = 60_000


def _polygon(rng: np.random.Generator) -> shapely.Geometry:
    """A star-shaped polygon (metres → lon/lat), maybe with a hole, or a narrow strip."""
    cx, cy = rng.uniform(-300, 300, 2)
    if rng.random() < 0.3:                                   # a strip: easy to jump over
        w, h, ang = rng.uniform(8, 40), rng.uniform(200, 800), rng.uniform(0, math.pi)
        shape = shapely.affinity.rotate(shapely.box(-w / 2, -h / 2, w / 2, h / 2), ang, use_radians=True)
        shape = shapely.affinity.translate(shape, cx, cy)
    else:
        n = int(rng.integers(3, 12))
        ang = np.sort(rng.uniform(0, 2 * math.pi, n))
        r = rng.uniform(40, 250, n)
        shape = shapely.Polygon(np.column_stack([cx + r * np.cos(ang), cy + r * np.sin(ang)]))
        if rng.random() < 0.4:
            hole = shapely.Point(cx, cy).buffer(min(r) * rng.uniform(0.2, 0.6), quad_segs=3)
            shape = shapely.Polygon(shape.exterior.coords, [hole.exterior.coords])
    shape = shapely.make_valid(shape)
    if shape.geom_type != "Polygon":                        # keep it simple: the largest part
        shape = max(shapely.get_parts(shape), key=lambda g: g.area if g.geom_type == "Polygon" else 0)
    coords = shapely.get_coordinates(shape)
    lon, lat = lonlat(coords[:, 0], coords[:, 1])
    out = shapely.set_coordinates(shapely.transform(shape, lambda c: c), np.column_stack([lon, lat]))
    return shapely.make_valid(out) if not out.is_valid else out


def _props(rng: np.random.Generator) -> dict:
    props: dict = {"debounce_reports": int(rng.choice([1, 2, 3])),
                   "debounce_seconds": float(rng.choice([0, 90, 600, 86400]))}
    if rng.random() < 0.4:
        props["warn_m"] = float(rng.choice([10, 25, 60]))
    if rng.random() < 0.3:
        start = T0 + int(rng.integers(-30, 120)) * MIN
        props["active_from"] = start
        if rng.random() < 0.7:
            props["active_to"] = start + int(rng.integers(10, 200)) * MIN
    if rng.random() < 0.15:
        props["dwell_seconds"] = 1200
    return props


def _tracks(rng: np.random.Generator, devices: int, buffer_last: bool) -> list[RefReport]:
    """`buffer_last`: a buffered block arrives after later fixes (late); else where it belongs. The
    same draws either way, so one seed gives the same fixes in both arrival orders."""
    out: list[RefReport] = []
    for d in range(devices):
        farm = "farm-a" if d % 5 else "farm-b"
        n = int(rng.integers(2, 30))
        sparse = rng.random() < 0.6
        gaps = rng.integers(5, 16, n) * MIN if sparse else rng.integers(20, 61, n) * 1000
        ts = T0 + int(rng.integers(0, 60)) * MIN + np.cumsum(gaps)
        step = rng.normal(0, 80 if sparse else 8, (n, 2))
        xy = np.cumsum(step, axis=0) + rng.uniform(-300, 300, 2)
        xy += rng.normal(0, 3, xy.shape)                                   # GPS noise
        # a stretch out of coverage: fixes i:i+k buffered (uploaded after later fixes when
        # `buffer_last`), half the time an escape: the animal far off while buffered and back when
        # coverage is, so its return is seen live
        buffered = rng.random() < 0.4 and n > 6
        i = int(rng.integers(1, max(2, n - 4)))
        k = int(rng.integers(2, max(3, min(10, n - i))))
        away, heading = rng.uniform(150, 500), rng.uniform(0, 2 * math.pi)
        if buffered and rng.random() < 0.5:
            xy[i:i + k] += away * np.array([math.cos(heading), math.sin(heading)])
        after = int(rng.integers(1, 5)) if rng.random() < 0.6 else None    # later fixes that come first
        lon, lat = lonlat(xy[:, 0], xy[:, 1])
        acc = [None if rng.random() < 0.5 else float(rng.choice([3, 8, 25])) for _ in range(n)]
        reports = [RefReport(f"{farm}/cow{d}", int(t), float(la), float(lo), a)
                   for t, la, lo, a in zip(ts, lat, lon, acc)]
        for i in range(n):                                                 # retries and odd arrivals
            if rng.random() < 0.05:
                reports.insert(i, reports[i])
        if rng.random() < 0.3 and len(reports) > 3:                       # a few swapped neighbours
            i = int(rng.integers(0, len(reports) - 1))
            reports[i], reports[i + 1] = reports[i + 1], reports[i]
        j = int(rng.integers(i + 1, len(reports) + 1)) if after is None else i + after
        if buffered and buffer_last:                                       # the buffered block, uploaded later
            block = reports[i:i + k]
            del reports[i:i + k]
            reports[min(j, len(reports)):min(j, len(reports))] = block
        if rng.random() < 0.1 and len(reports) > 2:                        # a repeated time, new place
            r = reports[1]
            reports.insert(2, RefReport(r.device, r.ts, r.lat + 1e-4, r.lon, r.accuracy))
        out += reports
    # devices interleaved in arrival order, each device's own order kept
    order = np.argsort(rng.random(len(out)), kind="stable")
    per_device: dict[str, list[RefReport]] = {}
    for r in out:
        per_device.setdefault(r.device, []).append(r)
    queues = {k: iter(v) for k, v in per_device.items()}
    names = [r.device for r in out]
    return [next(queues[names[i]]) for i in order]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])   # examples: the profile (conftest)
@given(seed=st.integers(0, 2**32 - 1), fences=st.integers(1, 6), devices=st.integers(1, 8),
       batches=st.integers(1, 4), buffer_last=st.booleans())
def test_vectorized_core_matches_the_reference_event_for_event(seed, fences, devices, batches, buffer_last):
    """Both arrival orders of buffered fixes: uploaded after later fixes (late), or where they belong."""
    rng = np.random.default_rng(seed)
    defs = {}
    for j in range(fences):
        farm = "farm-a" if j % 4 else "farm-b"
        defs[f"{farm}/f{j}"] = (_polygon(rng), _props(rng))
    job = Job({uid: feature(g, **p) for uid, (g, p) in defs.items()})
    ref = Reference([ref_fence(uid, job.cache.geometry(uid), **p) for uid, (g, p) in defs.items()])
    reports = _tracks(rng, devices, buffer_last)
    cuts = sorted(rng.integers(0, len(reports) + 1, batches - 1).tolist())
    for lo, hi in zip([0] + cuts, cuts + [len(reports)]):
        job.batch(reports[lo:hi])
        ref.feed_batch(reports[lo:hi])
    got = {}
    for e in job.events:
        got.setdefault(e.device_id, []).append((e.fence_id, e.type, e.ts, e.inferred, e.late, e.event_id))
    want = {}
    for e in ref.events:
        want.setdefault(e.device_id, []).append((e.fence_id, e.type, e.ts, e.inferred, e.late, e.event_id))
    assert got == want


def _inside_point(rng: np.random.Generator, geom: shapely.Geometry) -> tuple[float, float] | None:
    """A point well inside `geom` (lon, lat): a grazing spot 20 m or more from its boundary (None: the
    shape has none)."""
    deep = geom.buffer(-20 / KY)
    if deep.is_empty:
        return None
    minx, miny, maxx, maxy = deep.bounds
    while True:
        p = shapely.Point(rng.uniform(minx, maxx), rng.uniform(miny, maxy))
        if deep.contains(p):
            return p.x, p.y


@given(seed=st.integers(0, 2**32 - 1), data=st.data())
def test_a_night_escape_gives_the_same_events_whether_its_buffer_comes_first_or_last(seed, data):
    """A paddock p (random shape and debounce), maybe a neighbour's n where the buffered fixes lie: fixes
    inside p in the evening, a buffer out of p at night, fixes back inside in the morning. In place,
    after 1-4 of the morning's fixes (within the live fixes a device keeps), retried or not, in any
    batches: the job gives the reference's events, and the same types and times in every order,
    `late` exactly when the buffer came after the morning's fixes."""
    rng = np.random.default_rng(seed)
    rules = [{"debounce_reports": int(rng.choice([1, 2, 3])), "debounce_seconds": float(rng.choice([0, 90, 600]))}
             for _ in range(2)]
    paddock = _polygon(rng)
    while (home := _inside_point(rng, paddock)) is None:                  # a strip: no room to graze
        paddock = _polygon(rng)
    far = shapely.affinity.translate(paddock, 2000 / KX, 0)
    away = _inside_point(rng, far)
    defs = {"farm-a/p": (paddock, rules[0])}
    if rng.random() < 0.5:
        defs["farm-a/n"] = (far, rules[1])           # the neighbour's paddock the buffer is in
    jitter = lambda c: (c[0] + rng.normal(0, 2) / KX, c[1] + rng.normal(0, 2) / KY)   # metres of GPS noise
    t = T0
    fixes = {}
    for part, n, where in (("evening", int(rng.integers(3, 6)), home), ("night", int(rng.integers(3, 9)), away),
                           ("morning", int(rng.integers(3, 5)), home)):
        fixes[part] = []
        for _ in range(n):
            t += int(rng.integers(5, 16)) * MIN
            lon, lat = jitter(where)
            fixes[part].append(RefReport("farm-a/cow", t, float(lat), float(lon)))
        t += 6 * 60 * MIN if part == "evening" else 0
    evening, night, morning = fixes["evening"], fixes["night"], fixes["morning"]
    first = data.draw(st.integers(0, len(morning)), label="morning fixes before the buffer")
    arrival = evening + morning[:first] + night + morning[first:]
    if data.draw(st.booleans(), label="retried"):
        arrival += night
    cuts = sorted(data.draw(st.lists(st.integers(0, len(arrival)), max_size=3), label="batch cuts"))
    in_place = evening + night + morning

    def run(reports: list[RefReport], batch_cuts: list[int]):
        job = Job({uid: feature(g, **p) for uid, (g, p) in defs.items()})
        ref = Reference([ref_fence(uid, job.cache.geometry(uid), **p) for uid, (g, p) in defs.items()])
        for lo, hi in zip([0] + batch_cuts, batch_cuts + [len(reports)]):
            job.batch(reports[lo:hi])
            ref.feed_batch(reports[lo:hi])
        got = [(e.fence_id, e.type, e.ts, e.inferred, e.late, e.event_id) for e in job.events]
        assert got == [(e.fence_id, e.type, e.ts, e.inferred, e.late, e.event_id) for e in ref.events]
        return got, job.stored["farm-a/cow"]

    want, state_in_place = run(in_place, [])
    got, state = run(arrival, cuts)
    late = first > 0
    assert sorted((f, k, ts) for f, k, ts, *_ in got) == sorted((f, k, ts) for f, k, ts, *_ in want)
    assert [e[4] for e in got if e[2] > evening[-1].ts] == [late] * len([e for e in want if e[2] > evening[-1].ts])
    assert any(e[1] == "exit" and e[0] == "p" for e in want)             # the escape is there to find
    inside = lambda st_: (st_["t"], {u: f[0] for u, f in st_["f"].items()})
    assert inside(state) == inside(state_in_place)                       # as the morning's fixes say
