"""`herdfence bench failover`: how long the push path is away when the active job dies (issue 19).

A paced producer writes reports straight to Kafka (each stamped with its planned send time) while a
sampler reads the newest processed report time of a sample of devices every 100 ms: freshness lag =
now − that time. After a steady phase, the active job's whole process group is killed (kill -9);
once a warm standby is back, the new active job is frozen (SIGSTOP) past its lease and resumed
(SIGCONT). For each: the outage (from the fault until the lag is back to the steady level and stays
there for 2 s), when it was first back there (fresh_ms), the worst lag, when the first heartbeat of
the new holder came, and for the frozen job whether it wrote anything after the take-over. At the
end, every event is reconciled with the oracle (loadgen.reference, which also models the crossings
inferred between fixes): lost and duplicated must be 0."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import orjson
import pandas as pd

from fencing.model import keys
from fencing.model.heartbeat import read_heartbeat, recent_heartbeats
from loadgen.bench_stack import bench_stack, machine, say

SAMPLE_DEVICES = 64
SETTLE_S = 2.0          # the lag must stay at the steady level this long to count as recovered


class LagSampler(threading.Thread):
    """now − the newest processed report time among a sample of devices, every `every_s`."""

    def __init__(self, redis, devices: list[tuple[str, str]], every_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.redis, self.devices, self.every_s = redis, devices, every_s
        self.samples: list[tuple[float, float]] = []     # (wall time s, lag s)
        self.halt = threading.Event()

    def run(self) -> None:
        by_farm: dict[str, list[str]] = {}
        for farm, device in self.devices:
            by_farm.setdefault(farm, []).append(device)
        while not self.halt.wait(self.every_s):
            try:
                pipe = self.redis.pipeline()
                for farm, devices in by_farm.items():
                    pipe.hmget(keys.positions(farm), devices)
                newest = max((orjson.loads(v)["ts"] for values in pipe.execute() for v in values if v),
                             default=None)
            except Exception:  # noqa: BLE001 - a sample missed; the next one counts
                continue
            if newest is not None:
                now = time.time()
                self.samples.append((now, max(0.0, now - newest / 1000.0)))

    def window(self, start: float, end: float) -> np.ndarray:
        return np.array([lag for t, lag in self.samples if start <= t <= end])


class StampedFeed(threading.Thread):
    """Produces the reports at `rate`, each stamped with the time it is sent (slices of 1/20 s), so
    that the freshness lag is the pipeline's own; `ts` holds the stamps for the oracle afterwards."""

    def __init__(self, bootstrap: str, reports: pd.DataFrame, rate: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.reports, self.rate = bootstrap, reports, rate
        self.ts = np.zeros(len(reports), dtype=np.int64)
        self.sent = 0

    def run(self) -> None:
        from confluent_kafka import Producer

        from loadgen.kafka_writer import TOPIC, producer_config
        producer = Producer(producer_config(self.bootstrap, **{"delivery.report.only.error": True}))
        devices = self.reports["device_id"].astype(str).tolist()
        lat, lon = self.reports["lat"].tolist(), self.reports["lon"].tolist()
        step = max(1, int(self.rate / 20))
        start = time.perf_counter()
        for i in range(0, len(devices), step):
            time.sleep(max(0.0, start + i / self.rate - time.perf_counter()))
            now_ms = time.time_ns() // 1_000_000
            for j in range(i, min(i + step, len(devices))):
                ts = now_ms + (j - i)          # distinct per row: a device's order is its send order
                self.ts[j] = ts
                producer.produce(TOPIC, orjson.dumps({"device_id": devices[j], "ts": ts, "lat": lat[j],
                                                      "lon": lon[j]}), devices[j].encode())
            self.sent = min(i + step, len(devices))
            producer.poll(0)
        producer.flush(60)


def _active_job(settings) -> tuple[str, int, int] | None:
    """(process name, pid, lease epoch) of the active job, once there is one and a warm standby."""
    from deploy.stack import _job_status
    from fencing.model.redis_conn import cluster
    jobs = _job_status(settings)
    active, standby = jobs.get("job", {}), jobs.get("job_standby", {})
    if active.get("role") != "active" or not standby.get("ready"):
        return None                         # no active job yet, or the standby is not warm and waiting
    redis = cluster(*settings.redis_node)
    beat = read_heartbeat(redis)
    if not beat or not beat.holder.endswith(f":{active['pid']}"):
        return None                         # the active job has not completed a batch yet
    return active["process"], int(active["pid"]), beat.epoch


def _wait(what: str, predicate, timeout: float, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def _fresh_again(after: list[tuple[float, float]], fault_at: float, threshold_s: float) -> int | None:
    """ms from the fault to the first sample back under `threshold_s` once the lag had gone above it:
    when a report sent then is processed as fast as before the fault (the lag may still rise above
    the steady level later, e.g. while the replaced process restarts beside the new active job)."""
    above = False
    for t, lag in after:
        above |= lag > threshold_s
        if above and lag <= threshold_s:
            return round((t - fault_at) * 1000)
    return None


def _recovery(sampler: LagSampler, fault_at: float, threshold_s: float, timeout: float = 120.0) -> dict:
    """When the lag came back under `threshold_s` (fresh_ms), and when it stayed there SETTLE_S
    (outage_ms), after the fault."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.2)
        after = [(t, lag) for t, lag in sampler.samples if t >= fault_at]
        for i, (t, lag) in enumerate(after):
            if lag <= threshold_s and after[-1][0] - t >= SETTLE_S and \
                    all(x <= threshold_s for _, x in after[i:]):
                worst = max(x for _, x in after[:i + 1])
                return {"outage_ms": round((t - fault_at) * 1000), "worst_lag_ms": round(worst * 1000),
                        "fresh_ms": _fresh_again(after, fault_at, threshold_s)}
    say(f"the lag did not come back under {threshold_s:.2f} s within {timeout:.0f} s")
    after = [(t, lag) for t, lag in sampler.samples if t >= fault_at]
    return {"outage_ms": None, "worst_lag_ms": round(max((lag for _, lag in after), default=0.0) * 1000),
            "fresh_ms": _fresh_again(after, fault_at, threshold_s)}


def _takeover(redis, fault_at: float, old_epoch: int) -> dict:
    """The take-over's timeline from the first heartbeat of a newer epoch: ms from the fault to it, and
    its parts (fault → lease taken → that first batch done)."""
    def newer():
        beats = [b for b in recent_heartbeats(redis, 200) if b.epoch > old_epoch and b.time >= fault_at]
        return min(beats, key=lambda b: b.time) if beats else None
    beat = _wait("a heartbeat of the new active job", newer, 120)
    out = {"takeover_ms": round((beat.time - fault_at) * 1000), "epoch": beat.epoch,
           "first_batch_points": beat.points}
    if beat.active_since:
        out.update(lease_taken_ms=round((beat.active_since - fault_at) * 1000),
                   first_batch_done_ms=round((beat.time - beat.active_since) * 1000))
        out["first_batches"] = _first_batches(redis, beat)
    return out


def _first_batches(redis, first, n: int = 3) -> list[dict]:
    """Where the new active job's first batches spent their time, from the lease: when each began and
    ended, its Spark and sinks parts, and Spark's own breakdown of that trigger (which the next batch's
    heartbeat carries)."""
    try:
        beats = _wait("the new active job's first batches", lambda: (lambda b: b if len(b) > n else None)(
            sorted((b for b in recent_heartbeats(redis, 200) if b.epoch == first.epoch), key=lambda b: b.time)), 30)
    except RuntimeError:
        return []
    since = first.active_since
    return [{"batch": b.batch_id, "points": b.points,
             "began_ms": round((b.time - b.duration_s - since) * 1000), "done_ms": round((b.time - since) * 1000),
             "spark_ms": round(b.spark_s * 1000), "sinks_ms": round(b.sinks_s * 1000),
             "trigger_ms": {k: round(v) for k, v in after.previous_trigger_ms.items()}}
            for b, after in zip(beats[:n], beats[1:n + 1])]


def failover(rate: float, devices: int, fences: int, json_path: str | None, steady_s: float = 15.0,
             seed: int = 0, plot: bool = True, command: str = "") -> dict:
    from fencing.config import TUNING
    from loadgen.bench_load import load_simulation, read_events
    from loadgen.herd import SimConfig, simulate
    from loadgen.reference import expected_events
    from loadgen.truth import reconcile

    points = int(rate * (steady_s + 150))
    say(f"simulating {devices} devices, {fences} fences, {points} reports to send at {rate:.0f}/s")
    sim = simulate(SimConfig.for_totals(fences, points, devices, seed=seed))
    with bench_stack() as stack:
        settings, redis = stack.settings, stack.redis
        say("waiting for an active job and a warm standby")
        _wait("an active job and a warm standby", lambda: _active_job(settings), 300, 1.0)
        loaded = load_simulation(redis, sim, progress=False)
        reports = sim.reports.sort_values("ts", kind="stable").reset_index(drop=True)
        reports["device_id"] = loaded.device_prefix + reports["device_id"].astype(str)
        rng = np.random.default_rng(seed)
        picks = rng.choice(len(sim.device_ids), size=min(SAMPLE_DEVICES, len(sim.device_ids)), replace=False)
        sample = [(loaded.farm_of[sim.device_farm[d]], loaded.device_prefix + d) for d in sim.device_ids[picks]]
        sampler = LagSampler(redis, sample)
        sampler.start()
        writer = StampedFeed(settings.kafka_bootstrap, reports, rate)
        writer.start()
        time.sleep(steady_s)
        steady = sampler.window(time.time() - steady_s + 5, time.time())
        threshold = max(float(np.max(steady)), 0.5) if len(steady) else 1.0
        out = {"rate": rate, "devices": devices, "fences": fences, "points": len(reports),
               "lease_ms": TUNING.job_lease_ms,
               "steady_lag_ms": {"p50": round(float(np.percentile(steady, 50)) * 1000),
                                 "p99": round(float(np.percentile(steady, 99)) * 1000),
                                 "max": round(float(np.max(steady)) * 1000)}}
        say(f"steady lag: {out['steady_lag_ms']}")
        marks = []
        for mode in ("kill", "stop"):
            name, pid, epoch = _wait("an active job and a warm standby", lambda: _active_job(settings), 300, 0.5)
            if not writer.is_alive():
                raise RuntimeError("the producer finished before the faults: raise the run's length")
            fault_at = time.time()
            if mode == "kill":
                say(f"kill -9 of the active job's process group ({name}, pid {pid}, epoch {epoch})")
                os.killpg(pid, signal.SIGKILL)
            else:
                say(f"SIGSTOP of the active job's process group ({name}, pid {pid}, epoch {epoch}) past its lease")
                os.killpg(pid, signal.SIGSTOP)
            result = _takeover(redis, fault_at, epoch)
            took_ms = result["takeover_ms"]
            result.update(_recovery(sampler, fault_at, threshold))
            if mode == "stop":
                time.sleep(max(0.0, TUNING.job_lease_ms / 1000 + 3 - (time.time() - fault_at)))
                resumed_at = time.time()
                os.killpg(pid, signal.SIGCONT)
                try:
                    _wait("the resumed job to exit", lambda: not _alive(pid), 30)
                    result["old_job_exited_s"] = round(time.time() - resumed_at, 1)
                except RuntimeError:
                    result["old_job_exited_s"] = None
                time.sleep(2)
                result["old_epoch_writes_after_takeover"] = sum(
                    1 for b in recent_heartbeats(redis, 500) if b.epoch == epoch and b.time > fault_at + took_ms / 1000)
            marks.append((fault_at, mode))
            out[mode] = result
            say(f"{mode}: {result}")
        writer.join()
        say("waiting for the job to drain, then reconciling events with the oracle")
        # drained: the feed has stopped, and the job has run no batch for 2 s (it runs none without new
        # records); the freshness lag itself only grows once nothing new is sent
        def drained() -> bool:
            beat = read_heartbeat(redis)
            return time.time() - writer.ts[-1] / 1000 > 3 and beat is not None and time.time() - beat.time > 2
        _wait("the last reports to be processed", drained, 180)
        sampler.halt.set()
        reports["ts"] = writer.ts                     # as sent: the oracle judges what the job was given
        expected = expected_events(reports.assign(device_id=reports["device_id"].str.slice(len(loaded.device_prefix))),
                                   sim.fences, sim.device_farm)
        rec = {}
        for _ in range(30):
            observed = read_events(redis, sorted(set(loaded.farm_of.values())))
            obs = observed[observed["device_id"].str.startswith(loaded.device_prefix)].copy() if len(observed) \
                else pd.DataFrame(columns=["device_id", "fence_id", "type", "ts", "farm"])
            obs["device_id"] = obs["device_id"].str.slice(len(loaded.device_prefix))
            obs["fence_id"] = [loaded.fence_sim.get((f, i), f"?{i}") for f, i in zip(obs["farm"], obs["fence_id"])]
            rec = reconcile(expected, obs)
            if rec["lost"] == 0:
                break
            time.sleep(2)
        t0 = sampler.samples[0][0] if sampler.samples else 0.0
        # the freshness lag as sampled (s since the first sample, lag ms) and the faults: what the plot shows
        out["lag_series"] = [[round(t - t0, 2), round(lag * 1000)] for t, lag in sampler.samples]
        out["faults_s"] = {mode: round(at - t0, 2) for at, mode in marks}
        out.update({"events": rec["events"], "lost": rec["lost"], "duplicated": rec["duplicated"],
                    "unexpected": rec.get("unexpected", 0), "stack": stack.describe(), "machine": machine(),
                    "command": command, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    if json_path:
        import json
        from pathlib import Path
        Path(json_path).write_text(json.dumps(out, indent=1))
        if plot:
            from loadgen.plots import failover_plot
            failover_plot(Path(json_path).with_suffix(".png"), sampler.samples, marks, out)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (FileNotFoundError, IndexError):
        return False
