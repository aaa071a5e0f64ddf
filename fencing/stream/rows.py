"""The rows a micro-batch's two stages exchange, defined once: what the readers hand to the shuffle
(SHUFFLED), the reports inside it (REPORT), what the process stage works on (STAGE_REPORT), and what it
hands back to the driver (OUTPUT).

A report takes four forms between Kafka and the state machine: the record's bytes; the readers'
parsed columns (ingest.validate); REPORT, routed and packed, which crosses the shuffle as one Arrow IPC
stream per routed partition (the JVM moves a few large binary values, not a row per report) and is
read back without a copy as STAGE_REPORT (with the cell group); and the process stage's columns in
device order (fencing.stream.batch_core.BatchReports), which the state machine reads.

Row kinds are one numbering for both directions: a side row (a dead letter, a ping, a reader's timing)
keeps its kind from the reader to the driver.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from fencing.model.geometry import group_names

REPORT, DEAD, PING, READ, EVENT, STATS = 0, 1, 2, 3, 4, 5
SIDE_KINDS = (DEAD, PING, READ)

# readers → shuffle: a REPORT row holds reports as an IPC stream; a side row holds UTF-8 text
SHUFFLED = pa.schema([("kind", pa.int8()), ("route", pa.int64()), ("payload", pa.binary())])
SHUFFLED_DDL = "kind tinyint, route bigint, payload binary"
BLOB_ROWS = 250_000      # reports per IPC value: ~16 MB, far below the 2 GB of an Arrow binary value
REPORT_SCHEMA = pa.schema([("farm_id", pa.string()), ("device_id", pa.string()), ("ts", pa.int64()),
                           ("lat", pa.float64()), ("lon", pa.float64()), ("battery", pa.float64()),
                           ("cell", pa.int64()), ("accuracy_m", pa.float64())])
# what the process stage reads: REPORT with its cell group (derived from the cell, so not shuffled)
STAGE_REPORT = pa.schema([*REPORT_SCHEMA, ("grp", pa.string())])

# process stage → driver: events as their public JSON with key (fence id), ts and event id beside it
# (the driver sorts and produces them from Arrow); side rows and statistics as payload text
OUTPUT = pa.schema([("kind", pa.int8()), ("payload", pa.string()), ("key", pa.string()), ("ts", pa.int64()),
                    ("eid", pa.string())])
OUTPUT_DDL = "kind tinyint, payload string, key string, ts bigint, eid string"


def packed(route: int, reports: pa.RecordBatch) -> pa.RecordBatch:
    """One SHUFFLED row: `reports` (REPORT_SCHEMA) as an Arrow IPC stream (its buffer becomes the value,
    no copy)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, reports.schema) as writer:
        writer.write_batch(reports)
    offsets = pa.array(np.array([0, sink.tell()], np.int32)).buffers()[1]
    return pa.RecordBatch.from_arrays([pa.array([REPORT], pa.int8()), pa.array([route], pa.int64()),
                                       pa.Array.from_buffers(pa.binary(), 1, [None, offsets, sink.getvalue()])],
                                      schema=SHUFFLED)


def side_rows(kind: int, payloads: list[str], route: int) -> pa.RecordBatch:
    n = len(payloads)
    return pa.RecordBatch.from_arrays([pa.array(np.full(n, kind, np.int8)), pa.array(np.full(n, route, np.int64)),
                                       pa.array(payloads, pa.string()).cast(pa.binary())], schema=SHUFFLED)


@dataclass
class StageInput:
    """A process task's input: its reports (STAGE_REPORT, arrival order) and the side rows it passes on."""
    reports: pa.Table | None = None
    side: list[tuple[int, str]] = field(default_factory=list)


def unpack(rows: Iterable[pa.RecordBatch]) -> StageInput:
    """SHUFFLED rows → StageInput: each IPC value read back (no copy) with its cell group added."""
    batches: list[pa.RecordBatch] = []
    side: list[tuple[int, str]] = []
    for row_batch in rows:
        if not row_batch.num_rows:
            continue
        kinds = row_batch.column("kind").to_numpy(zero_copy_only=False)
        payloads = row_batch.column("payload")
        for i in np.flatnonzero(kinds == REPORT).tolist():
            batches.append(_with_groups(pa.ipc.open_stream(payloads[i].as_buffer()).read_next_batch()))
        for i in np.flatnonzero(kinds != REPORT).tolist():
            side.append((int(kinds[i]), payloads[i].as_py().decode()))
    reports = pa.Table.from_batches(batches, schema=STAGE_REPORT) if batches else None
    return StageInput(reports, side)


def _with_groups(reports: pa.RecordBatch) -> pa.RecordBatch:
    names, code = group_names(reports.column("cell").to_numpy().view(np.uint64))
    return pa.RecordBatch.from_arrays([*reports.columns, pa.array(names[code], pa.string())], schema=STAGE_REPORT)


def split_by_route(rows: Iterable[pa.RecordBatch], salts: tuple[int, ...]) -> list[list[pa.RecordBatch]]:
    """SHUFFLED rows split by routed partition, each partition's rows in their order (a process task
    serving several routed partitions: fencing.stream.stages). Rows are few: one per routed
    partition and reader, plus side rows."""
    partition_of = {salt: p for p, salt in enumerate(salts)}
    parts: list[list[pa.RecordBatch]] = [[] for _ in salts]
    for row_batch in rows:
        if not row_batch.num_rows:
            continue
        routes = row_batch.column("route").to_numpy(zero_copy_only=False)
        for route in np.unique(routes).tolist():
            parts[partition_of[route]].append(row_batch.filter(pa.array(routes == route)))
    return parts
