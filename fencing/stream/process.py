"""Stage 2 of a micro-batch, once per routed partition (fencing.stream.stages runs it): membership
against the worker's fence cache, device state read in bulk from Redis (versioned by batch id),
debounced transitions, and the idempotent live-state writes (state, positions, position index, fence
members). Events, the side rows it was handed, and the partition's load statistics go back to the
driver as rows (fencing.stream.rows).

Its steps, in order: drop the fence groups a new routing version moved (the elastic controller's
reconfiguration), shed the reports that cannot change any state when the routing table asks for it
(fencing.stream.shedding), then process the rest, at most DEVICE_CHUNK devices at a time.
"""
from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa

from fencing.model import compact_json, history, keys, notify
from fencing.stream import rows, worker_gc
from fencing.stream.fence_cache import process_cache
from fencing.model.h3util import cells_for_points, cells_to_strs
from fencing.model.heartbeat import PartitionStats
from fencing.model.node_pipe import NodePipeline
from fencing.model.redis_conn import cluster
from fencing.stream.routing import RoutingTable, buckets_of, device_runs, group_slot
from fencing.stream.shedding import shed_reports
from fencing.stream.sinks import event_log, public_events
from fencing.model.transitions import DeviceState, Event, state_before, state_record
from fencing.stream.batch_core import BatchReports, advance_batch, match_batch
from fencing.stream.batch_core import matched_sets as _matched_sets  # noqa: F401 - its unit test imports it here


@dataclass(frozen=True)
class ProcessContext:
    batch_id: int
    redis_host: str
    redis_port: int
    routing: RoutingTable
    deleted: frozenset[str]
    history_dir: str = ""       # Parquet history root (shared storage on a cluster); "" = none
    run_id: str = ""            # the streaming query's id: batch ids restart when a checkpoint is cleared
    seen_step_ms: int = 0       # a device's last-seen index entry is rewritten once it is this old (silent.py)
    epoch: int = 0              # the active job's lease epoch: the tasks write as its user (fencing.model.job_user)
    elastic: bool = False       # report the loads the elastic controller plans by (per group and bucket)

    @property
    def version(self) -> str:
        """What device state and history files are versioned by: unique across query runs."""
        return f"{self.run_id}:{self.batch_id}"


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


def process_partition(ctx: ProcessContext, given: rows.StageInput, partition: int):
    """The routed partition `partition`'s reports processed (fencing.stream.stages calls it, once per
    routed partition a task serves); its events, the side rows it was handed and its statistics out."""
    started = time.perf_counter()
    side = list(given.side)
    reports = given.reports
    evs: list[list] = [[], [], [], []]          # public JSON, key, ts, event id
    stats = PartitionStats(partition)
    reload_s = _drop_moved_groups(ctx, reports)
    shed = 0
    if reports is not None and reports.num_rows and ctx.routing.shed:
        reports, shed = shed_reports(cluster(ctx.redis_host, ctx.redis_port), ctx.routing, reports, ctx.deleted,
                                     ctx.version)
    if reports is not None and reports.num_rows:
        history.write_batch(ctx.history_dir, ctx.version, partition, reports)
        for part in device_chunks(reports, DEVICE_CHUNK):   # devices are independent of each other
            with worker_gc.collector_paused():
                events, publics, part_stats = _process_reports(ctx, partition, part)
            evs[0] += [p.decode() for p in publics]
            evs[1] += [e.fence_id for e in events]
            evs[2] += [e.ts for e in events]
            evs[3] += [e.event_id for e in events]
            part_stats.events = len(events)
            stats = _merged(stats, part_stats) if stats.points else part_stats
            del events, part_stats
    stats.seconds = round(time.perf_counter() - started, 4)
    stats.worker_pid = os.getpid()
    stats.reload_s, stats.shed = round(reload_s, 4), shed
    side.append((rows.STATS, stats.to_json()))
    n, m = len(evs[0]), len(side)
    if n:
        yield pa.RecordBatch.from_arrays([pa.array(np.full(n, rows.EVENT, np.int8)), pa.array(evs[0], pa.string()),
                                          pa.array(evs[1], pa.string()), pa.array(evs[2], pa.int64()),
                                          pa.array(evs[3], pa.string())], schema=rows.OUTPUT)
    yield pa.RecordBatch.from_arrays([
        pa.array(np.array([k for k, _ in side], np.int8)), pa.array([p for _, p in side], pa.string()),
        pa.nulls(m, pa.string()), pa.nulls(m, pa.int64()), pa.nulls(m, pa.string())], schema=rows.OUTPUT)


_SEEN_ROUTING = {"version": None}     # the last routing version this worker's cache was adjusted to


