"""Stage 1 of a micro-batch (fencing.stream.prepare) on the test stack's Redis Cluster: farms from the device
registry, dead letters with their reasons, one shuffled row per routed partition carrying its reports
(arrival order) as an Arrow IPC stream, and `unpack` back to the reports with their cell group and the
side rows."""
from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa

from fencing.model import keys
from fencing.stream import routing
from fencing.model.h3util import cells_to_strs, parent
from fencing.stream.prepare import FARM_REASONS, PrepareContext, prepare_partition
from fencing.stream.rows import DEAD, READ, REPORT, SHUFFLED, unpack
from ingest.kafka_read import _batch
from ingest.kafka_source import KafkaRange

NOW = 1_767_000_000_000


def _report(device: str, ts: int, lon: float, farm: str | None = None) -> dict:
    return {"device_id": device, "ts": ts, "lat": 47.0 + (lon - 8.0) / 10, "lon": lon,
            **({"farm_id": farm} if farm else {})}


def _prepare(stack, reports: list[dict]) -> pa.Table:
    redis = stack.redis
    table = routing.load(redis)
    host, port = stack.settings.redis_node
    ctx = PrepareContext(host, port, table, list(routing.partition_salts(table.partitions)))
    r = KafkaRange(stack.kafka_bootstrap, "gps.reports", 3, 500, 500 + len(reports), True, "confluent")
    raw = _batch(r, [rep["device_id"].encode() for rep in reports], [orjson.dumps(rep) for rep in reports],
                 list(range(500, 500 + len(reports))), [NOW] * len(reports))
    return pa.Table.from_batches(list(prepare_partition(ctx, iter([raw]))), schema=SHUFFLED)


def test_devices_packed_in_arrival_order_and_unpacked(stack):
    # tp-both: farm-tp1 registered it first, then farm-tp2 (the registry keeps that order)
    stack.redis.hset(keys.DEVICE_REGISTRY, mapping={"tp-a": "farm-tp1", "tp-b": "farm-tp1", "tp-c": "farm-tp3",
                                                    "tp-both": "farm-tp1,farm-tp2"})
    arrivals = [_report("tp-a", NOW - 1_000, 8.01), _report("tp-b", NOW - 900, 8.2),
                _report("tp-a", NOW - 3_000, 8.02),            # late: arrival order is kept, not ts order
                _report("tp-unknown", NOW - 800, 8.3), _report("tp-a", NOW - 500, 8.03),
                _report("tp-both", NOW - 700, 8.4),             # bare: the farm that registered it first
                _report("tp-c", NOW - 600, 8.5, farm="farm-tp3"),
                _report("tp-b", NOW - 400, 8.21),
                _report("tp-both", NOW - 300, 8.41, farm="farm-tp2"),   # named: one of its farms
                _report("tp-a", NOW - 200, 8.04, farm="farm-tp2")]      # named, but not its farm: refused
    out = _prepare(stack, arrivals)

    kinds = out.column("kind").to_numpy()
    routed = out.filter(pa.array(kinds == REPORT))
    salts = list(routing.partition_salts(routing.load(stack.redis).partitions))
    assert set(routed.column("route").to_pylist()) <= set(salts)
    assert len(set(routed.column("route").to_pylist())) == routed.num_rows      # one row per partition
    packed = {route: pa.ipc.open_stream(payload.as_buffer()).read_all().to_pylist()
              for route, payload in zip(routed.column("route").to_pylist(), routed.column("payload"))}
    route_of = {}
    for route, reports in packed.items():
        for r in reports:
            assert route_of.setdefault((r["farm_id"], r["device_id"]), route) == route   # a device: one route
    ts_of = {}
    for reports in packed.values():
        for r in reports:
            ts_of.setdefault((r["farm_id"], r["device_id"]), []).append(r["ts"])
    assert ts_of == {("farm-tp1", "tp-a"): [NOW - 1_000, NOW - 3_000, NOW - 500],
                     ("farm-tp1", "tp-b"): [NOW - 900, NOW - 400],
                     ("farm-tp1", "tp-both"): [NOW - 700], ("farm-tp2", "tp-both"): [NOW - 300],
                     ("farm-tp3", "tp-c"): [NOW - 600]}
    a = [r for reports in packed.values() for r in reports if r["device_id"] == "tp-a"]
    assert [r["lon"] for r in a] == [8.01, 8.02, 8.03] and all(r["cell"] for r in a)
    dead = [orjson.loads(p) for p in out.filter(pa.array(kinds == DEAD)).column("payload").to_pylist()]
    assert sorted((d["reason"], d["offset"]) for d in dead) == sorted([(FARM_REASONS[1], 503), (FARM_REASONS[2], 509)])
    assert (kinds == READ).sum() == 1

    given = unpack(iter(out.to_batches()))
    reports = given.reports
    assert reports.num_rows == 8
    rows = reports.to_pylist()
    assert [r["ts"] for r in rows if r["device_id"] == "tp-a"] == [NOW - 1_000, NOW - 3_000, NOW - 500]
    cells = reports.column("cell").to_numpy().view(np.uint64)
    assert reports.column("grp").to_pylist() == cells_to_strs(parent(cells, keys.GROUP_RES))
    assert sorted(kind for kind, _ in given.side) == [DEAD, DEAD, READ]
    assert sorted(orjson.loads(p)["offset"] for kind, p in given.side if kind == DEAD) == [503, 509]


def test_a_partition_s_reports_span_several_blobs_in_arrival_order(stack, monkeypatch):
    from fencing.stream import rows
    monkeypatch.setattr(rows, "BLOB_ROWS", 2)
    stack.redis.hset(keys.DEVICE_REGISTRY, mapping={"tb-a": "farm-tb1", "tb-b": "farm-tb1"})
    arrivals = [_report("tb-a", NOW - 1_000 + i * (-1) ** i, 8.01 + i / 1000) for i in range(5)] + \
               [_report("tb-b", NOW - 900, 8.2), _report("tb-a", NOW, 8.05)]
    out = _prepare(stack, arrivals)
    routed = out.filter(pa.array(out.column("kind").to_numpy() == REPORT))
    sizes = [pa.ipc.open_stream(p.as_buffer()).read_all().num_rows for p in routed.column("payload")]
    assert max(sizes) <= 2 and sum(sizes) == 7 and routed.num_rows >= 4

    reports = unpack(iter(out.to_batches())).reports.to_pylist()
    assert [r["ts"] for r in reports if r["device_id"] == "tb-a"] == \
        [a["ts"] for a in arrivals if a["device_id"] == "tb-a"]
