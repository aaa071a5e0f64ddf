"""The backlog drain of `herdfence bench push`: the same reports as a backlog, processed by the running
job with no producer on the cores (what FenceX publishes as its drain figure).

On the bench's private stack: the job's reads are held (ingest.admission.hold: it plans no new
records, and keeps its JVM, its Python workers and their fence caches), the backlog (the run's reports
under device ids of their own, registered first) is produced to `gps.reports`, and the hold is
released. The drain is timed from the start of the first micro-batch after the release to the
heartbeat that has counted all of the backlog.
"""
from __future__ import annotations

import time

import pandas as pd

from ingest.admission import hold, release
from loadgen.bench_load import HeartbeatSampler, handled
from loadgen.bench_stack import BenchStack, say


def drain(stack: BenchStack, reports: pd.DataFrame, device_prefix: str, register, progress: bool = True,
          timeout_s: float = 900.0) -> dict:
    """`reports`: the run's reports with simulator device ids; `register(prefix)` registers the
    simulator's devices under `prefix`. Returns the drain's figures, or {"skipped": why}."""
    from fencing.model.heartbeat import read_progress
    from loadgen.kafka_writer import write_reports

    if not stack.private:
        return {"skipped": "the drain holds the job's reads: it runs on a private stack only"}
    register(device_prefix)
    backlog = reports.copy()
    backlog["device_id"] = device_prefix + backlog["device_id"].astype(str)
    redis, hold_file = stack.redis, stack.settings.ingest_hold_file
    before = handled(read_progress(redis))       # the flood's reports are all handled by now
    sampler = HeartbeatSampler(redis)
    sampler.start()
    say("drain: holding the job's reads, producing the backlog")
    hold(hold_file, timeout_s)
    try:
        produced = write_reports(stack.settings.kafka_bootstrap, backlog, progress=progress)
    finally:
        release(hold_file)
    released = time.time()
    say(f"drain: {len(backlog):,} reports waiting; hold released")
    done_beat = None
    deadline = released + timeout_s
    while time.time() < deadline:
        if sampler.beats and handled(sampler.beats[-1]) - before >= len(backlog):
            done_beat = sampler.beats[-1]
            break
        time.sleep(0.2)
    sampler.stop()
    if done_beat is None:
        return {"skipped": f"the job did not drain {len(backlog)} reports within {timeout_s:.0f} s"}
    # a batch planned before the job saw the hold may have taken the backlog's first reports while they
    # were produced: the figure counts what the batches after the release handled, in their time
    after = [b for b in sampler.beats if b.time - b.duration_s >= released - 0.25 and b.points]
    first = after[0] if after else done_beat
    earlier = [b for b in sampler.beats if b.batch_id < first.batch_id]
    start_count = handled(earlier[-1]) if earlier else before
    seconds = done_beat.time - (first.time - first.duration_s)
    points = handled(done_beat) - start_count
    return {"reports": len(backlog), "points": points, "seconds": round(seconds, 3),
            "points_per_s": round(points / seconds, 1) if seconds > 0 else None,
            "batches": len(after), "before_release": len(backlog) - points,
            "produce_s": round(produced.seconds, 2)}
