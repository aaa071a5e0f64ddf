"""Stage 1 of a micro-batch (narrow, on the Kafka input partitions): parse + validate, resolve each
report's farm, compute its H3 cell and cell group, and the route of its device.

A device's reports of a batch all sit in one Kafka partition (key = device id), so this stage sees them
together and routes them all to the partition of the group of the device's latest report: one task
then owns the device's state for the batch.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from deploy.settings import TOPIC_REPORTS
from fencing import keys
from fencing.geometry import group_names
from fencing.h3util import cells_for_points
from fencing.redis_conn import cluster
from fencing.routing import RoutingTable, buckets_of, device_runs
from ingest.validate import DeadLetter, parse_kafka_values

KIND_REPORT, KIND_DEAD, KIND_PING, KIND_READ = 0, 1, 2, 3   # KIND_READ: the reader's own timings

def _listed(t: pa.DataType) -> pa.DataType:
    return pa.list_(pa.field("element", t))       # Spark's name for an array's items


# What the readers hand to the shuffle: one row per device and batch (its reports' values as arrays,
# in arrival order), plus side rows (dead letters, pings, reader timings; payload set, arrays null).
# Per device rather than per report: the JVM converts and shuffles rows and strings, and a flood
# batch holds ~25 reports per device (docs/benchmarks-notes.md: where the time goes).
LISTED = ("ts", "lat", "lon", "battery", "cell")
PREPARED = pa.schema([
    ("kind", pa.int8()), ("route", pa.int64()), ("farm_id", pa.string()), ("device_id", pa.string()),
    ("ts", _listed(pa.int64())), ("lat", _listed(pa.float64())), ("lon", _listed(pa.float64())),
    ("battery", _listed(pa.float64())), ("cell", _listed(pa.int64())), ("payload", pa.string()),
])
PREPARED_DDL = ("kind tinyint, route bigint, farm_id string, device_id string, ts array<bigint>, "
                "lat array<double>, lon array<double>, battery array<double>, cell array<bigint>, payload string")
# What the process stage works on: one row per report (see `unpack`)
REPORTS = pa.schema([pa.field(f.name, f.type.value_type if f.name in LISTED else f.type) for f in PREPARED]
                    + [pa.field("grp", pa.string())])


@dataclass(frozen=True)
class PrepareContext:
    redis_host: str
    redis_port: int
    routing: RoutingTable
    salts: list[int]            # salts[p]: a route value Spark's hash partitioner sends to partition p


# why a report's farm cannot be resolved from the device registry (index = code; 0 = resolved)
FARM_REASONS = (None, "unknown device_id: register it with POST /v1/devices",
                "device_id is registered in several farms: include farm_id in the report")


def _resolve_farms(redis, table: pa.Table) -> tuple[pa.Array, np.ndarray]:
    """Farm of each report (from the report, else the device registry, one HMGET of the distinct
    devices) and a FARM_REASONS code per report (0 = resolved). Arrow throughout: no Python object
    per report."""
    farm = table.column("farm_id").combine_chunks()
    codes = np.zeros(len(farm), dtype=np.int8)
    if not farm.null_count:
        return farm, codes
    missing = farm.is_null()
    devices = table.column("device_id").combine_chunks().filter(missing).dictionary_encode()
    owners = redis.hmget(keys.DEVICE_REGISTRY, devices.dictionary.to_pylist())
    code_of = np.array([1 if o is None else 2 if "," in o else 0 for o in owners], dtype=np.int8)
    farm = pc.replace_with_mask(farm, missing, pa.array(owners, pa.string()).take(devices.indices))
    codes[missing.to_numpy(zero_copy_only=False)] = code_of[devices.indices.to_numpy(zero_copy_only=False)]
    return farm, codes


def prepare_partition(ctx: PrepareContext, batches) -> "Iterator[pa.RecordBatch]":
    started = time.perf_counter()
    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if not tables:
        return
    read_s = time.perf_counter() - started
    raw = pa.concat_tables(tables)
    parsed = parse_kafka_values(raw.column("value").combine_chunks(), raw.column("key").combine_chunks(),
                                raw.column("partition").combine_chunks(), raw.column("offset").combine_chunks(),
                                TOPIC_REPORTS)
    dead: list[DeadLetter] = list(parsed.dead)
    good = parsed.good
    out: list[pa.RecordBatch] = []
    if good.num_rows:
        farm, codes = _resolve_farms(cluster(ctx.redis_host, ctx.redis_port), good)
        bad = codes != 0
        if bad.any():
            parts = good.column("kafka_partition").to_numpy()
            offs = good.column("kafka_offset").to_numpy()
            values = good.select(["device_id", "ts", "lat", "lon"]).to_pylist()
            dead += [DeadLetter(FARM_REASONS[codes[i]], orjson.dumps(values[i]).decode(), TOPIC_REPORTS,
                                int(parts[i]), int(offs[i])) for i in np.flatnonzero(bad)]
            keep = pa.array(~bad)
            good, farm = good.filter(keep), farm.filter(keep)
        if good.num_rows:
            out.append(_routed_reports(ctx, good, farm))
    if dead:
        out.append(_side_rows(KIND_DEAD, [d.to_bytes().decode() for d in dead], ctx))
    if parsed.pings:
        out.append(_side_rows(KIND_PING, [str(p) for p in parsed.pings], ctx))
    # where a batch's time goes before the shuffle: reported in the heartbeat ("readers")
    timing = {"records": raw.num_rows, "read_s": round(read_s, 4),
              "prepare_s": round(time.perf_counter() - started - read_s, 4)}
    out.append(_side_rows(KIND_READ, [orjson.dumps(timing).decode()], ctx))
    yield from out


def _routed_reports(ctx: PrepareContext, good: pa.Table, farm: pa.Array) -> pa.RecordBatch:
    lat = good.column("lat").to_numpy()
    lon = good.column("lon").to_numpy()
    ts = good.column("ts").to_numpy()
    cells = cells_for_points(lat, lon, keys.FENCE_RES)
    names, group_code = group_names(cells)
    # the route of a device = partition of the group of its last report (arrival order) in this batch
    devices = device_runs(farm, good.column("device_id"))
    last_group = group_code[devices.last]
    salts = np.asarray(ctx.salts, dtype=np.int64)
    if ctx.routing.splits and any(g in ctx.routing.splits for g in names):
        # a split (hot) group is routed by the device's bucket (fencing.routing.bucket_of); its fence and
        # state keys stay at group level, so any partition can serve any bucket of it
        parts = np.array([ctx.routing.partition_of_child(names[g], b)
                          for g, b in zip(last_group.tolist(), buckets_of(devices.keys))], dtype=np.int64)
    else:
        partition_of_group = np.array([ctx.routing.partition_of(g) for g in names], dtype=np.int64)
        parts = partition_of_group[last_group]
    # one row per device: its reports' values as arrays, in arrival order
    order = np.argsort(devices.codes, kind="stable")
    offsets = pa.array(np.r_[0, np.cumsum(devices.count)].astype(np.int32))
    first = pa.array(order[offsets.to_numpy()[:-1]])
    take = pa.array(order)

    def listed(values: pa.Array) -> pa.ListArray:
        return pa.ListArray.from_arrays(offsets, values.take(take), type=_listed(values.type))

    n = len(devices.keys)
    return pa.RecordBatch.from_arrays([
        pa.array(np.zeros(n, np.int8)), pa.array(salts[parts]), farm.take(first),
        good.column("device_id").combine_chunks().take(first), listed(pa.array(ts, pa.int64())),
        listed(pa.array(lat)), listed(pa.array(lon)), listed(good.column("battery").combine_chunks().cast(pa.float64())),
        listed(pa.array(cells.view(np.int64))), pa.nulls(n, pa.string()),
    ], schema=PREPARED)


def _side_rows(kind: int, payloads: list[str], ctx: PrepareContext) -> pa.RecordBatch:
    n = len(payloads)
    return pa.RecordBatch.from_arrays(
        [pa.array(np.full(n, kind, np.int8)), pa.array(np.full(n, ctx.salts[0], np.int64))]
        + [pa.nulls(n, f.type) for f in PREPARED if f.name not in ("kind", "route", "payload")]
        + [pa.array(payloads, pa.string())], schema=PREPARED)


def unpack(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The process stage's input as one row per report again (REPORTS), each with its cell group
    ("grp"): the shuffle does not carry the group, it follows from the cell. Side rows pass through."""
    for batch in batches:
        if not batch.num_rows:
            continue
        is_report = batch.column("kind").to_numpy(zero_copy_only=False) == KIND_REPORT
        if is_report.any():
            devices = batch.filter(pa.array(is_report))
            owner = pc.list_parent_indices(devices.column("ts"))
            yield _with_groups([pc.list_flatten(devices.column(f.name)) if f.name in LISTED
                                else devices.column(f.name).take(owner) for f in REPORTS if f.name != "grp"])
        if not is_report.all():
            side = batch.filter(pa.array(~is_report))
            yield pa.RecordBatch.from_arrays([pa.nulls(side.num_rows, f.type) if f.name in LISTED + ("grp",)
                                              else side.column(f.name) for f in REPORTS], schema=REPORTS)


def _with_groups(columns: list[pa.Array]) -> pa.RecordBatch:
    cells = columns[[f.name for f in REPORTS].index("cell")].to_numpy(zero_copy_only=False).view(np.uint64)
    names, code = group_names(cells)
    return pa.RecordBatch.from_arrays(columns + [pa.array(names[code], pa.string())], schema=REPORTS)
