"""SILENT events: a device that has not reported for `silent_after` (wall clock) gets one `silent`
event per silence — its id hashes the last report's time, so a periodic scan never repeats it and a
device that reports again and falls silent again gets a new one. Runs on a timer in the job driver,
because silence is exactly when no micro-batch runs."""
from __future__ import annotations

import logging
import os
import threading
import time

import orjson

from fencing import keys
from fencing.transitions import event_id

log = logging.getLogger("herdfence.silent")
SILENT_AFTER_S = float(os.environ.get("HERDFENCE_SILENT_SECONDS", "3600"))
SCAN_EVERY_S = float(os.environ.get("HERDFENCE_SILENT_SCAN_SECONDS", "30"))


def farms(redis) -> list[str]:
    found = set()
    for key in redis.scan_iter(match="farm:{*}", count=1000):
        found.add(key[len("farm:{"):-1])
    return sorted(found)


def silent_events(redis, now_ms: int, silent_after_ms: int) -> list[dict]:
    out = []
    for farm_id in farms(redis):
        for device_id, raw in redis.hscan_iter(keys.positions(farm_id), count=1000):
            pos = orjson.loads(raw)
            if now_ms - pos["ts"] >= silent_after_ms:
                fences = pos.get("fences") or []
                out.append({"event_id": event_id(f"{farm_id}/", device_id, "silent", pos["ts"]),
                            "type": "silent", "farm_id": farm_id, "device_id": device_id,
                            "fence_id": fences[0] if len(fences) == 1 else None,
                            "ts": pos["ts"] + silent_after_ms, "lat": pos["lat"], "lon": pos["lon"]})
    return out


class SilentScanner(threading.Thread):
    def __init__(self, redis, sinks, silent_after_s: float = SILENT_AFTER_S, every_s: float = SCAN_EVERY_S):
        super().__init__(name="silent-scanner", daemon=True)
        self.redis, self.sinks = redis, sinks
        self.silent_after_ms, self.every_s = int(silent_after_s * 1000), every_s
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            try:
                found = silent_events(self.redis, int(time.time() * 1000), self.silent_after_ms)
                if found:
                    self.sinks.write_once(found)
            except Exception:   # a Redis failover must not kill the scanner
                log.exception("silent scan failed; retrying at the next tick")
