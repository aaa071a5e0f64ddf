"""Stage 1 of a micro-batch (narrow, on the Kafka input partitions): parse + validate, resolve each
report's farm, compute its H3 cell and cell group, and the route of its device.

A device's reports of a batch all sit in one Kafka partition (key = device id), so this stage sees them
together and routes them all to the partition of the group of the device's latest report: one task
then owns the device's state for the batch. Its output rows are fencing.stream.rows.SHUFFLED.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from fencing.config import TOPIC_REPORTS
from fencing.model import keys
from fencing.model.geometry import group_names
from fencing.model.heartbeat import ReaderTiming
from fencing.model.h3util import cells_for_points
from fencing.model.redis_conn import cluster
from fencing.stream.routing import RoutingTable, buckets_of, device_runs
from fencing.stream import rows
from ingest.validate import DeadLetter, parse_kafka_values

@dataclass(frozen=True)
class PrepareContext:
    redis_host: str
    redis_port: int
    routing: RoutingTable
    salts: list[int]            # salts[p]: a route value Spark's hash partitioner sends to partition p


# why a report's farm cannot be resolved from the device registry (index = code; 0 = resolved)
FARM_REASONS = (None, "unknown device_id: register it with POST /v1/devices",
                "device_id is not registered in the farm the report names (farm_id)")


def _resolve_farms(redis, table: pa.Table) -> tuple[pa.Array, np.ndarray]:
    """Farm of each report and a FARM_REASONS code per report (0 = resolved), from one HMGET of the
    distinct devices in the device registry (its entry: the farms that registered the id, first
    first). A report that names its farm (farm_id) is taken only if that farm registered the device:
    a gateway cannot write into a farm through an id that farm never registered. A bare report goes
    to the farm that registered the id first: a later farm registering the same id neither receives
    nor breaks that feed (its own gateways name their farm). Arrow throughout: no Python object per
    report, except reports naming one of several farms that share an id."""
    named = table.column("farm_id").combine_chunks()
    devices = table.column("device_id").combine_chunks().dictionary_encode()
    entries = pa.array(redis.hmget(keys.DEVICE_REGISTRY, devices.dictionary.to_pylist()), pa.string())
    owners = pc.list_element(pc.split_pattern(entries, ",", max_splits=1), 0)
    row_device = devices.indices
    farm = pc.coalesce(named, owners.take(row_device))
    codes = np.zeros(len(named), dtype=np.int8)
    codes[entries.is_null().to_numpy(zero_copy_only=False)[row_device.to_numpy(zero_copy_only=False)]] = 1
    # named farms: the common case (the id has one farm) compares whole entries, vectorized
    entry_of_row = entries.take(row_device)
    check = pc.and_(pc.is_valid(named), pc.is_valid(entry_of_row))
    mismatch = np.flatnonzero(pc.fill_null(pc.and_(check, pc.not_equal(named, entry_of_row)), False)
                              .to_numpy(zero_copy_only=False))
    if len(mismatch):
        names, joined = named.take(mismatch).to_pylist(), entry_of_row.take(mismatch).to_pylist()
        codes[mismatch[[n not in j.split(",") for n, j in zip(names, joined)]]] = 2
    return farm, codes


def _without_nulls(record: dict) -> dict:
    return {k: v for k, v in record.items() if v is not None}


def prepare_partition(ctx: PrepareContext, batches, gaps: list | None = None) -> "Iterator[pa.RecordBatch]":
    """`gaps`: the list the reader of `batches` appends skipped log gaps to (ingest.kafka_types.LogGap),
    complete once `batches` is exhausted; they travel to the driver in the reader's timing row."""
    started = time.perf_counter()
    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    gap_dicts = [g.to_dict() for g in gaps or ()]
    if not tables:
        if gap_dicts:
            yield rows.side_rows(rows.READ, [ReaderTiming(gaps=gap_dicts).to_json()], ctx.salts[0])
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
            values = good.select(["device_id", "ts", "lat", "lon", "farm_id"]).to_pylist()
            dead += [DeadLetter(FARM_REASONS[codes[i]], orjson.dumps(_without_nulls(values[i])).decode(), TOPIC_REPORTS,
                                int(parts[i]), int(offs[i])) for i in np.flatnonzero(bad)]
            keep = pa.array(~bad)
            good, farm = good.filter(keep), farm.filter(keep)
        if good.num_rows:
            out += _routed_reports(ctx, good, farm)
    if dead:
        out.append(rows.side_rows(rows.DEAD, [d.to_bytes().decode() for d in dead], ctx.salts[0]))
    if parsed.pings:
        out.append(rows.side_rows(rows.PING, [str(p) for p in parsed.pings], ctx.salts[0]))
    # where a batch's time goes before the shuffle: reported in the heartbeat ("readers")
    timing = ReaderTiming(raw.num_rows, round(read_s, 4), round(time.perf_counter() - started - read_s, 4),
                          gaps=gap_dicts)
    out.append(rows.side_rows(rows.READ, [timing.to_json()], ctx.salts[0]))
    yield from out


def _routed_reports(ctx: PrepareContext, good: pa.Table, farm: pa.Array) -> list[pa.RecordBatch]:
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
        # a split (hot) group is routed by the device's bucket (fencing.stream.routing.bucket_of); its fence and
        # state keys stay at group level, so any partition can serve any bucket of it
        parts = np.array([ctx.routing.partition_of_child(names[g], b)
                          for g, b in zip(last_group.tolist(), buckets_of(devices.keys))], dtype=np.int64)
    else:
        partition_of_group = np.array([ctx.routing.partition_of(g) for g in names], dtype=np.int64)
        parts = partition_of_group[last_group]
    # one row per routed partition (and per BLOB_ROWS of its reports): IPC streams, arrival order kept by
    # the stable sort and by the shuffle, which keeps one map task's rows in order
    part_of_report = parts[devices.codes]
    order = np.argsort(part_of_report, kind="stable")
    routed = pa.RecordBatch.from_arrays([
        farm, good.column("device_id").combine_chunks(), pa.array(ts, pa.int64()), pa.array(lat), pa.array(lon),
        good.column("battery").combine_chunks().cast(pa.float64()), pa.array(cells.view(np.int64)),
        good.column("accuracy_m").combine_chunks().cast(pa.float64()),
    ], schema=rows.REPORT_SCHEMA).take(pa.array(order))
    targets, starts, counts = np.unique(part_of_report[order], return_index=True, return_counts=True)
    return [rows.packed(int(salts[t]), routed.slice(lo, min(rows.BLOB_ROWS, start + count - lo)))
            for t, start, count in zip(targets.tolist(), starts.tolist(), counts.tolist())
            for lo in range(start, start + count, rows.BLOB_ROWS)]
