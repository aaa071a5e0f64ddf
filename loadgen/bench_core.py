"""`herdfence bench core`: the process stage's computing core alone, per step, without Kafka, Spark or
Redis: what a change to matching, the state machine or the state's encoding costs, in seconds, with
none of the stack's noise (a push run moves ±10% between runs here).

A simulated herd (loadgen.herd) is cut into equal micro-batches in arrival order, and each batch runs
the job's own steps on one core: the batch's columns in device order (BatchReports), the device states
read back from their stored records (JSON, the versioned record, DeviceState), matching against the
fence cache, advancing every device (fencing.stream.batch_core), and the state and position records
encoded as the process stage writes them. The first batch (every device new) warms up and is not
counted. The cyclic GC is paused as in a process task. The events are reconciled with the oracle
(loadgen.reference): a core that got faster by getting something wrong does not pass.

    herdfence bench core --fences 10000 --points 1000000 --devices 10000 [--batches 4] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa

STEPS = ("frame", "read_state", "match", "advance", "write")


def fence_cache(features: dict[str, dict]):  # noqa: ANN201 - fencing.stream.fence_cache.FenceCache
    """A job's fence cache holding `features` (uid "farm/fence" → GeoJSON Feature), each validated and
    split into its cell groups as `save_fence` stores it, indexes built."""
    from fencing.model import fence_store
    from fencing.stream.fence_cache import FenceCache
    by_group: dict[str, dict[str, dict]] = {}
    for uid, feature in features.items():
        farm_id, _, fence_id = uid.partition("/")
        valid = fence_store.validate_feature(feature)
        for group, record in fence_store.group_records(farm_id, fence_id, 1, valid).items():
            by_group.setdefault(group, {})[uid] = record
    cache = FenceCache()
    cache.install([(g, 1, records) for g, records in by_group.items()])
    cache.build_indexes()
    return cache


def reports_table(dkeys, ts, lat, lon, battery, accuracy) -> pa.Table:  # noqa: ANN001 - sequences
    """A batch's reports as the process stage receives them (fencing.stream.rows.STAGE_REPORT), in
    arrival order; `dkeys` "farm/device"."""
    from fencing.model.geometry import group_names
    from fencing.model.h3util import cells_for_points
    from fencing.model.keys import FENCE_RES
    lat, lon = np.asarray(lat, np.float64), np.asarray(lon, np.float64)
    cells = cells_for_points(lat, lon, FENCE_RES)
    names, code = group_names(cells)
    return pa.table({"farm_id": [k.partition("/")[0] for k in dkeys], "ts": np.asarray(ts, np.int64),
                     "lat": lat, "lon": lon, "battery": np.asarray(battery, np.float64),
                     "cell": cells.view(np.int64), "grp": names[code],
                     "accuracy_m": pa.array(accuracy, pa.float64())})


def device_frame(table: pa.Table, dkeys) -> tuple:  # noqa: ANN001 - a sequence of str
    """(BatchReports grouped by device in arrival order, each device's first row, one past its last,
    the device keys): the process stage's view of `table`."""
    from fencing.stream.batch_core import BatchReports
    codes, keys = pd.factorize(pd.Series(dkeys))
    order = np.argsort(codes, kind="stable")            # grouped by device, arrival order kept
    frame = BatchReports.from_arrow(table, order)
    codes = codes[order]
    bounds = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    ends = np.r_[bounds[1:], len(frame)]
    return frame, bounds, ends, [keys[c] for c in codes[bounds].tolist()]


