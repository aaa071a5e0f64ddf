"""Request rates per farm and per device (429 with Retry-After), shared by every API worker through Redis.

A limit is a token bucket (a rate per second and a burst), kept in Redis as GCRA: one key per farm or
device holds the bucket's "theoretical arrival time" on Redis's clock, hash-tagged by the farm, and
expires when the bucket would be full again, so an idle bucket costs no memory and nothing is ever reset
wholesale. One Lua script per check takes tokens atomically: N API workers admit what one would.

A farm's limits (thousands of requests per second) would cost a Redis round trip per request for a
precision nobody needs, so there a worker takes a small batch of tokens at once (LEASE_S worth of the
rate) and spends them itself within LEASE_TTL_S, dropping what is left. Those tokens came out of the
shared bucket, so the workers together never admit more than it grants. A limit whose batch would be one
token (a device's) is checked in Redis on every request.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from fencing.config import TUNING
from fencing.model import keys

LEASE_S = 0.01          # a batch is 10 ms worth of the rate
LEASE_TTL_S = 1.0       # a worker spends a batch within this or drops the rest
MAX_HELD = 10_000       # batches held per bucket before the expired ones are swept

# KEYS[1]: the bucket; ARGV: µs per token, burst (tokens), tokens wanted. Returns {granted, µs to wait}.
# The write is a pcall: a Redis at maxmemory (noeviction) must not turn reads into errors; the writes
# themselves get their 507.
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, burst, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or 0), now)
local free = math.floor((now + burst * interval - tat) / interval + 1e-9)
if free < 1 then
  return {0, math.ceil(tat + interval - burst * interval - now)}
end
local granted = math.min(want, free)
tat = tat + granted * interval
redis.pcall('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
return {granted, 0}
"""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after_s: int = 0      # whole seconds (HTTP Retry-After) until a token is free; set when refused


ALLOWED = Decision(True)


class TokenBucket:
    """`rate` requests per second with a burst of `burst`, per farm (or per device of a farm)."""

    def __init__(self, name: str, rate: float, burst: float):
        self.name, self.rate, self.burst = name, rate, burst
        self.lease = max(1, int(rate * LEASE_S))
        self._args = (1e6 / rate, burst, self.lease)
        self._held: dict[str, tuple[int, float]] = {}    # key → (tokens, usable until, monotonic)
        self._lock = threading.Lock()                    # the event loop and the route threads share it
        self._scripts: dict[int, object] = {}            # per Redis client (sync or asyncio)

    def key(self, farm_id: str, device_id: str | None = None) -> str:
        return keys.rate_bucket(farm_id, self.name, device_id or "")

    def take_held(self, key: str) -> bool:
        """A token from this worker's batch, without Redis; False when it has none left."""
        if self.lease == 1:
            return False
        now = time.monotonic()
        with self._lock:
            tokens, until = self._held.get(key, (0, 0.0))
            if tokens < 1 or until <= now:
                return False
            self._held[key] = (tokens - 1, until)
            return True

    def allow(self, redis, key: str) -> Decision:
        """With the synchronous cluster client (a route's thread)."""
        if self.take_held(key):
            return ALLOWED
        return self._settle(key, self._script(redis)(keys=[key], args=self._args))

    async def allow_async(self, aredis, key: str) -> Decision:
        """With the asyncio cluster client (the event loop)."""
        if self.take_held(key):
            return ALLOWED
        return self._settle(key, await self._script(aredis)(keys=[key], args=self._args))

    def _script(self, client):
        script = self._scripts.get(id(client))
        if script is None:
            script = self._scripts[id(client)] = client.register_script(_GCRA)
        return script

    def _settle(self, key: str, reply) -> Decision:
        granted, wait_us = int(reply[0]), int(reply[1])
        if granted < 1:
            return Decision(False, max(1, math.ceil(wait_us / 1e6)))
        if granted > 1:
            now = time.monotonic()
            with self._lock:
                if len(self._held) >= MAX_HELD:
                    self._held = {k: v for k, v in self._held.items() if v[1] > now}
                tokens, until = self._held.get(key, (0, 0.0))
                kept = tokens if until > now else 0
                self._held[key] = (kept + granted - 1, now + LEASE_TTL_S)
        return ALLOWED


# Report posting is the write path devices hammer; reads are cheap and only capped per farm.
# A collar reports every few seconds at most: 50 requests/s (burst 100) per device token is far above
# legitimate use; gateways post batches with the farm key (2,000 requests/s, burst 4,000).
DEVICE_REPORTS = TokenBucket("device", TUNING.rate_device, 2 * TUNING.rate_device)
FARM_REPORTS = TokenBucket("reports", TUNING.rate_farm_reports, 2 * TUNING.rate_farm_reports)
FARM_REQUESTS = TokenBucket("farm", TUNING.rate_farm, 2 * TUNING.rate_farm)
