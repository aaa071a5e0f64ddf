"""A short way in for the two hot pull queries, in front of FastAPI.

GET /v1/fences/{id}/devices and POST /v1/query/within are what dashboards and wrk hammer. For them,
FastAPI's middleware stack, routing and dependency solving cost more than the answer itself (most
answers come from api/answers.py's cache). This wrapper serves them directly when the request is plain:
a farm key already known to this worker, within the farm's rate, a body under 64 KiB, and an answer
without error. Anything else — unknown or device secret, 404, 422, 429, Redis trouble — goes on to
FastAPI unchanged (the body replayed), which gives the same answers and every error. Metrics are counted
under the same route names, and the answers carry the security headers FastAPI's would.
"""
from __future__ import annotations

import time

import orjson

from api import answers, auth, metrics, rate_limits, security_headers

FENCE_PREFIX, FENCE_SUFFIX = "/v1/fences/", "/devices"
WITHIN_PATH = "/v1/query/within"
MAX_FAST_BODY = 64 * 1024


def _json_headers(path: str) -> list[tuple[bytes, bytes]]:
    """Built once per route: the same security headers as every other answer on that path."""
    return [(b"content-type", b"application/json"), *security_headers.for_path(path)]


FENCE_HEADERS, WITHIN_HEADERS = _json_headers(FENCE_PREFIX), _json_headers(WITHIN_PATH)


class HotQueries:
    def __init__(self, app):
        self.app = app

    def __getattr__(self, name):   # app.state, app.openapi(), ... stay reachable through the wrapper
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]
            if method == "GET" and path.startswith(FENCE_PREFIX) and path.endswith(FENCE_SUFFIX):
                fence_id = path[len(FENCE_PREFIX):-len(FENCE_SUFFIX)]
                if fence_id and "/" not in fence_id:
                    return await self._fence(scope, receive, send, fence_id)
            elif method == "POST" and path == WITHIN_PATH:
                return await self._within(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _fence(self, scope, receive, send, fence_id: str):
        started = time.perf_counter()
        farm_id = await self._known_farm(scope)
        body = None
        if farm_id is not None:
            try:
                body = await answers.fence_devices(self.app.state.aredis, farm_id, fence_id,
                                                   answers.wants_fresh(_header(scope, b"cache-control")))
            except Exception:  # noqa: BLE001 - FastAPI answers again and maps the error
                body = None
        if body is None:
            return await self.app(scope, receive, send)
        await _respond(send, body, FENCE_HEADERS)
        metrics.observe("/v1/fences/{fence_id}/devices", 200, time.perf_counter() - started)

    async def _within(self, scope, receive, send):
        started = time.perf_counter()
        farm_id = await self._known_farm(scope)
        declared = _header(scope, b"content-length")
        if farm_id is None or not declared.isdigit() or int(declared) > MAX_FAST_BODY:
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return   # the client went away
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        answer = None
        try:
            request = orjson.loads(raw)
            if isinstance(request, dict):
                answer = await answers.devices_within(self.app.state.aredis, farm_id, request.get("geometry"),
                                                      answers.wants_fresh(_header(scope, b"cache-control")))
        except Exception:  # noqa: BLE001 - invalid JSON or geometry, Redis trouble: FastAPI says why
            answer = None
        if answer is None:
            return await self.app(scope, _replay(raw, receive), send)
        await _respond(send, answer, WITHIN_HEADERS)
        metrics.observe(WITHIN_PATH, 200, time.perf_counter() - started)

    async def _known_farm(self, scope) -> str | None:
        """The farm of a farm key this worker already trusts and that is within its rate, else None."""
        scheme, _, secret = _header(scope, b"authorization").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return None
        fresh, who = auth._cached(auth.hash_secret(secret.strip()), time.monotonic())
        if not fresh or who is None or who.is_device:
            return None
        bucket = rate_limits.FARM_REQUESTS
        key = bucket.key(who.farm_id)
        if not bucket.take_held(key):
            try:
                if not (await bucket.allow_async(self.app.state.aredis, key)).allowed:
                    return None   # FastAPI answers 429
            except Exception:  # noqa: BLE001 - Redis trouble: FastAPI answers 503
                return None
        return who.farm_id


def _header(scope, name: bytes) -> str:
    for key, value in scope.get("headers") or ():
        if key == name:
            return value.decode("latin-1")
    return ""


def _replay(raw: bytes, receive):
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()
    return replayed


async def _respond(send, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": headers + [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
