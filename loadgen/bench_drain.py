"""The backlog drain of `herdfence bench push`: the same reports produced while no job runs, then
processed by the job with no producer on the cores (what FenceX publishes as its drain figure).

On the bench's private stack: the supervisor and the job processes are stopped, the backlog (the run's
reports under device ids of their own, registered first) is produced to `gps.reports`, and `herdfence up`
starts the job again. The drain is timed from the start of the first micro-batch that processes the
backlog to the heartbeat that has counted all of it. The job's own start (its JVM, the query) comes
before that and is reported apart (`job_start_s`); its first batch starts the Python workers, which
load the fences, as after any outage.
"""
from __future__ import annotations

import threading
import time

import pandas as pd

from loadgen.bench_load import HeartbeatSampler, handled
from loadgen.bench_stack import BenchStack, say


def drain(stack: BenchStack, reports: pd.DataFrame, device_prefix: str, register, progress: bool = True,
          timeout_s: float = 900.0) -> dict:
    """`reports`: the run's reports with simulator device ids; `register(prefix)` registers the
    simulator's devices under `prefix`. Returns the drain's figures, or {"skipped": why}."""
    from loadgen.kafka_writer import write_reports

    if not stack.private:
        return {"skipped": "the drain stops the job: it runs on a private stack only"}
    register(device_prefix)
    backlog = reports.copy()
    backlog["device_id"] = device_prefix + backlog["device_id"].astype(str)
    say("drain: stopping the job, producing the backlog with no job running")
    stack.stop_job()
    produced = write_reports(stack.settings.kafka_bootstrap, backlog, progress=progress)
    redis = stack.redis
    sampler = HeartbeatSampler(redis)
    sampler.start()
    say(f"drain: {len(backlog):,} reports waiting; starting the job")
    started = time.time()
    up: dict = {}
    starter = threading.Thread(target=lambda: up.update(done=stack.cli("up", "--detach", "--timeout", str(int(timeout_s)),
                                                                        timeout=timeout_s + 60)))
    starter.start()
    done_beat = None
    deadline = started + timeout_s
    while time.time() < deadline:
        # a new job counts from zero: the backlog is done when it has handled all of it
        after = [b for b in sampler.beats if b.time > started and b.points]
        if after and handled(after[-1]) >= len(backlog):
            done_beat = after[-1]
            break
        time.sleep(0.2)
    starter.join(timeout_s)
    sampler.stop()
    if done_beat is None:
        return {"skipped": f"the job did not drain {len(backlog)} reports within {timeout_s:.0f} s",
                "up": (up.get("done").stderr[-2000:] if up.get("done") else None)}
    in_drain = [b for b in sampler.beats if b.time > started and b.points]
    first_start = in_drain[0].time - in_drain[0].duration_s
    seconds = done_beat.time - first_start
    return {"reports": len(backlog), "seconds": round(seconds, 3),
            "points_per_s": round(len(backlog) / seconds, 1) if seconds > 0 else None,
            "batches": len(in_drain), "job_start_s": round(first_start - started, 2),
            "produce_s": round(produced.seconds, 2)}