def run(fences: int, points: int, devices: int, batches: int = 4, seed: int = 0, tracks: str = "dense") -> dict:
    from fencing.model import compact_json
    from fencing.model.transitions import DeviceState, state_before, state_record
    from fencing.stream import worker_gc
    from fencing.stream.batch_core import advance_batch, match_batch
    from loadgen.herd import TRACKS, SimConfig, simulate
    from loadgen.reference import expected_events
    from loadgen.truth import reconcile

    sim = simulate(SimConfig.for_totals(fences, points, devices, seed=seed, **TRACKS[tracks]))
    cache = fence_cache({f"{fence.farm_id}/{fence.fence_id}": fence.geojson for fence in sim.fences})

    reports = sim.reports
    dkeys = np.array([f"{sim.device_farm[d]}/{d}" for d in reports["device_id"]], dtype=object)
    stored: dict[str, bytes] = {}
    seconds: Counter = Counter()
    events: list = []
    counted = devices_counted = 0
    edges = np.linspace(0, len(reports), batches + 1).astype(int)
    for b, (lo, hi) in enumerate(zip(edges[:-1].tolist(), edges[1:].tolist())):
        version = f"core:{b}"
        table = reports_table(dkeys[lo:hi], reports["ts"].to_numpy()[lo:hi], reports["lat"].to_numpy()[lo:hi],
                              reports["lon"].to_numpy()[lo:hi], reports["battery"].to_numpy()[lo:hi],
                              [None] * (hi - lo))
        lap: dict[str, float] = {}
        with worker_gc.collector_paused():
            t = time.perf_counter()
            frame, bounds, ends, device_keys = device_frame(table, dkeys[lo:hi])
            lap["frame"], t = time.perf_counter() - t, time.perf_counter()
            before = [state_before(orjson.loads(raw) if raw else None, version)
                      for raw in (stored.get(k) for k in device_keys)]
            states = [DeviceState.from_dict(s) for s in before]
            lap["read_state"], t = time.perf_counter() - t, time.perf_counter()
            found = match_batch(cache, frame)
            lap["match"], t = time.perf_counter() - t, time.perf_counter()
            outcome = advance_batch(cache, frame, found, bounds, ends, device_keys, states, frozenset())
            lap["advance"], t = time.perf_counter() - t, time.perf_counter()
            for key, state, old, row in zip(device_keys, states, before, outcome.latest_row.tolist()):
                stored[key] = compact_json.dumps(state_record(version, state.to_dict(), old))
                if row >= 0:
                    compact_json.dumps({"lat": outcome.lat[row], "lon": outcome.lon[row], "ts": outcome.ts[row],
                                        "battery": state.battery, "rx": 0,
                                        "fences": [u.partition("/")[2] for u in state.inside_fences()]})
            lap["write"] = time.perf_counter() - t
        events += outcome.events
        if b:                                   # the first batch warms up: every device is new
            seconds.update(lap)
            counted += hi - lo
            devices_counted += len(device_keys)
    observed = pd.DataFrame([(e.device_id, e.fence_id, e.type, e.ts) for e in events],
                            columns=["device_id", "fence_id", "type", "ts"])
    rec = reconcile(expected_events(reports, sim.fences, sim.device_farm), observed)
    per_100k = {step: round(seconds[step] / counted * 1e5, 4) for step in STEPS} if counted else {}
    return {"fences": fences, "points": points, "devices": devices, "batches": batches, "tracks": tracks,
            "points_counted": counted, "device_batches_counted": devices_counted,
            "seconds_per_100k_points": per_100k,
            "us_per_device_batch": {step: round(seconds[step] / devices_counted * 1e6, 2) for step in STEPS}
            if devices_counted else {},
            "points_per_s": round(counted / sum(seconds.values()), 1) if counted else None,
            "events": len(events), "lost": rec["lost"], "duplicated": rec["duplicated"],
            "unexpected": rec.get("unexpected", 0)}


def parser(prog: str, doc: str, fences: int, points: int, batches: int) -> argparse.ArgumentParser:
    """The options `bench core` and `bench stage` share (with their own defaults)."""
    from loadgen.herd import TRACKS
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fences", type=int, default=fences)
    p.add_argument("--points", type=int, default=points)
    p.add_argument("--devices", type=int, default=10_000)
    p.add_argument("--batches", type=int, default=batches, help="micro-batches the points are cut into (the first warms up)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tracks", choices=sorted(TRACKS), default="dense",
                   help="dense: a fix every ~30 s; sparse: every 5-15 min, 5%% uploaded late (loadgen.herd.TRACKS)")
    p.add_argument("--json", metavar="FILE")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    args = p.parse_args(argv)
    if args.batches < 2:
        p.error("--batches must be at least 2: the first one only warms up")
    return args


def finish(out: dict, command: str, json_path: str | None) -> int:
    """Stamp the result (time, machine, command), write it to `json_path` and print it; the exit code
    says whether every event was reconciled."""
    from loadgen.bench_stack import machine
    out["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["machine"] = machine()
    out["command"] = command
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    return 0 if not out["lost"] and not out["duplicated"] else 1


def main(argv: list[str]) -> int:
    args = parse(parser("herdfence bench core", __doc__, 10_000, 1_000_000, 4), argv)
    out = run(args.fences, args.points, args.devices, args.batches, args.seed, args.tracks)
    return finish(out, " ".join(["herdfence", "bench", "core", *argv]), args.json)
