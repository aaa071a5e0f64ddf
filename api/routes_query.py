"""Pull queries: who is inside a fence or an area, where a device is, positions, events (+ SSE)."""
from __future__ import annotations

import anyio.from_thread
import shapely
from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse

from api import answers, auth, event_hub, events, history, live, tenancy
from api.event_hub import TooManyStreams
from api.auth import Principal, farm_principal, principal
from api.errors import not_found, unprocessable
from fencing.model import live_stream
from fencing.model.geometry import FenceError
from fencing.model.timeutil import iso, to_ms

router = APIRouter(prefix="/v1", tags=["queries"])


@router.get("/fences/{fence_id}/devices", summary="Devices inside the fence now")
async def fence_devices(fence_id: str, request: Request, who: Principal = Depends(farm_principal)) -> Response:
    body = await answers.fence_devices(request.app.state.aredis, who.farm_id, fence_id,
                                       answers.wants_fresh(request.headers.get("cache-control", "")))
    if body is None:
        raise not_found("fence")
    return Response(body, media_type="application/json")


@router.post("/query/within", summary="Devices whose latest position lies in an ad-hoc Polygon/MultiPolygon")
async def query_within(request: Request, body: dict = Body(..., examples=[{"geometry": {
        "type": "Polygon", "coordinates": [[[8.5, 47.0], [8.6, 47.0], [8.6, 47.1], [8.5, 47.0]]]}}]),
        who: Principal = Depends(farm_principal)) -> Response:
    try:
        answer = await answers.devices_within(request.app.state.aredis, who.farm_id,
                                              body.get("geometry") if isinstance(body, dict) else None,
                                              answers.wants_fresh(request.headers.get("cache-control", "")))
    except FenceError as err:
        raise unprocessable(str(err)) from None
    return Response(answer, media_type="application/json")


@router.get("/devices/{device_id}", summary="A device's latest position, fences and battery")
def get_device(device_id: str, request: Request, who: Principal = Depends(principal)) -> dict:
    redis = request.app.state.redis
    if who.is_device and who.device_id != device_id:
        raise not_found("device")
    if tenancy.device_record(redis, who.farm_id, device_id) is None:
        raise not_found("device")
    return live.device_view(device_id, live.positions(redis, who.farm_id, [device_id]).get(device_id),
                            live.closed_fences(redis, who.farm_id))


def _bbox(text: str) -> shapely.Geometry:
    try:
        minlon, minlat, maxlon, maxlat = (float(v) for v in text.split(","))
    except ValueError:
        raise unprocessable("bbox must be minlon,minlat,maxlon,maxlat") from None
    if not (-180 <= minlon < maxlon <= 180 and -90 <= minlat < maxlat <= 90):
        raise unprocessable("bbox out of range or empty: need -180<=minlon<maxlon<=180, -90<=minlat<maxlat<=90")
    return shapely.box(minlon, minlat, maxlon, maxlat)


@router.get("/positions", summary="Latest positions as a GeoJSON FeatureCollection (optional bbox and herd)")
def get_positions(request: Request, bbox: str | None = Query(None, examples=["8.4,46.9,8.6,47.1"]),
                  herd: str | None = None, who: Principal = Depends(farm_principal)) -> dict:
    redis = request.app.state.redis
    if bbox:
        area = _bbox(bbox)
        found = anyio.from_thread.run(live.devices_within, request.app.state.aredis, who.farm_id, area) \
            if area.area < 1.0 else \
            {d: p for d, p in live.positions(redis, who.farm_id).items()
             if shapely.intersects_xy(area, p["lon"], p["lat"])}
    else:
        found = live.positions(redis, who.farm_id)
    devices = tenancy.device_records(redis, who.farm_id, sorted(found))
    features = []
    closed = live.closed_fences(redis, who.farm_id)
    for device_id, pos in sorted(found.items()):
        device_herd = (devices.get(device_id) or {}).get("herd")
        if herd is not None and device_herd != herd:
            continue
        features.append({"type": "Feature", "id": device_id,
                         "geometry": {"type": "Point", "coordinates": [pos["lon"], pos["lat"]]},
                         "properties": {"device_id": device_id, "herd": device_herd, "ts": iso(pos["ts"]),
                                        "battery": pos.get("battery"),
                                        "fences": [f for f in pos.get("fences", []) if f not in closed]}})
    return {"type": "FeatureCollection", "features": features}


@router.get("/events", summary="Fence events, newest last (filters: fence_id, device_id, since; limit ≤ 10000)")
def get_events(request: Request, fence_id: str | None = None, device_id: str | None = None,
               since: str | None = Query(None, description="ISO 8601 or epoch milliseconds"),
               limit: int = Query(100, ge=1, le=10_000), who: Principal = Depends(farm_principal)) -> dict:
    try:
        since_ms = to_ms(since) if since is not None else None
    except ValueError as err:
        raise unprocessable(f"since: {err}") from None
    found = events.list_events(request.app.state.redis, who.farm_id, fence_id=fence_id,
                               device_id=device_id, since_ms=since_ms, limit=limit)
    return {"events": found}


@router.post("/events/stream-token", summary="A short-lived token for the live event stream (for EventSource, "
             "which cannot send an Authorization header)")
def stream_token(request: Request, who: Principal = Depends(farm_principal)) -> dict:
    token = auth.issue_stream_token(request.app.state.redis, who.farm_id)
    return {"token": token, "expires_in": auth.STREAM_TOKEN_TTL_S,
            "url": f"/v1/events/stream?token={token}"}


@router.get("/events/stream", summary="Live fence events as Server-Sent Events (auth: Bearer, or ?token= "
            "from POST /v1/events/stream-token)")
async def stream_events(request: Request, who: Principal = Depends(auth.stream_principal)) -> StreamingResponse:
    last_id = request.headers.get("last-event-id")
    if last_id is not None and live_stream.parse_event_id(last_id) is None:
        raise unprocessable("Last-Event-ID: expected an event id of this stream such as 1732500000000-0.0")
    hub = request.app.state.event_hub
    try:
        sub = await hub.subscribe(who.farm_id, last_id)
    except TooManyStreams as err:
        raise HTTPException(429, f"{err}; close another map first", headers={"Retry-After": "10"}) from None
    except Exception:  # noqa: BLE001 - the store did not answer in three tries: the browser retries
        raise HTTPException(503, "the live event stream cannot be opened right now, retry shortly",
                            headers={"Retry-After": "2"}) from None
    return StreamingResponse(event_hub.frames(hub, sub, request.is_disconnected),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/positions/history", summary="Past positions from the Parquet history (device_id or herd, from, to)")
def positions_history(request: Request, device_id: str | None = None, herd: str | None = None,
                      from_: str | None = Query(None, alias="from", description="ISO 8601 or epoch ms"),
                      to: str | None = Query(None, description="ISO 8601 or epoch ms"),
                      limit: int = Query(10_000, ge=1, le=history.MAX_ROWS),
                      who: Principal = Depends(farm_principal)) -> dict:
    times = {}
    for name, value in (("from", from_), ("to", to)):
        try:
            times[name] = to_ms(value) if value is not None else None
        except ValueError as err:
            raise unprocessable(f"{name}: {err}") from None
    start, end = times["from"], times["to"]
    table = history.farm_history(request.app.state.redis, str(request.app.state.settings.history_dir),
                                 who.farm_id, device_id=device_id, herd=herd, from_ms=start, to_ms_=end, limit=limit)
    return history.as_feature_collection(table)
