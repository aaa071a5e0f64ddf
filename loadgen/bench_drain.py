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
from loadgen.bench_load import handled
from loadgen.bench_stack import BenchStack, say


def drain(stack: BenchStack, reports: pd.DataFrame, device_prefix: str, register, progress: bool = True,
          timeout_s: float = 900.0) -> dict:
    """`reports`: the run's reports with simulator device ids; `register(prefix)` registers the
    simulator's devices under `prefix`. Returns the drain's figures, or {"skipped": why}."""
    from fencing.model.heartbeat import read_progress, recent_heartbeats
    from loadgen.kafka_writer import write_reports

    if not stack.private:
        return {"skipped": "the drain holds the job's reads: it runs on a private stack only"}
    register(device_prefix)
    backlog = reports.copy()
    backlog["device_id"] = device_prefix + backlog["device_id"].astype(str)
    redis, hold_file = stack.redis, stack.settings.ingest_hold_file
    counter = _Handled(handled(read_progress(redis)))
    say("drain: holding the job's reads, producing the backlog")
    hold(hold_file, timeout_s)
    try:
        produced = write_reports(stack.settings.kafka_bootstrap, backlog, progress=progress)
    finally:
        release(hold_file)
    released = time.time()
    say(f"drain: {len(backlog):,} reports waiting; hold released")
    deadline = released + timeout_s
    while counter.add(handled(read_progress(redis))) < len(backlog):
        if time.time() > deadline:
            return {"skipped": f"the job did not drain {len(backlog)} reports within {timeout_s:.0f} s"}
        time.sleep(0.2)
    # the heartbeats once (each is large): the batches that started after the release, in their time. A
    # batch planned before the job saw the hold may have taken the backlog's first reports while they
    # were produced ("before_release"); a held job plans nothing, so without one that is 0
    after = [b for b in recent_heartbeats(redis, 50) if b.points and b.time - b.duration_s >= released - 0.25]
    if not after:
        return {"skipped": "no batch started after the hold was released"}
    points = sum(b.points + b.shed for b in after)
    seconds = after[-1].time - (after[0].time - after[0].duration_s)
    return {"reports": len(backlog), "points": points, "seconds": round(seconds, 3),
            "points_per_s": round(points / seconds, 1) if seconds > 0 else None,
            "batches": len(after), "before_release": max(0, len(backlog) - points),
            "produce_s": round(produced.seconds, 2)}


class _Handled:
    """Reports handled since it was made, from the job's running total (a job that restarts counts
    from zero again: its new total is added whole)."""

    def __init__(self, total: int) -> None:
        self.last, self.count = total, 0

    def add(self, total: int) -> int:
        self.count += total - self.last if total >= self.last else total
        self.last = total
        return self.count
