"""Loading a simulation into a stack: farms, fences (bulk), devices (bulk), and streaming its reports
through the real job while sampling the job's heartbeat."""
from __future__ import annotations

import secrets
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import orjson
import pandas as pd

from fencing.model import keys, live_stream
from fencing.model.heartbeat import Heartbeat, Progress, read_heartbeat, read_progress
from loadgen.bench_stack import say
from loadgen.herd import Simulation
from loadgen.progress import bar as progress_bar


@dataclass
class Loaded:
    tag: str
    farm_of: dict[str, str]                 # sim farm id → real farm id
    farm_keys: dict[str, str]               # real farm id → API key
    fence_real: dict[str, tuple[str, str]]  # sim fence id → (real farm id, real fence id)
    fence_sim: dict[tuple[str, str], str]   # (real farm, real fence id) → sim fence id
    device_prefix: str
    seconds: dict[str, float] = field(default_factory=dict)

    def real_device(self, sim_device: str) -> str:
        return self.device_prefix + sim_device

    @property
    def warmup_prefix(self) -> str:
        """Warm-up devices: the same animals under other ids (same farms, same cells), so the job's
        workers and fence caches are warm before the measured run, without touching its devices."""
        return "w" + self.device_prefix


def load_simulation(redis, sim: Simulation, progress: bool = True, warm_devices=None) -> Loaded:
    """`warm_devices`: the simulated devices whose warm-up twins (`Loaded.warmup_prefix`) are
    registered too (None: all of them)."""
    from api.tenancy import create_farm
    from fencing.model.fence_store import save_fences_bulk, validate_features_bulk

    tag = secrets.token_hex(3)
    t0 = time.perf_counter()
    farm_of: dict[str, str] = {}
    farm_keys: dict[str, str] = {}
    farms = [f.farm_id for f in sim.farms]
    bar = progress_bar(total=len(farms), unit="farm", desc="farms", disable=not progress)
    for start in range(0, len(farms), 2_000):
        pipe = redis.pipeline()
        for sim_farm in farms[start:start + 2_000]:
            farm_id, key = create_farm(pipe, f"bench {tag} {sim_farm}")   # queued, not sent yet
            farm_of[sim_farm], farm_keys[farm_id] = farm_id, key
        pipe.execute()
        bar.update(len(farms[start:start + 2_000]))
    bar.close()
    t1 = time.perf_counter()

    say(f"validating {len(sim.fences)} fences (H3 covers in bulk)")
    valid = validate_features_bulk([f.geojson for f in sim.fences])
    t2 = time.perf_counter()
    fence_real, fence_sim, triples = {}, {}, []
    for i, (fence, v) in enumerate(zip(sim.fences, valid)):
        if isinstance(v, Exception):
            raise v
        real_farm, real_id = farm_of[fence.farm_id], f"f-{tag}-{i:07d}"
        fence_real[fence.fence_id] = (real_farm, real_id)
        fence_sim[(real_farm, real_id)] = fence.fence_id
        triples.append((real_farm, real_id, v))
    bar = progress_bar(total=len(triples), unit="fence", desc="fences", disable=not progress)
    for start in range(0, len(triples), 10_000):
        save_fences_bulk(redis, None, triples[start:start + 10_000])
        bar.update(len(triples[start:start + 10_000]))
    bar.close()
    t3 = time.perf_counter()

    prefix = f"b{tag}-"
    register_devices(redis, sim, farm_of, prefix)
    register_devices(redis, sim, farm_of, "w" + prefix, warm_devices)
    t4 = time.perf_counter()
    return Loaded(tag, farm_of, farm_keys, fence_real, fence_sim, prefix,
                  {"farms_s": round(t1 - t0, 3), "fence_validate_s": round(t2 - t1, 3),
                   "fence_save_s": round(t3 - t2, 3), "devices_s": round(t4 - t3, 3)})


def register_devices(redis, sim: Simulation, farm_of: dict[str, str], prefix: str, ids=None) -> None:
    """Register the simulated devices (`ids`, default all) in their farms as `prefix` + simulator id."""
    from api.tenancy import register_devices_bulk
    ids = sim.device_ids.tolist() if ids is None else list(ids)
    for start in range(0, len(ids), 100_000):      # a bounded list of triples at a time
        register_devices_bulk(redis, [(farm_of[sim.device_farm[d]], prefix + d, sim.device_herd[d][-40:])
                                      for d in ids[start:start + 100_000]])


# --- heartbeat ----------------------------------------------------------------------------------


class HeartbeatSampler(threading.Thread):
    """Polls the job's progress (a small record); keeps the whole heartbeat of each distinct batch
    (time, points_total, stats), read once when the batch id changes. The times it reports are the
    heartbeats' own, so the poll's period bounds only how soon a run's end is seen, not its figure."""

    def __init__(self, redis, interval: float = 0.25):
        super().__init__(daemon=True)
        self.redis, self.interval = redis, interval
        self.beats: list[Heartbeat] = []
        self._halt = threading.Event()
        self.latest: Progress | None = None

    def run(self) -> None:
        seen = None
        while not self._halt.is_set():
            try:
                progress = read_progress(self.redis)
                beat = read_heartbeat(self.redis) if progress is not None and progress.batch_id != seen else None
            except Exception:  # noqa: BLE001 - a Redis hiccup: keep sampling
                progress = beat = None
            if beat is not None and beat.batch_id != seen:     # (the beat may be a newer batch's)
                seen = beat.batch_id
                self.beats.append(beat)
            if progress is not None:
                self.latest = progress
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def handled(beat: Heartbeat | Progress | None) -> int:
    """Reports the job is done with: processed, or shed under load (elastic load shedding drops only
    reports that cannot change any fence state; they are counted apart, not lost)."""
    return beat.handled_total if beat is not None else 0


