"""Security headers: every answer says `nosniff` and sends no referrer; the web UI's pages also get a
Content-Security-Policy that allows only what the page loads — its own scripts (Leaflet, Geoman and the
ES modules under /ui/js/; no inline script) and styles (Leaflet sets inline styles on map elements), map tiles from any tile server the farmer configures, and
requests to this API — and may not be framed."""
from __future__ import annotations

COMMON = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
UI_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
          "img-src 'self' data: blob: https: http:; connect-src 'self'; font-src 'self' data:; "
          "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
UI = [(b"content-security-policy", UI_CSP.encode()), (b"x-frame-options", b"DENY")]


def _is_ui(path: str) -> bool:
    return path == "/" or path.startswith(("/ui/", "/vendor/"))


def for_path(path: str) -> list[tuple[bytes, bytes]]:
    """The headers an answer on `path` carries: the one rule, for FastAPI's answers (SecurityHeaders)
    and for those api/fastpath.py sends itself."""
    return COMMON + UI if _is_ui(path) else COMMON


class SecurityHeaders:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        extra = for_path(scope.get("path", ""))

        async def add(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)
        await self.app(scope, receive, add)
