"""Uniform 4xx errors: `detail` always names the problem."""
from __future__ import annotations

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from redis import exceptions as redis_errors

# A store that cannot answer right now (a node down, failing over, a slot moving, loading its AOF):
# the request may be retried as it is.
STORE_UNAVAILABLE = (redis_errors.ConnectionError, redis_errors.TimeoutError, redis_errors.ClusterError,
                     redis_errors.TryAgainError, redis_errors.ReadOnlyError,
                     redis_errors.RedisClusterException, ConnectionError, TimeoutError)


def unprocessable(detail: str) -> HTTPException:
    return HTTPException(422, detail)


def store_error(exc: Exception) -> JSONResponse:
    """The one mapping of live-state store failures to HTTP: 507 when Redis is full (maxmemory,
    noeviction), else 503; both with Retry-After, never a 500."""
    if isinstance(exc, redis_errors.OutOfMemoryError) or "OOM" in str(exc)[:8]:
        return JSONResponse({"detail": "the live state store is full (maxmemory); nothing was written"},
                            status_code=507, headers={"Retry-After": "30"})
    return JSONResponse({"detail": "the live state store is unavailable, retry shortly"}, status_code=503,
                        headers={"Retry-After": "2"})


def not_found(what: str) -> HTTPException:
    # Another farm's object and a missing one answer alike: existence never leaks.
    return HTTPException(404, f"{what} not found")