def stream_and_wait(stack, reports: pd.DataFrame, progress: bool = True, stall_timeout_s: float = 180.0,
                    rate: float | None = None):
    """Produce `reports` (already renamed to real device ids), at `rate` per second or as fast as
    possible, and wait until the
    job's heartbeat has counted them all. Returns (write stats, first produce wall time (s), done wall
    time (s) or None on stall, sampler, baseline points_total)."""
    from loadgen.kafka_writer import write_reports

    redis = stack.redis
    base = handled(read_heartbeat(redis))
    sampler = HeartbeatSampler(redis)
    sampler.start()
    target = base + len(reports)
    t_first = time.time()
    stats = write_reports(stack.settings.kafka_bootstrap, reports, rate=rate, progress=progress)
    t_first = float(stats.sent_at_ms[0]) / 1000.0 if len(reports) else t_first
    bar = progress_bar(total=len(reports), unit="pt", desc="processed by the job", disable=not progress)
    done_at = None
    last_progress, last_total = time.time(), base
    while True:
        beat = sampler.latest
        total = handled(beat)
        if total < last_total:       # the job restarted: its counters began again
            say("the job's counters went backwards (restart?); counting from the new total")
            base, target = total - (last_total - base), total - (last_total - base) + len(reports)
        bar.update(max(0, min(total, target) - base - bar.n))
        if total >= target:
            done_at = beat.time
            break
        if total != last_total:
            last_progress = time.time()
        last_total = total
        if time.time() - last_progress > stall_timeout_s:
            say(f"no progress for {stall_timeout_s:.0f} s: {total - base}/{len(reports)} processed")
            break
        time.sleep(0.05)
    bar.close()
    time.sleep(0.3)
    sampler.stop()
    return stats, t_first, done_at, sampler, base


def wait_until_warm(redis, fences: int, since: float, timeout_s: float = 150.0) -> dict:
    """Wait until a keep-warm run that ended after `since` (epoch s) found at least `fences` fences
    cached in every Python worker it met: the active job's workers, and the hot standby's when one
    runs. A job that has been running is in that state; right after a bulk load it is not. The
    warm-up's batches reach only the workers they ran on (Spark pools more Python workers than
    cores), and the rest, and the standby, load the whole map later: 100k fences cost a worker
    seconds of CPU, which would land in the measured run. Keep-warm off (no run on record): no wait.
    Returns {"seconds", "warm": bool, "runs": {status key: fences per task}}."""
    from fencing.stream.keep_warm import ACTIVE_WARM_KEY, STANDBY_WARM_KEY
    started = time.time()
    runs: dict[str, list[int]] = {}
    while True:
        pending = False
        for key in (ACTIVE_WARM_KEY, STANDBY_WARM_KEY):
            raw = redis.get(key)
            if raw is None:
                continue            # keep-warm off, or no standby
            run = orjson.loads(raw)
            runs[key] = [int(t.get("fences", 0)) for t in run.get("tasks", ())]
            if run.get("time", 0) < since or min(runs[key], default=0) < fences:
                pending = True
        waited = time.time() - started
        if not pending or waited > timeout_s:
            return {"seconds": round(waited, 2), "warm": not pending, "runs": runs}
        time.sleep(0.5)


def read_events(redis, farm_ids: list[str]) -> pd.DataFrame:
    """Every event in the farms' live streams: device_id, fence_id, type, ts (ms), visible_ms, farm.
    Built column by column, a few farms at a time, with the repeated strings (farm, fence, type)
    shared: a million devices' events are millions of rows."""
    from loadgen.truth import to_epoch_ms
    intern = sys.intern
    frames = []
    for start in range(0, len(farm_ids), 1_000):
        chunk = farm_ids[start:start + 1_000]
        pipe = redis.pipeline()
        for farm in chunk:
            pipe.xrange(keys.event_stream(farm), "-", "+")
        cols: dict[str, list] = {c: [] for c in EVENT_COLUMNS}
        for farm, entries in zip(chunk, pipe.execute()):
            for entry_id, fields in entries:
                visible_ms = int(entry_id.split("-", 1)[0])
                for raw in live_stream.entry_events(fields):
                    ev = orjson.loads(raw)
                    cols["farm"].append(farm)
                    cols["device_id"].append(ev["device_id"])
                    cols["fence_id"].append(intern(ev["fence_id"]) if ev["fence_id"] else ev["fence_id"])
                    cols["type"].append(intern(ev["type"]))
                    cols["ts"].append(ev["ts"])
                    cols["visible_ms"].append(visible_ms)
                    cols["event_id"].append(ev.get("event_id"))
        if cols["farm"]:
            frame = pd.DataFrame(cols)
            frame["ts"] = to_epoch_ms(frame["ts"]).astype(np.int64)
            frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=list(EVENT_COLUMNS))
    return pd.concat(frames, ignore_index=True)


EVENT_COLUMNS = ("farm", "device_id", "fence_id", "type", "ts", "visible_ms", "event_id")


def batch_summary(beats: list[Heartbeat]) -> dict:
    if not beats:
        return {}
    d = np.array([b.duration_s for b in beats])
    p = np.array([b.points for b in beats])
    part = [s.seconds for b in beats for s in b.partitions]
    return {"mean": round(float(d.mean()), 3), "max": round(float(d.max()), 3),
            "points_mean": round(float(p.mean()), 1), "points_max": int(p.max()),
            "task_seconds_mean": round(float(np.mean(part)), 3) if part else None}
