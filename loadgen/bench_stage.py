"""`herdfence bench stage`: the process stage as a task runs it, against a real Redis Cluster, in CPU
time per device and batch.

`herdfence bench core` times the computing core alone. A process task also reads every device's state
from Redis and writes its state, position, indexes and events back (fencing/stream/process.py), and
when every batch touches every device (a paced stream: a batch every second or two, each collar in
each) those per-device steps are most of a batch's cost. This loads a simulated herd's farms, fences
and devices into a stack (the running one when healthy, else a private one, as `bench push` does),
then runs the task's own `_process_reports` batch after batch in this process, and reports each step's
CPU time of this thread per device-batch: Redis works on another core, so the wall clock would mix in
its time and the machine's other load. The first batch (fence cache load, every device new) warms up
and is not counted. The events are reconciled with the oracle (loadgen.reference).

On a private stack the job is stopped once the herd is loaded: it would otherwise reload the fences
just written, on the cores the measurement runs on (up to ~40% more CPU per device-batch, run to run).
A running stack's job keeps running: compare its figures with care.

    herdfence bench stage --fences 100000 --points 200000 --devices 10000 [--batches 5] [--json FILE]
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa


def stage_table(sim, loaded, lo: int, hi: int) -> pa.Table:
    """Reports lo:hi of the simulation as the process stage receives them (bench_core.reports_table
    with the device id), under the farms and device ids the stack knows them by."""
    from loadgen.bench_core import reports_table
    part = sim.reports.iloc[lo:hi]
    devices = [loaded.device_prefix + d for d in part["device_id"].astype(str).tolist()]
    farms = [loaded.farm_of[sim.device_farm[d[len(loaded.device_prefix):]]] for d in devices]
    table = reports_table([f"{f}/{d}" for f, d in zip(farms, devices)], part["ts"].to_numpy(np.int64),
                          part["lat"].to_numpy(), part["lon"].to_numpy(), part["battery"].to_numpy(), [None] * len(part))
    return table.append_column("device_id", pa.array(devices, pa.string()))


def run(fences: int, points: int, devices: int, batches: int = 5, seed: int = 0, progress: bool = True,
        tracks: str = "dense") -> dict:
    from fencing.model.job_user import EPOCH_KEY
    from fencing.stream import process, routing, worker_gc
    from fencing.stream.silent import SEEN_STEP_MS
    from loadgen.bench_load import load_simulation
    from loadgen.bench_stack import bench_stack, say
    from loadgen.herd import TRACKS, SimConfig, simulate
    from loadgen.reference import expected_events
    from loadgen.truth import reconcile

    sim = simulate(SimConfig.for_totals(fences, points, devices, seed=seed, **TRACKS[tracks]))
    cpu: Counter = Counter()
    wall: Counter = Counter()
    events: list = []
    counted = device_batches = 0
    with bench_stack() as stack:
        redis = stack.redis
        loaded = load_simulation(redis, sim, progress=progress)
        if stack.private:
            say("stopping the private stack's job: the measurement gets the cores to itself")
            stack.stop_job()       # the lease's epoch stays: the writes go as its user, as the job's do
        host, port = stack.settings.redis_node
        run_id = f"stage-{loaded.tag}"
        edges = np.linspace(0, len(sim.reports), batches + 1).astype(int)
        say(f"{batches} batches of ~{edges[1]:,} reports through the process stage, on one core")
        for b, (lo, hi) in enumerate(zip(edges[:-1].tolist(), edges[1:].tolist())):
            table = stage_table(sim, loaded, lo, hi)
            # the stack's job holds the lease: these writes go as its epoch's user, as its tasks' do
            ctx = process.ProcessContext(b, host, port, routing.load(redis), frozenset(), "", run_id, SEEN_STEP_MS,
                                         int(redis.get(EPOCH_KEY) or 0))
            with worker_gc.collector_paused():
                found, _, stats = process._process_reports(ctx, 0, table)
            events += found
            if b:                               # the first batch warms up
                cpu.update(stats.stage_cpu_s)
                wall.update(stats.stage_s)
                counted += hi - lo
                device_batches += stats.devices
        kind = stack.describe()
    real_fence = loaded.fence_sim
    prefix = len(loaded.device_prefix)
    observed = pd.DataFrame([(e.device_id[prefix:], real_fence[(e.farm_id, e.fence_id)], e.type, e.ts) for e in events],
                            columns=["device_id", "fence_id", "type", "ts"])
    rec = reconcile(expected_events(sim.reports, sim.fences, sim.device_farm), observed)
    per_device = {step: round(cpu[step] / device_batches * 1e6, 2) for step in cpu} if device_batches else {}
    return {"fences": fences, "points": points, "devices": devices, "batches": batches, "tracks": tracks,
            "points_counted": counted, "device_batches_counted": device_batches,
            "cpu_us_per_device_batch": per_device,
            "cpu_us_per_device_batch_total": round(sum(per_device.values()), 2),
            "wall_us_per_device_batch": {step: round(wall[step] / device_batches * 1e6, 2) for step in wall}
            if device_batches else {},
            "events": len(events), "lost": rec["lost"], "duplicated": rec["duplicated"],
            "unexpected": rec.get("unexpected", 0), "stack": kind}


def main(argv: list[str]) -> int:
    from loadgen.bench_core import finish, parse, parser
    args = parse(parser("herdfence bench stage", __doc__, 100_000, 200_000, 5), argv)
    out = run(args.fences, args.points, args.devices, args.batches, args.seed, tracks=args.tracks)
    return finish(out, " ".join(["herdfence", "bench", "stage", *argv]), args.json)
