"""Stage 2 of a micro-batch (one task per routed partition): membership against the task's fence
cache, device state read in bulk from Redis (versioned by batch id), debounced transitions, and the
idempotent live-state writes (state, positions, position index, fence members). Events, dead letters,
pings and the partition's load statistics go back to the driver as rows.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
from pyspark import TaskContext

from fencing import history, keys
from fencing.fence_cache import process_cache
from fencing.h3util import cell_to_str, parent
from fencing.prepare import KIND_REPORT
from fencing.redis_conn import cluster
from fencing.routing import RoutingTable, group_slot
from fencing.transitions import DeviceState, Event, advance

OUT_KIND_EVENT, OUT_KIND_DEAD, OUT_KIND_PING, OUT_KIND_STATS = 0, 1, 2, 3
OUTPUT = pa.schema([("kind", pa.int8()), ("payload", pa.string())])
OUTPUT_DDL = "kind tinyint, payload string"


@dataclass(frozen=True)
class ProcessContext:
    batch_id: int
    redis_host: str
    redis_port: int
    routing: RoutingTable
    deleted: frozenset[str]
    history_dir: str = ""       # Parquet history root (shared storage on a cluster); "" = none


class CallCounter:
    """Counts Redis commands on group keys: local (the node aligned with this partition) vs cross-node."""

    def __init__(self, routing: RoutingTable, partition: int):
        self.routing, self.node = routing, routing.node_of_partition(partition)
        self.local = self.cross = 0

    def count(self, group: str, commands: int = 1) -> None:
        if int(self.routing.slot_node[group_slot(group)]) == self.node:
            self.local += commands
        else:
            self.cross += commands


def process_partition(ctx: ProcessContext, batches):
    started = time.perf_counter()
    partition = TaskContext.get().partitionId() if TaskContext.get() else 0
    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    table = pa.concat_tables(tables) if tables else None
    side: list[tuple[int, str]] = []
    stats = {"partition": partition, "points": 0, "groups": {}, "redis_local": 0, "redis_cross": 0, "events": 0}
    if table is not None:
        kinds = table.column("kind").to_numpy()
        payload = table.column("payload").to_pylist()
        side = [(OUT_KIND_DEAD if k == 1 else OUT_KIND_PING, payload[i])
                for i, k in enumerate(kinds) if k != KIND_REPORT]
        reports = table.filter(pa.array(kinds == KIND_REPORT))
        if reports.num_rows:
            history.write_batch(ctx.history_dir, ctx.batch_id, partition, reports)
            events, stats = _process_reports(ctx, partition, reports)
            side += [(OUT_KIND_EVENT, orjson.dumps(e.__dict__).decode()) for e in events]
            stats["events"] = len(events)
    stats["seconds"] = round(time.perf_counter() - started, 4)
    side.append((OUT_KIND_STATS, orjson.dumps(stats).decode()))
    yield pa.RecordBatch.from_arrays([pa.array([k for k, _ in side], pa.int8()),
                                      pa.array([p for _, p in side], pa.string())], schema=OUTPUT)


def _process_reports(ctx: ProcessContext, partition: int, reports: pa.Table):
    redis = cluster(ctx.redis_host, ctx.redis_port)
    counter = CallCounter(ctx.routing, partition)
    frame = reports.select(["farm_id", "device_id", "ts", "lat", "lon", "battery", "cell", "grp"]).to_pandas()
    frame["dkey"] = frame["farm_id"] + "/" + frame["device_id"]
    # Arrival (Kafka offset) order per device, not ts order: a late report must meet the state its
    # device already has, whichever batch it lands in (the shuffle keeps one map task's row order).
    frame = frame.sort_values("dkey", kind="stable").reset_index(drop=True)
    cells = frame["cell"].to_numpy().view(np.uint64)

    cache = process_cache()
    groups = sorted(frame["grp"].unique())
    cache.refresh(redis, groups)
    for group in groups:
        counter.count(group)
    point_idx, uids = cache.index.match(frame["lon"].to_numpy(), frame["lat"].to_numpy(), cells)
    if len(point_idx):   # tenancy: a farm's devices are tested against that farm's fences only
        fence_farm = np.array([cache.fence_farm.get(u, "") for u in uids], dtype=object)
        own = fence_farm == frame["farm_id"].to_numpy(dtype=object)[point_idx]
        point_idx, uids = point_idx[own], uids[own]
    matched = _matched_sets(len(frame), point_idx, uids)

    # the device's home group for this batch = group of its latest report (same rule as the router)
    bounds = np.flatnonzero(np.r_[True, frame["dkey"].to_numpy()[1:] != frame["dkey"].to_numpy()[:-1]])
    ends = np.r_[bounds[1:], len(frame)]
    dkeys = frame["dkey"].to_numpy()[bounds].tolist()
    homes = frame["grp"].to_numpy()[ends - 1].tolist()
    before, moved_from = _read_states(redis, ctx.batch_id, dkeys, homes, counter)

    ts, lat, lon = frame["ts"].tolist(), frame["lat"].tolist(), frame["lon"].tolist()
    battery = frame["battery"].to_numpy()
    pos_cells = parent(cells, keys.POS_INDEX_RES)
    events: list[Event] = []
    writes = redis.pipeline()
    for d, (dkey, home, lo, hi) in enumerate(zip(dkeys, homes, bounds.tolist(), ends.tolist())):
        old = before[d]
        state = DeviceState.from_dict(old)
        farm_id, _, device_id = dkey.partition("/")
        found = advance(state, device_id, ts[lo:hi], lat[lo:hi], lon[lo:hi], matched[lo:hi],
                        cache.rules, ctx.deleted)
        events += found
        _write_live(writes, farm_id, device_id, old, state, frame, lo, hi, battery, pos_cells, found)
        _write_state(writes, ctx.batch_id, dkey, home, old, state, moved_from[d], counter)
    writes.execute()
    group_points = Counter(frame["grp"].tolist())
    stats = {"partition": partition, "points": len(frame), "devices": len(dkeys), "groups": dict(group_points),
             "redis_local": counter.local, "redis_cross": counter.cross, "fences_cached": len(cache.index)}
    return events, stats


def _matched_sets(n: int, point_idx: np.ndarray, uids: np.ndarray) -> list[frozenset[str]]:
    matched: list[frozenset[str]] = [frozenset()] * n
    if len(point_idx):
        order = np.argsort(point_idx, kind="stable")
        point_idx, uids = point_idx[order], uids[order]
        starts = np.flatnonzero(np.r_[True, point_idx[1:] != point_idx[:-1]])
        for s, e in zip(starts, np.r_[starts[1:], len(point_idx)]):
            matched[int(point_idx[s])] = frozenset(uids[s:e].tolist())
    return matched


def _read_states(redis, batch_id: int, dkeys: list[str], homes: list[str], counter: CallCounter):
    """State of each device before this batch. Versioned records make a replay of the same batch
    start from the same state: {"b": batch that wrote it, "s": state after it, "p": state before it}."""
    pipe = redis.pipeline()
    for dkey, home in zip(dkeys, homes):
        pipe.hget(keys.group_state(home), dkey)
        counter.count(home)
    raws = pipe.execute()
    moved_from: list[str | None] = [None] * len(dkeys)
    missing = [i for i, r in enumerate(raws) if r is None]
    if missing:   # new devices, or devices whose home group changed since their last batch
        pipe = redis.pipeline()
        for i in missing:
            pipe.get(keys.device_location(dkeys[i]))
        previous_homes = pipe.execute()
        lookups = [(i, g) for i, g in zip(missing, previous_homes) if g and g != homes[i]]
        if lookups:
            pipe = redis.pipeline()
            for i, group in lookups:
                pipe.hget(keys.group_state(group), dkeys[i])
                counter.count(group)
            for (i, group), raw in zip(lookups, pipe.execute()):
                raws[i], moved_from[i] = raw, group
    before = []
    for raw in raws:
        record = orjson.loads(raw) if raw else None
        if record is None:
            before.append(None)
        else:
            before.append(record.get("p") if record.get("b") == batch_id else record.get("s"))
    return before, moved_from


def _write_state(pipe, batch_id, dkey, home, old, state: DeviceState, moved_from, counter) -> None:
    pipe.hset(keys.group_state(home), dkey, orjson.dumps({"b": batch_id, "s": state.to_dict(), "p": old}))
    counter.count(home)
    if moved_from:
        pipe.hdel(keys.group_state(moved_from), dkey)
        counter.count(moved_from)
    if old is None or moved_from:
        pipe.set(keys.device_location(dkey), home)


def _write_live(pipe, farm_id, device_id, old, state: DeviceState, frame, lo, hi, battery, pos_cells, found) -> None:
    """Latest position, res-7 position index and fence members: plain overwrites, so a replay is a no-op."""
    stamps = frame["ts"].to_numpy()[lo:hi]
    floor = (old or {}).get("t")
    running = np.maximum.accumulate(np.r_[floor if floor is not None else np.iinfo(np.int64).min, stamps])
    processed = stamps >= running[:-1]      # the same rule as transitions.advance: never older than seen
    if not processed.any():
        return   # every report was older than the last processed one
    last = lo + int(np.flatnonzero(processed)[-1])
    cell = cell_to_str(int(pos_cells[last]))
    previous_cell = (old or {}).get("c")
    batteries = battery[lo:hi][processed]
    batteries = batteries[~np.isnan(batteries)]
    state.cell = cell
    position = {"lat": float(frame.at[last, "lat"]), "lon": float(frame.at[last, "lon"]),
                "ts": int(frame.at[last, "ts"]), "battery": float(batteries[-1]) if len(batteries) else None,
                "fences": [u.partition("/")[2] for u in state.inside_fences()], "cell": cell}
    pipe.hset(keys.positions(farm_id), device_id, orjson.dumps(position))
    if previous_cell and previous_cell != cell:
        pipe.srem(keys.position_cell(farm_id, previous_cell), device_id)
    pipe.sadd(keys.position_cell(farm_id, cell), device_id)
    for event in found:
        member_key = keys.members(farm_id, event.fence_id)
        if event.type == "enter":
            pipe.hset(member_key, device_id, event.ts)
        elif event.type == "exit":
            pipe.hdel(member_key, device_id)