def _drop_moved_groups(ctx: ProcessContext, reports: pa.Table | None) -> float:
    """Drop exactly the groups the routing version moved from this worker's fence cache (once per
    version and worker), and reload those this task serves now. Returns the reload's seconds: the
    task's share of the reconfiguration stall, which the controller reports."""
    table = ctx.routing
    if _SEEN_ROUTING["version"] == table.version:
        return 0.0
    _SEEN_ROUTING["version"] = table.version
    if not table.moved:
        return 0.0
    cache = process_cache()
    cache.invalidate(list(table.moved))
    if reports is None or not reports.num_rows:
        return 0.0
    started = time.perf_counter()
    want = sorted(set(reports.column("grp").unique().to_pylist()) & set(table.moved))
    if want:
        cache.refresh(cluster(ctx.redis_host, ctx.redis_port), want)
    return time.perf_counter() - started


# A task works on at most this many devices at a time: its memory is bounded by this, not by how many
# devices a batch touches (a million collars reporting once each in one batch; issue 23)
DEVICE_CHUNK = 100_000


def device_chunks(reports: pa.Table, limit: int = DEVICE_CHUNK) -> list[pa.Table]:
    """`reports` split by device id into tables of at most `limit` devices, each device's rows
    together and in their order; one table (itself) when it has no more devices than that."""
    if reports.num_rows <= limit:
        return [reports]
    encoded = reports.column("device_id").combine_chunks().dictionary_encode()
    if len(encoded.dictionary) <= limit:
        return [reports]
    chunk = encoded.indices.to_numpy(zero_copy_only=False) // limit
    return [reports.filter(pa.array(chunk == c)) for c in range(int(chunk.max()) + 1)]


def _merged(a: PartitionStats, b: PartitionStats) -> PartitionStats:
    groups = Counter(a.groups)
    groups.update(b.groups)
    stage, stage_cpu = Counter(a.stage_s), Counter(a.stage_cpu_s)
    stage.update(b.stage_s)
    stage_cpu.update(b.stage_cpu_s)
    route_groups = Counter(a.route_groups)
    route_groups.update(b.route_groups)
    children = {g: dict(c) for g, c in a.children.items()}
    for g, per_bucket in b.children.items():
        into = children.setdefault(g, {})
        for bucket, k in per_bucket.items():
            into[bucket] = into.get(bucket, 0) + k
    return PartitionStats(a.partition, points=a.points + b.points, devices=a.devices + b.devices,
                          events=a.events + b.events, redis_local=a.redis_local + b.redis_local,
                          redis_cross=a.redis_cross + b.redis_cross, fences_cached=b.fences_cached,
                          groups=dict(groups), stage_s={k: round(v, 4) for k, v in stage.items()},
                          stage_cpu_s={k: round(v, 4) for k, v in stage_cpu.items()},
                          route_groups=dict(route_groups), children=children)


def _process_reports(ctx: ProcessContext, partition: int, reports: pa.Table):
    redis = cluster(ctx.redis_host, ctx.redis_port, ctx.epoch)
    counter = CallCounter(ctx.routing, partition)
    # Arrival (Kafka offset) order per device, not ts order: a late report must meet the state its
    # device already has, whichever batch it lands in (the shuffle keeps one map task's row order).
    runs = device_runs(reports.column("farm_id"), reports.column("device_id"))
    order = np.argsort(runs.codes, kind="stable")
    batch = BatchReports.from_arrow(reports, order)
    codes = runs.codes[order]

    cache = process_cache()
    groups = sorted(reports.column("grp").unique().to_pylist())
    clock = _Stopwatch()
    cache.refresh(redis, groups)
    clock.lap("refresh")
    for group in groups:
        counter.count(group)
    found = match_batch(cache, batch)
    clock.lap("match")

    # the device's home group for this batch = group of its last report (same rule as the router)
    bounds = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    ends = np.r_[bounds[1:], len(batch)]
    devices = DeviceBatch(dkeys=[runs.keys[c] for c in codes[bounds].tolist()], homes=batch.grp[ends - 1].tolist())
    _read_states(redis, ctx.version, devices, counter)
    clock.lap("read_state")

    states = [DeviceState.from_dict(b) for b in devices.before]     # advanced in place below
    outcome = advance_batch(cache, batch, found, bounds, ends, devices.dkeys, states, ctx.deleted)
    events, latest_row = outcome.events, outcome.latest_row
    devices.frame_ts, devices.frame_lat, devices.frame_lon = outcome.ts, outcome.lat, outcome.lon
    clock.lap("advance")
    changed = _write_all(redis, ctx.version, devices, states, latest_row, events, counter, ctx.seen_step_ms,
                         outcome.dropped)
    clock.lap("write")
    # the task's events into their farms' logs (once per event id) before the batch commits: a
    # replay recomputes the same ids, and the driver only produces them to Kafka
    dicts = [e.__dict__ for e in events]
    publics = public_events(dicts)
    event_log(redis).add(dicts, publics, returning=False)
    # after the writes AND the events: API workers drop cached answers, and their live streams read
    # the farm's events at once (announced before the events, a stream waited for its next poll)
    notify.live_changed(redis, changed)
    clock.lap("events")
    group_points = Counter(batch.grp.tolist())
    stats = PartitionStats(partition, points=len(batch), devices=len(devices.dkeys), groups=dict(group_points),
                           redis_local=counter.local, redis_cross=counter.cross, fences_cached=len(cache),
                           stage_s=clock.laps, stage_cpu_s=clock.cpu)
    if ctx.elastic:
        stats.children, stats.route_groups = routed_loads(devices.dkeys, devices.homes, ends - bounds)
    return events, publics, stats


