"""SILENT events: a device from which no report has arrived for `silent_after` (wall clock, so replayed
or simulated report times do not matter) gets one `silent` event per silence — its id hashes the last report's time, so a periodic scan never repeats it and a
device that reports again and falls silent again gets a new one. Runs on a timer in the job driver,
because silence is exactly when no micro-batch runs."""
from __future__ import annotations

import time

import orjson

from fencing.model import keys
from fencing.model.node_pipe import NodePipeline
from fencing.stream.periodic import Periodic
from fencing.model.transitions import event_id
from fencing.config import TUNING

SILENT_AFTER_S = TUNING.silent_seconds
SCAN_EVERY_S = TUNING.silent_scan_seconds
# The job rewrites a device's last-seen entry only once it is this old (a write per farm and batch was
# a third of the commands of a batch whose farms have a device or two each); every position carries its
# arrival ("rx"), which the scan checks before it flags a device. At most half the silence, so a device
# that reports again after being flagged (and dropped from the index) is always indexed again.
SEEN_STEP_MS = int(min(30.0, SILENT_AFTER_S / 2) * 1000)


SCAN_CHUNK = 5_000      # farms per pipelined round (one round trip per master each)


def silent_events(redis, now_ms: int, silent_after_ms: int) -> list[dict]:
    """One `silent` event per device whose latest report is older than the cutoff; the device leaves
    the last-seen index (only if it has not reported meanwhile) until its next report puts it back.
    The farms' indexes are read pipelined per master, not one round trip per farm: a region has tens
    of thousands of farms, and the scan shares the driver (and Redis) with the micro-batches."""
    cutoff = now_ms - silent_after_ms
    farms = sorted(redis.smembers(keys.FARMS))
    pipe = NodePipeline(redis)
    out = []
    for start in range(0, len(farms), SCAN_CHUNK):
        chunk = farms[start:start + SCAN_CHUNK]
        for farm_id in chunk:
            index = keys.last_seen(farm_id)
            pipe.command(index, "ZRANGEBYSCORE", index, "-inf", cutoff, "WITHSCORES", "LIMIT", 0, 10_000)
        quiet = [(farm_id, _pairs(answer)) for farm_id, answer in zip(chunk, pipe.execute()) if answer]
        for farm_id, pairs in quiet:
            pipe.hmget(keys.positions(farm_id), [d for d, _ in pairs])
        for (farm_id, pairs), raws in zip(quiet, pipe.execute()):
            alive: list = []
            for (device_id, indexed_ms), raw in zip(pairs, raws):
                if raw is None:
                    continue
                pos = orjson.loads(raw)
                arrived_ms = max(indexed_ms, pos.get("rx") or 0)
                if arrived_ms > cutoff:          # a stale entry (see SEEN_STEP_MS): it catches up
                    alive += [arrived_ms, device_id]
                    continue
                fences = pos.get("fences") or []
                out.append({"event_id": event_id(f"{farm_id}/", device_id, "silent", pos["ts"]),
                            "type": "silent", "farm_id": farm_id, "device_id": device_id,
                            "fence_id": fences[0] if len(fences) == 1 else None,
                            "ts": int(arrived_ms) + silent_after_ms, "lat": pos["lat"], "lon": pos["lon"]})
            if alive:    # GT: never below what the job wrote meanwhile
                index = keys.last_seen(farm_id)
                pipe.command(index, "ZADD", index, "GT", *alive)
        pipe.execute()
    return out


def _pairs(answer: list) -> list[tuple[str, float]]:
    """(member, score) pairs of a raw ZRANGEBYSCORE … WITHSCORES answer (flat in RESP2, pairs in RESP3)."""
    if answer and isinstance(answer[0], (list, tuple)):
        return [(m, float(s)) for m, s in answer]
    return [(m, float(s)) for m, s in zip(answer[::2], answer[1::2])]


def forget(redis, events: list[dict], cutoff: int) -> None:
    for farm_id in {e["farm_id"] for e in events}:
        redis.zremrangebyscore(keys.last_seen(farm_id), "-inf", cutoff)


class SilentScanner(Periodic):
    def __init__(self, redis, sinks, silent_after_s: float = SILENT_AFTER_S, every_s: float = SCAN_EVERY_S):
        super().__init__("silent-scanner", every_s)
        self.redis, self.sinks = redis, sinks
        self.silent_after_ms = int(silent_after_s * 1000)

    def tick(self) -> None:
        now = int(time.time() * 1000)
        found = silent_events(self.redis, now, self.silent_after_ms)
        if found:
            self.sinks.write_found(found)     # logged, then produced, before the index forgets
            forget(self.redis, found, now - self.silent_after_ms)
