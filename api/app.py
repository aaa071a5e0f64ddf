"""The herdfence HTTP API and web UI (FastAPI). Run: uvicorn api.app:app."""
from __future__ import annotations

import time
from contextlib import asynccontextmanager
from functools import lru_cache
from pathlib import Path

from fastapi import FastAPI, Request
from redis import exceptions as redis_errors
from fastapi.responses import HTMLResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles

import asyncio
import gc
import logging

from api import errors, invalidation, metrics, routes_fences, routes_query, routes_reports, routes_stats, webhooks
from api.event_hub import EventHub
from api.fastpath import HotQueries
from api.limits import BodySizeLimit
from api.security_headers import SecurityHeaders
from api.serving import die_with_master
from fencing.config import load_settings
from fencing.model import notify
from fencing.model.gc_freeze import FreezePolicy
from fencing.model.redis_conn import async_cluster, connect

UI_DIR = Path(__file__).parent / "ui"
log = logging.getLogger("herdfence.api")
NODE_MODULES = UI_DIR / "node_modules"


@asynccontextmanager
async def lifespan(app: FastAPI):
    die_with_master()
    settings = load_settings()
    app.state.settings = settings
    app.state.redis = connect(settings)
    host, port = settings.redis_node
    # the hot pull routes are async end to end (no thread hop): they use an asyncio cluster client
    app.state.aredis = async_cluster(host, port)
    try:      # learn the slot map now: a burst of first requests must not all race to do it
        await app.state.aredis.initialize()
    except Exception as err:  # noqa: BLE001 - Redis down at start: the first request tries again
        log.warning("Redis Cluster not reachable at start: %s", err)

    @lru_cache(maxsize=1)
    def producer():
        from ingest.producer import ReportProducer
        return ReportProducer(settings.kafka_bootstrap)

    app.state.producer = producer
    delivery = asyncio.create_task(webhooks.Deliverer(app.state.redis,
                                                      allow_private=settings.webhook_allow_private).run())
    hub = app.state.event_hub = EventHub(app.state.aredis, per_farm=settings.streams_per_farm)
    invalidation.on(notify.LIVE, hub.changed)
    hub_task = asyncio.create_task(hub.run())
    listener = asyncio.create_task(invalidation.listen(settings.redis_nodes))
    # What lives long (modules, the app, clients, open streams, cached answers) is frozen out of the
    # collector's sight every FREEZE_EVERY_S: a full collection walked ~200k+ objects (70-130 ms with
    # 1,000 open maps) while every request of the worker waited (fencing/model/gc_freeze.py).
    gc.collect()
    gc.freeze()
    if metrics.GC_PAUSES.callback not in gc.callbacks:
        gc.callbacks.append(metrics.GC_PAUSES.callback)
    freezer = asyncio.create_task(_freeze_survivors())
    publisher = asyncio.create_task(_publish_metrics())
    yield
    publisher.cancel()
    freezer.cancel()
    delivery.cancel()
    listener.cancel()
    hub_task.cancel()
    await app.state.aredis.aclose()
    if producer.cache_info().currsize:
        producer().close()


FREEZE_EVERY_S = 30.0
FULL_GC_EVERY_S = 600.0


async def _publish_metrics() -> None:
    """This worker's gauges and collector pauses into the files every worker's /metrics sums."""
    while True:
        await asyncio.sleep(metrics.PUBLISH_EVERY_S)
        metrics.publish_worker_state()


async def _freeze_survivors() -> None:
    policy = FreezePolicy(FULL_GC_EVERY_S)
    while True:
        await asyncio.sleep(FREEZE_EVERY_S)
        policy.step()


app = FastAPI(title="herdfence", version="0.1.0", lifespan=lifespan,
              description="Geofencing for livestock: fences, GPS reports, live membership and events. "
                          "Auth: `Authorization: Bearer <farm API key or device token>`.")
app.add_middleware(BodySizeLimit)
app.add_middleware(SecurityHeaders)


class Observe:
    """Request count and latency per route, as raw ASGI middleware (cheaper than BaseHTTPMiddleware)."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def tap(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.inner(scope, receive, tap)
        finally:
            route = scope.get("route")
            metrics.observe(getattr(route, "path", "unmatched"), status, time.perf_counter() - started)


app.add_middleware(Observe)


@app.get("/healthz", tags=["ops"], summary="Liveness: {\"status\":\"ok\"}")
def healthz() -> dict:
    return {"status": "ok"}


@app.get("/metrics", tags=["ops"], response_class=PlainTextResponse, summary="Prometheus metrics")
def get_metrics(request: Request) -> PlainTextResponse:
    return PlainTextResponse(metrics.render(request.app.state.redis), media_type="text/plain; version=0.0.4")


@lru_cache(maxsize=1)
def _index_html() -> str:
    """The page, told the server's settings it shows (a collar silent for HERDFENCE_SILENT_SECONDS is
    "silent" on the map as in the events)."""
    from fencing.config import TUNING
    page = (UI_DIR / "index.html").read_text()
    setting = f'<meta name="herdfence-silent-seconds" content="{TUNING.silent_seconds:g}">'
    return page.replace("<meta charset=\"utf-8\">", "<meta charset=\"utf-8\">\n  " + setting, 1)


@app.get("/", include_in_schema=False)
def index() -> HTMLResponse:
    return HTMLResponse(_index_html())


app.include_router(routes_fences.router)
app.include_router(routes_reports.router)
app.include_router(routes_query.router)
app.include_router(routes_stats.router)
app.include_router(webhooks.router)
app.mount("/ui", StaticFiles(directory=UI_DIR), name="ui")
if (NODE_MODULES / "leaflet").exists():
    app.mount("/vendor/leaflet", StaticFiles(directory=NODE_MODULES / "leaflet" / "dist"), name="leaflet")
if (NODE_MODULES / "axe-core").exists():   # the accessibility check of the browser test (dev only)
    app.mount("/vendor/axe", StaticFiles(directory=NODE_MODULES / "axe-core"), name="axe")
if (NODE_MODULES / "@geoman-io").exists():
    app.mount("/vendor/geoman", StaticFiles(directory=NODE_MODULES / "@geoman-io" / "leaflet-geoman-free" / "dist"),
              name="geoman")


for _exc in (*errors.STORE_UNAVAILABLE, redis_errors.OutOfMemoryError):
    app.add_exception_handler(_exc, lambda request, exc: errors.store_error(exc))


# uvicorn serves `app`: the hot pull queries' short way in (api/fastpath.py), then FastAPI for the rest
fastapi_app = app
app = HotQueries(fastapi_app)