def routed_loads(dkeys: list[str], homes: list[str], counts: np.ndarray
                 ) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Points per (group, device bucket) and per group, attributed as the router routes: all of a
    device's reports count for its home group (the group of its last report). The controller splits
    and moves by these."""
    children: dict[str, dict[str, int]] = {}
    for home, bucket, k in zip(homes, buckets_of(dkeys), counts.tolist()):
        per_group = children.setdefault(home, {})
        per_group[bucket] = per_group.get(bucket, 0) + k
    return children, {group: sum(per.values()) for group, per in children.items()}


class _Stopwatch:
    """Seconds spent per step of the task (reported in the stats row: where a batch's time goes), on
    the wall clock and in the task thread's CPU time: the difference is waiting, on Redis or for a core."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._last, self._last_cpu = time.perf_counter(), time.thread_time()

    def lap(self, name: str) -> None:
        now, now_cpu = time.perf_counter(), time.thread_time()
        self.laps[name] = round(self.laps.get(name, 0.0) + now - self._last, 4)
        self.cpu[name] = round(self.cpu.get(name, 0.0) + now_cpu - self._last_cpu, 4)
        self._last, self._last_cpu = now, now_cpu


@dataclass
class DeviceBatch:
    """The devices of one task's batch: key, home group, state before the batch, where it moved from."""
    dkeys: list[str]
    homes: list[str]
    before: list[dict | None] = None
    moved_from: list[str | None] = None
    frame_ts: list[int] = None
    frame_lat: list[float] = None
    frame_lon: list[float] = None


def _by(keys_: list, values: list) -> dict:
    out: dict = {}
    for k, v in zip(keys_, values):
        out.setdefault(k, []).append(v)
    return out


def _read_states(redis, version: str, devices: DeviceBatch, counter: CallCounter) -> None:
    """State of each device before this batch, one HMGET per home group. Versioned records make a
    replay of the same batch start from the same state (transitions.state_record: the state after the
    batch that wrote it, and what the state before it had different)."""
    n = len(devices.dkeys)
    raws: list[str | None] = [None] * n
    by_home = _by(devices.homes, range(n))
    pipe = NodePipeline(redis)
    for home, idx in by_home.items():
        pipe.hmget(keys.group_state(home), [devices.dkeys[i] for i in idx])
        counter.count(home)
    for idx, values in zip(by_home.values(), pipe.execute()):
        for i, raw in zip(idx, values):
            raws[i] = raw
    devices.moved_from = [None] * n
    missing = [i for i in range(n) if raws[i] is None]
    if missing:   # new devices, or devices whose home group changed since their last batch
        by_bucket = _by([keys.device_location(devices.dkeys[i]) for i in missing], missing)
        for bucket, idx in by_bucket.items():
            pipe.hmget(bucket, [devices.dkeys[i] for i in idx])
        previous: dict[int, str] = {}
        for idx, values in zip(by_bucket.values(), pipe.execute()):
            previous.update({i: g for i, g in zip(idx, values) if g and g != devices.homes[i]})
        if previous:
            by_old = _by(list(previous.values()), list(previous))
            for group, idx in by_old.items():
                pipe.hmget(keys.group_state(group), [devices.dkeys[i] for i in idx])
                counter.count(group)
            for (group, idx), values in zip(by_old.items(), pipe.execute()):
                for i, raw in zip(idx, values):
                    raws[i], devices.moved_from[i] = raw, group
    devices.before = [state_before(orjson.loads(raw) if raw else None, version) for raw in raws]


def _write_all(redis, version: str, devices: DeviceBatch, states: list[DeviceState], latest_row: np.ndarray,
               events: list[Event], counter: CallCounter, seen_step_ms: int = 0,
               dropped: list[tuple[str, str, int]] = ()) -> set[str]:
    """All writes of the task in one pipeline, batched per key: device state per home group, device
    locations per bucket, positions per farm, position index per cell, members per fence. Plain
    overwrites and set operations, so a replayed batch writes the same values again. Returns the farms
    written (for the change notice)."""
    state_by_home: dict[str, dict[str, bytes]] = {}
    removed_by_old: dict[str, list[str]] = {}
    locations: dict[str, dict[str, str]] = {}
    positions: dict[str, dict[str, bytes]] = {}
    seen: dict[str, dict[str, int]] = {}     # silence is judged by when reports arrive, not their ts
    received_ms = int(time.time() * 1000)
    cell_adds: dict[tuple[str, str], list[str]] = {}
    cell_removes: dict[tuple[str, str], list[str]] = {}
    has_position = latest_row >= 0
    # per device as plain lists: a numpy scalar per device and field costs more than the work on it
    cell_of: list[str | None] = [None] * len(states)
    if has_position.any():
        rows = latest_row[has_position]
        found = cells_to_strs(cells_for_points(np.asarray(devices.frame_lat)[rows], np.asarray(devices.frame_lon)[rows],
                                               keys.POS_INDEX_RES))
        for d, cell in zip(np.flatnonzero(has_position).tolist(), found):
            cell_of[d] = cell
    for d, (dkey, home, state, row, cell) in enumerate(zip(devices.dkeys, devices.homes, states, latest_row.tolist(),
                                                           cell_of)):
        farm_id, _, device_id = dkey.partition("/")
        old = devices.before[d]
        if cell is not None:
            previous_cell = (old or {}).get("c")
            state.cell = cell
            if state.seen is None or received_ms - state.seen >= seen_step_ms:
                seen.setdefault(farm_id, {})[device_id] = received_ms
                state.seen = received_ms
            positions.setdefault(farm_id, {})[device_id] = compact_json.dumps({
                "lat": devices.frame_lat[row], "lon": devices.frame_lon[row], "ts": devices.frame_ts[row],
                "battery": state.battery, "rx": received_ms,
                "fences": [u.partition("/")[2] for u in state.inside_fences()]})   # its cell: in the state
            if previous_cell != cell:
                if previous_cell:
                    cell_removes.setdefault((farm_id, previous_cell), []).append(device_id)
                cell_adds.setdefault((farm_id, cell), []).append(device_id)
        state_by_home.setdefault(home, {})[dkey] = compact_json.dumps(state_record(version, state.to_dict(), old))
        moved_from = devices.moved_from[d]
        if moved_from:
            removed_by_old.setdefault(moved_from, []).append(dkey)
        if old is None or moved_from:
            locations.setdefault(keys.device_location(dkey), {})[dkey] = home
    pipe = NodePipeline(redis)
    for home, mapping in state_by_home.items():
        pipe.hset(keys.group_state(home), mapping)
        counter.count(home)
    for group, dkeys in removed_by_old.items():
        key = keys.group_state(group)
        pipe.command(key, "HDEL", key, *dkeys)
        counter.count(group)
    for bucket, mapping in locations.items():
        pipe.hset(bucket, mapping)
    for farm_id, mapping in positions.items():
        pipe.hset(keys.positions(farm_id), mapping)
    for farm_id, arrivals in seen.items():
        key = keys.last_seen(farm_id)
        pipe.command(key, "ZADD", key, *[x for device, ms in arrivals.items() for x in (ms, device)])
    for (farm_id, cell), members in cell_removes.items():
        key = keys.position_cell(farm_id, cell)
        pipe.command(key, "SREM", key, *members)
    for (farm_id, cell), members in cell_adds.items():
        key = keys.position_cell(farm_id, cell)
        pipe.command(key, "SADD", key, *members)
    final: dict[tuple[str, str, str], Event] = {}   # (farm, fence, device) → its last enter/exit
    for event in events:
        if event.type in ("enter", "exit") and not event.inferred and not event.late:   # those change no state
            final[(event.farm_id, event.fence_id, event.device_id)] = event
    for uid, dkey, t in dropped:      # a fence whose window closed: its member leaves without an event
        farm_id, _, fence_id = uid.partition("/")
        key = (farm_id, fence_id, dkey.partition("/")[2])
        if key not in final or final[key].ts <= t:
            final[key] = Event("", "exit", farm_id, key[2], fence_id, t, 0.0, 0.0)
    entered: dict[tuple[str, str], dict[str, int]] = {}
    exited: dict[tuple[str, str], list[str]] = {}
    for (farm_id, fence_id, device_id), event in final.items():
        if event.type == "enter":
            entered.setdefault((farm_id, fence_id), {})[device_id] = event.ts
        else:
            exited.setdefault((farm_id, fence_id), []).append(device_id)
    for (farm_id, fence_id), devices_out in exited.items():
        key = keys.members(farm_id, fence_id)
        pipe.command(key, "HDEL", key, *devices_out)
    for (farm_id, fence_id), mapping in entered.items():
        pipe.hset(keys.members(farm_id, fence_id), mapping)
    pipe.execute()
    return set(positions) | {farm for farm, _ in entered} | {farm for farm, _ in exited}

