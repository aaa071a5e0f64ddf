"""Load shedding in the process stage (Borealis-style, semantic): under overload the elastic
controller sets `shed` in the routing table, and each task drops the reports that provably cannot
change any fence state before it processes the rest (see `shed_reports`)."""
from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa

from fencing.stream.routing import RoutingTable
from fencing.model import keys
from fencing.model.crossings import MIN_SEGMENT_M, segment_length_m
from fencing.model.transitions import DeviceState, state_before
from fencing.stream.fence_cache import process_cache


def shed_reports(redis, table: RoutingTable, batch: pa.Table, deleted: frozenset,
                 version: str = "") -> tuple[pa.Table, int]:
    """Drop the reports that cannot change any fence state (Borealis-style semantic shedding).

    A device's report is shed only if ALL of these hold, for it and every earlier report of the device
    in this batch: the device's stored state has no pending streak and no dwell still to come; the
    report's res-9 cell is a boundary cell of no fence (so membership is exact from the cells: inside
    the fences whose interior holds the cell, outside all others); that membership (the device's farm's
    fences) equals the confirmed inside set; no confirmed fence has warn_m or an active window; no late
    excursion waits for its return (`DeviceState.open`: the next fixes may be it); the
    report is newer than every earlier one (a late fix is replayed, never shed); and the segments from
    the last kept fix to it, from it to the next report, and from the last kept fix to the next report
    are all shorter than `crossings.MIN_SEGMENT_M`, so no segment with or without it implies a crossing. Such a report resets no streak and flips nothing, so its
    only effect would be the position, which the device's last report of the batch (never shed)
    overwrites. A report that could produce an event is never shed. Reports are taken in arrival order
    and the state before batch `version` ("<run id>:<batch id>", `ProcessContext.version`) is read with
    the process stage's own reader (transitions.state_before), so a replayed batch sheds exactly what
    it shed the first time."""
    if not batch.num_rows:
        return batch, 0
    frame = batch.select(["farm_id", "device_id", "ts", "cell", "grp", "lat", "lon"]).to_pandas()
    frame["dkey"] = frame["farm_id"] + "/" + frame["device_id"]
    frame["row"] = np.arange(len(frame))
    frame = frame.sort_values("dkey", kind="stable")        # per device, arrival order (as processed)
    cache = process_cache()
    groups = sorted(frame["grp"].unique())
    cache.refresh(redis, groups)
    boundary: set[int] = set()
    interior: dict[int, set[str]] = {}
    for g in groups:
        for uid, cells in cache.cells_of(g).items():
            boundary.update(cells[1].tolist())
            for c in cells[0].tolist():
                interior.setdefault(c, set()).add(uid)
    last = frame.groupby("dkey", sort=False).tail(1)
    homes = dict(zip(last["dkey"], last["grp"]))
    pipe = redis.pipeline()
    dkeys = list(homes)
    for d in dkeys:
        pipe.hget(keys.group_state(homes[d]), d)
    states = {}
    for d, raw in zip(dkeys, pipe.execute()):
        if raw:
            states[d] = state_before(orjson.loads(raw), version)
    last_rows = set(last["row"].tolist())
    drop = np.zeros(len(batch), dtype=bool)
    cells = frame["cell"].to_numpy().astype(np.int64).view(np.uint64).tolist()
    ts, lat, lon = frame["ts"].tolist(), frame["lat"].tolist(), frame["lon"].tolist()

    def short(a: int | None, b: int | tuple) -> bool:
        (la0, lo0), (la1, lo1) = (b if isinstance(b, tuple) else (lat[b], lon[b])), (lat[a], lon[a])
        return float(segment_length_m(lo0, la0, lo1, la1)) < MIN_SEGMENT_M

    for d, rows in frame.groupby("dkey", sort=False).indices.items():
        raw = states.get(d)
        if raw is None:
            continue
        state = DeviceState.from_dict(raw)
        confirmed = set(state.inside_fences())
        if any(s.streak for s in state.fences.values()) or confirmed & deleted or state.open:
            continue        # (open: a late excursion waits for its return among the next fixes)
        if any(cache.rules.get(u) and cache.rules[u].dwell_seconds and not state.fences[u].dwelled
               for u in confirmed):
            continue
        if any(cache.rules.get(u) and cache.rules[u].watched for u in confirmed):
            continue
        if state.last_ts is None or state.last_lat is None:
            continue
        kept, newest = (state.last_lat, state.last_lon), state.last_ts
        farm = d.partition("/")[0]
        for k, i in enumerate(rows):
            row = int(frame["row"].iat[i])
            if row in last_rows:
                break
            c = cells[i]
            if c in boundary:
                break
            member = {u for u in interior.get(c, ()) if cache.fence_farm.get(u) == farm}
            if member != confirmed:
                break
            following = rows[k + 1]            # exists: the device's last report is never shed
            if ts[i] <= newest or not (short(i, kept) and short(following, i) and short(following, kept)):
                break
            newest = ts[i]
            drop[row] = True
    shed = int(drop.sum())
    return (batch.filter(pa.array(~drop)) if shed else batch), shed
