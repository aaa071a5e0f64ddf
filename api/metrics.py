"""Prometheus text exposition: the API's counters and latency summed over every API worker, plus Redis
memory and the job's last batch from Redis.

The API's own metrics live in prometheus-client's multiprocess mode (api/metrics_dir.py): each worker
writes to its mmap files, a scrape answered by any worker sums them. Request counts are written once per
turn of the worker's event loop (_Batch). A worker's collector pauses and invalidation state are
published from its own loop (publish_worker_state), never from a GC callback: a callback may run while
this thread holds prometheus-client's lock.
"""
from __future__ import annotations

import asyncio
import bisect
import threading
import time
from dataclasses import dataclass, field

from api import invalidation, metrics_dir
from fencing.config import load_settings
from fencing.model.heartbeat import read_heartbeat, read_log_gaps

DIR = metrics_dir.prepare(load_settings().run_dir)

# imported once the directory is set: prometheus-client picks its value store from the environment
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest  # noqa: E402
from prometheus_client import values  # noqa: E402
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402

if not getattr(values.ValueClass, "_multiprocess", False):   # imported earlier by someone else
    values.ValueClass = values.MultiProcessValue()

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# registry=None: exposed only through the multiprocess collector in render()
REPORTS_ACCEPTED = Counter("herdfence_reports_accepted", "Reports accepted by POST /v1/reports.", registry=None)
REPORTS_REJECTED = Counter("herdfence_reports_rejected", "Reports rejected by POST /v1/reports.", registry=None)
REQUESTS = Counter("herdfence_http_requests", "HTTP requests by route and status.", ["route", "status"],
                   registry=None)
LATENCY = Histogram("herdfence_http_request_seconds", "HTTP request latency.", buckets=BUCKETS, registry=None)
CACHE_HITS = Counter("herdfence_api_answer_cache_hits", "Pull answers served from an API worker's cache.",
                     registry=None)
CACHE_MISSES = Counter("herdfence_api_answer_cache_misses", "Pull answers read from Redis.", registry=None)
CACHE_ENTRIES = Gauge("herdfence_api_answer_cache_entries", "Answers cached, all API workers.",
                      multiprocess_mode="livesum", registry=None)
CACHE_BYTES = Gauge("herdfence_api_answer_cache_bytes", "Bytes of cached answers and keys, all API workers.",
                    multiprocess_mode="livesum", registry=None)
LISTENING = Gauge("herdfence_api_invalidation_listening", "1 while every API worker hears change notices.",
                  multiprocess_mode="livemin", registry=None)
GC_FULL = Summary("herdfence_api_gc_full_seconds", "Full garbage collections of the API workers (each stalls "
                  "its worker).", registry=None)
GC_FULL_MAX = Gauge("herdfence_api_gc_full_seconds_max", "The longest full garbage collection of an API worker.",
                    multiprocess_mode="max", registry=None)


