"""Request body size limit (413) as raw ASGI middleware, so a huge body is never buffered whole."""
from __future__ import annotations

from fastapi import HTTPException

MAX_BODY_BYTES = 8 * 1024 * 1024   # 10,000 reports of ~300 bytes fit with room to spare
# Smaller limits where a body is one geometry or one small object: a fence or a query area of the
# most vertices allowed (fencing/model/geometry.py MAX_VERTICES) is well under 2 MB of GeoJSON.
ROUTE_LIMITS = (("/v1/reports", MAX_BODY_BYTES), ("/v1/fences", 2 * 1024 * 1024),
                ("/v1/query/", 2 * 1024 * 1024), ("/", 64 * 1024))


def body_limit(path: str) -> int:
    return next(limit for prefix, limit in ROUTE_LIMITS if path.startswith(prefix))


class BodyTooLarge(HTTPException):
    """An HTTPException, so that FastAPI's body parsing re-raises it (413) instead of turning any
    exception raised while reading a chunked body into a 400."""

    def __init__(self, max_bytes: int = MAX_BODY_BYTES):
        super().__init__(413, f"request body too large: the limit for this route is {max_bytes} bytes")


class BodySizeLimit:
    def __init__(self, app, max_bytes: int | None = None):
        self.app, self.max_bytes = app, max_bytes        # None: per route (ROUTE_LIMITS)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.max_bytes or body_limit(scope.get("path", "/"))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._reject(send, limit)
        seen = 0

        async def counting_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        try:
            await self.app(scope, counting_receive, send)
        except BodyTooLarge:
            await self._reject(send, limit)

    async def _reject(self, send, limit: int) -> None:
        body = b'{"detail":"request body too large: the limit for this route is %d bytes"}' % limit
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
