"""Prometheus text exposition: API counters and latency, plus the job's last batch from Redis."""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field


from api import answers, invalidation
from fencing.model.heartbeat import read_heartbeat, read_log_gaps

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class ApiMetrics:
    reports_accepted: int = 0
    reports_rejected: int = 0
    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    latency_sum: float = 0.0

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests[(route, status)] = self.requests.get((route, status), 0) + 1
        self.latency_counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.latency_sum += seconds


METRICS = ApiMetrics()


@dataclass
class GcPauses:
    """The cyclic collector's full (oldest-generation) passes in this worker: each one stops every
    request the worker holds for as long as it walks the heap."""
    count: int = 0
    seconds: float = 0.0
    max_s: float = 0.0
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


GC_PAUSES = GcPauses()


def render(redis) -> str:
    m = METRICS
    lines = [
        "# HELP herdfence_reports_accepted_total Reports accepted by POST /v1/reports.",
        "# TYPE herdfence_reports_accepted_total counter",
        f"herdfence_reports_accepted_total {m.reports_accepted}",
        "# HELP herdfence_reports_rejected_total Reports rejected by POST /v1/reports.",
        "# TYPE herdfence_reports_rejected_total counter",
        f"herdfence_reports_rejected_total {m.reports_rejected}",
        "# HELP herdfence_http_requests_total HTTP requests by route and status.",
        "# TYPE herdfence_http_requests_total counter",
    ]
    for (route, status), count in sorted(m.requests.items()):
        lines.append(f'herdfence_http_requests_total{{route="{route}",status="{status}"}} {count}')
    lines += ["# HELP herdfence_http_request_seconds HTTP request latency.",
              "# TYPE herdfence_http_request_seconds histogram"]
    cumulative = 0
    for bound, count in zip(BUCKETS + (float("inf"),), m.latency_counts):
        cumulative += count
        le = "+Inf" if bound == float("inf") else repr(bound)
        lines.append(f'herdfence_http_request_seconds_bucket{{le="{le}"}} {cumulative}')
    lines += [f"herdfence_http_request_seconds_sum {m.latency_sum:.6f}",
              f"herdfence_http_request_seconds_count {cumulative}"]
    cache = answers.stats()
    lines += ["# HELP herdfence_api_answer_cache_hits_total Pull answers served from this worker's cache.",
              "# TYPE herdfence_api_answer_cache_hits_total counter",
              f"herdfence_api_answer_cache_hits_total {cache['hits']}",
              "# TYPE herdfence_api_answer_cache_misses_total counter",
              f"herdfence_api_answer_cache_misses_total {cache['misses']}",
              "# TYPE herdfence_api_answer_cache_entries gauge",
              f"herdfence_api_answer_cache_entries {cache['entries']}",
              "# HELP herdfence_api_invalidation_listening 1 while this worker hears change notices.",
              "# TYPE herdfence_api_invalidation_listening gauge",
              f"herdfence_api_invalidation_listening {int(invalidation.listening())}"]
    lines += [f"herdfence_api_answer_cache_bytes {cache['bytes']}"]
    gcp = GC_PAUSES
    lines += ["# HELP herdfence_api_gc_full_seconds Full garbage collections of this worker (each stalls it).",
              "# TYPE herdfence_api_gc_full_seconds summary",
              f"herdfence_api_gc_full_seconds_sum {gcp.seconds:.6f}",
              f"herdfence_api_gc_full_seconds_count {gcp.count}",
              "# TYPE herdfence_api_gc_full_seconds_max gauge",
              f"herdfence_api_gc_full_seconds_max {gcp.max_s:.6f}"]
    lines += _redis_memory(redis)
    lines += _job_metrics(redis)
    return "\n".join(lines) + "\n"


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