class _Batch:
    """Increments gathered during one turn of the event loop and written to the shared files at its end:
    a write there costs microseconds (a lock, the pid check, an mmap write per value), too much for every
    hot pull query, and a turn serves many requests under load. Outside an event loop: written at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()           # the loop and a scrape's thread may both flush
        self._pending: dict[object, float] = {}
        self._scheduled = False

    def add(self, *increments: tuple[object, float]) -> None:
        with self._lock:
            for target, amount in increments:
                self._pending[target] = self._pending.get(target, 0) + amount
            if self._scheduled:
                return
            self._scheduled = True
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending, self._scheduled = self._pending, {}, False
        for target, amount in pending.items():
            target.inc(amount)


_BATCH = _Batch()
_request_counters: dict[tuple[str, int], Counter] = {}
# A histogram's values in multiprocess mode, one per bucket (+Inf last) and its sum, to add to in bulk
# (prometheus-client's Histogram.observe takes one observation at a time).
_LATENCY_BUCKETS, _LATENCY_SUM = LATENCY._buckets, LATENCY._sum


def observe(route: str, status: int, seconds: float) -> None:
    """One HTTP request served (route: the route's path template, so the label set stays small)."""
    counter = _request_counters.get((route, status))
    if counter is None:
        counter = _request_counters[(route, status)] = REQUESTS.labels(route, str(status))
    _BATCH.add((counter, 1), (_LATENCY_BUCKETS[bisect.bisect_left(BUCKETS, seconds)], 1), (_LATENCY_SUM, seconds))


def count(counter: Counter, amount: float = 1) -> None:
    """Add to an unlabelled counter, from the event loop's hot paths (batched like observe)."""
    _BATCH.add((counter, amount))


@dataclass
class GcPauses:
    """The cyclic collector's full (oldest-generation) passes in this worker: each one stops every
    request the worker holds for as long as it walks the heap. Kept here, published by the worker's loop."""
    count: int = 0
    seconds: float = 0.0
    max_s: float = 0.0
    pending: list[float] = field(default_factory=list)   # not yet in the shared files
    _started: float = 0.0

    def callback(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.count += 1
        self.seconds += took
        self.max_s = max(self.max_s, took)
        if len(self.pending) < 10_000:
            self.pending.append(took)


GC_PAUSES = GcPauses()
PUBLISH_EVERY_S = 1.0


def publish_worker_state() -> None:
    """This worker's gauges, collector pauses and batched counts into the shared files (its loop calls
    it every PUBLISH_EVERY_S, and before answering a scrape)."""
    _BATCH.flush()
    while True:
        try:
            took = GC_PAUSES.pending.pop()
        except IndexError:   # drained (the loop and a scrape's thread may both publish)
            break
        GC_FULL.observe(took)
    GC_FULL_MAX.set(GC_PAUSES.max_s)
    LISTENING.set(int(invalidation.listening()))


def render(redis) -> str:
    publish_worker_state()
    metrics_dir.forget_dead_workers(DIR)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(DIR))
    api = generate_latest(registry).decode()
    return api + "\n".join(_redis_memory(redis) + _job_metrics(redis)) + "\n"


def _redis_memory(redis) -> list[str]:
    """Each master's memory and its maxmemory (writers get 507 when it is reached: noeviction)."""
    from redis.cluster import RedisCluster
    try:
        per_node = redis.info("memory", target_nodes=RedisCluster.PRIMARIES)
    except Exception:  # noqa: BLE001 - a node down: the gauges are left out, /metrics still answers
        return []
    if not isinstance(per_node, dict) or "used_memory" in per_node:
        per_node = {"redis": per_node}
    lines = ["# HELP herdfence_redis_used_memory_bytes Memory used by each Redis master.",
             "# TYPE herdfence_redis_used_memory_bytes gauge"]
    limits = ["# HELP herdfence_redis_maxmemory_bytes Each Redis master's maxmemory (0: none).",
              "# TYPE herdfence_redis_maxmemory_bytes gauge"]
    for node, info in sorted(per_node.items()):
        lines.append(f'herdfence_redis_used_memory_bytes{{node="{node}"}} {int(info.get("used_memory", 0))}')
        limits.append(f'herdfence_redis_maxmemory_bytes{{node="{node}"}} {int(info.get("maxmemory", 0))}')
    return lines + limits


def _job_metrics(redis) -> list[str]:
    try:
        beat = read_heartbeat(redis)
    except Exception:
        return ["herdfence_job_up 0"]
    if beat is None:
        return ["herdfence_job_up 0"]
    gauges = {
        "herdfence_job_last_batch_id": beat.batch_id,
        "herdfence_job_batch_seconds": beat.duration_s,
        "herdfence_job_batch_points": beat.points,
        "herdfence_job_lag_records": beat.lag,
        "herdfence_events_emitted_total": beat.events_total,
        "herdfence_dead_letters_total": beat.dead_letters_total,
        "herdfence_redis_calls_local_total": beat.redis_local_total,
        "herdfence_redis_calls_cross_node_total": beat.redis_cross_total,
        "herdfence_job_routing_version": beat.routing_version,
        "herdfence_reports_shed_total": beat.shed_total,
        "herdfence_job_points_total": beat.points_total,
        "herdfence_job_heartbeat_age_seconds": round(max(0.0, time.time() - beat.time), 3),
    }
    out = ["herdfence_job_up 1"]
    for name, value in gauges.items():
        out += [f"# TYPE {name} gauge", f"{name} {value}"]
    gaps = read_log_gaps(redis)
    out += ["# HELP herdfence_broker_log_gaps_total Gaps in gps.reports (offsets no record holds) the job skipped.",
            "# TYPE herdfence_broker_log_gaps_total counter", f"herdfence_broker_log_gaps_total {len(gaps)}",
            "# HELP herdfence_broker_log_gap_offsets_total Offsets inside those gaps.",
            "# TYPE herdfence_broker_log_gap_offsets_total counter",
            f"herdfence_broker_log_gap_offsets_total {sum(g['end'] - g['start'] for g in gaps)}"]
    out += ["# HELP herdfence_partition_points Points per routed partition in the last micro-batch.",
            "# TYPE herdfence_partition_points gauge"]
    for part in beat.partitions:
        out.append(f'herdfence_partition_points{{partition="{part.partition}"}} {part.points}')
    return out
