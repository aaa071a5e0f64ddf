"""API keys and device tokens: generated once, stored only as SHA-256 hashes, resolved per request."""
from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from fastapi import Depends, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from api import invalidation, rate_limits
from api.worker_sync import SharedStamp
from fencing.model import keys, notify


@dataclass(frozen=True)
class Principal:
    farm_id: str
    device_id: str | None = None   # set for a device token: it may only post its own reports

    @property
    def is_device(self) -> bool:
        return self.device_id is not None


def new_secret(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(24)}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


# Every pull query pays for auth and secrets change rarely, so each API worker caches secret → principal:
# for a minute while the invalidation channel is live (a replaced token is published on it), else for
# 5 s. An unknown secret is remembered for 2 s only, so a key is usable as soon as it is created.
# The workers of this host also share a stamp that changes with every secret (api/worker_sync.py), so
# a replaced secret fails on the next request whichever worker answers it.
_KNOWN_TTL_S, _FALLBACK_TTL_S, _UNKNOWN_TTL_S = 60.0, 5.0, 2.0
_cache: dict[str, tuple[float, Principal | None]] = {}
invalidation.on(notify.AUTH, lambda _farms: _cache.clear())
_secrets_stamp = SharedStamp("secrets")
_cache_stamp = b""


def secrets_changed(redis) -> None:
    """Call after a key or token is created, replaced or revoked: every API worker drops its cache."""
    _secrets_stamp.renew()
    notify.auth_changed(redis)


def _cached(digest: str, now: float) -> tuple[bool, Principal | None]:
    """(still fresh, principal or None for an unknown secret); (False, None) when not cached."""
    global _cache_stamp
    stamp = _secrets_stamp.read()
    if stamp != _cache_stamp:
        _cache.clear()
        _cache_stamp = stamp
    hit = _cache.get(digest)
    if hit is None:
        return False, None
    ttl = invalidation.fresh_for(_KNOWN_TTL_S, _FALLBACK_TTL_S) if hit[1] is not None else _UNKNOWN_TTL_S
    return now - hit[0] < ttl, hit[1]


def resolve(redis, secret: str) -> Principal | None:
    """Look the secret up by its hash (cached per API worker, see above); the stored hash is compared
    in constant time."""
    digest = hash_secret(secret)
    now = time.monotonic()
    fresh, found = _cached(digest, now)
    if fresh:
        return found
    found = _lookup(redis, digest)
    if len(_cache) > 50_000:
        _cache.clear()
    _cache[digest] = (now, found)
    return found


def _lookup(redis, digest: str) -> Principal | None:
    farm_id = redis.get(keys.apikey(digest))
    if farm_id is not None:
        stored = redis.hget(keys.farm(farm_id), "key_hash") or ""
        return Principal(farm_id) if hmac.compare_digest(stored, digest) else None
    owner = redis.get(keys.devtoken(digest))
    if owner is not None:
        farm_id, _, device_id = owner.partition("\t")
        return Principal(farm_id, device_id)
    return None


def bearer_secret(request: Request) -> str | None:
    """The secret from `Authorization: Bearer …` only: a key in a URL ends up in access logs,
    proxies and browser history."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


# --- stream tokens: what a browser's EventSource (which cannot send headers) puts in the URL --------
STREAM_TOKEN_TTL_S = 300
STREAM_TOKEN_PREFIX = "hfs_"


def _stream_token_key(digest: str) -> str:
    return f"streamtoken:{digest}"


def issue_stream_token(redis, farm_id: str) -> str:
    """A short-lived secret that opens the farm's live event stream and nothing else."""
    token = STREAM_TOKEN_PREFIX + secrets.token_urlsafe(24)
    redis.set(_stream_token_key(hash_secret(token)), farm_id, ex=STREAM_TOKEN_TTL_S)
    return token


async def stream_principal(request: Request) -> Principal:
    """`GET /v1/events/stream`: the farm key in the Authorization header, or `?token=` from
    `POST /v1/events/stream-token`."""
    token = request.query_params.get("token")
    if token is None or request.headers.get("authorization"):
        return await farm_principal(await principal(request))
    farm_id = None
    if token.startswith(STREAM_TOKEN_PREFIX) and len(token) < 100:
        farm_id = await run_in_threadpool(request.app.state.redis.get, _stream_token_key(hash_secret(token)))
    if farm_id is None:
        raise HTTPException(401, "missing, invalid or expired stream token; get a new one with "
                                 "POST /v1/events/stream-token", headers={"WWW-Authenticate": "Bearer"})
    return Principal(farm_id)


async def principal(request: Request) -> Principal:
    """Async so that a cached key costs no thread hop; a cache miss reads Redis in the thread pool."""
    secret = bearer_secret(request)
    found = None
    if secret:
        fresh, found = _cached(hash_secret(secret), time.monotonic())
        if not fresh:
            found = await run_in_threadpool(resolve, request.app.state.redis, secret)
    if found is None:
        raise HTTPException(401, "missing or invalid API key", headers={"WWW-Authenticate": "Bearer"})
    request.state.farm_id = found.farm_id
    bucket = rate_limits.FARM_REQUESTS
    key = bucket.key(found.farm_id)
    if not bucket.take_held(key):
        # the synchronous client: no retries, so a Redis that is down answers 503 at once
        decision = await run_in_threadpool(bucket.allow, request.app.state.redis, key)
        if not decision.allowed:
            raise HTTPException(429, "too many requests for this farm; slow down",
                                headers={"Retry-After": str(decision.retry_after_s)})
    return found


async def farm_principal(who: Principal = Depends(principal)) -> Principal:
    """Routes that manage a farm need the farm key, not a device token."""
    if who.is_device:
        raise HTTPException(403, "a device token may only post its own reports; use the farm API key")
    return who
