"""Fences CRUD (GeoJSON Features) and devices registration."""
from __future__ import annotations

from fastapi import APIRouter, Body, Depends, Request, Response

from api import tenancy
from api.auth import Principal, farm_principal
from api.errors import not_found, unprocessable
from fencing.model import fence_store
from fencing.model.geometry import FenceError

router = APIRouter(prefix="/v1", tags=["fences and devices"])

FENCE_EXAMPLE = {
    "type": "Feature",
    "properties": {"name": "North paddock", "debounce_reports": 2, "debounce_seconds": 30, "warn_m": 20},
    "geometry": {"type": "Polygon", "coordinates": [[[8.50, 47.00], [8.51, 47.00], [8.51, 47.01],
                                                     [8.50, 47.01], [8.50, 47.00]]]},
}


def _validated(feature) -> fence_store.ValidFence:
    try:
        return fence_store.validate_feature(feature)
    except FenceError as err:
        raise unprocessable(str(err)) from None


@router.post("/fences", status_code=201, summary="Create a fence (GeoJSON Feature: Polygon or MultiPolygon, holes allowed)")
def create_fence(request: Request, feature: dict = Body(..., examples=[FENCE_EXAMPLE]),
                 who: Principal = Depends(farm_principal)) -> dict:
    fence = _validated(feature)
    return fence_store.save_fence(request.app.state.redis, who.farm_id, fence_store.new_fence_id(), fence)


@router.get("/fences", summary="All fences of the farm as a FeatureCollection")
def list_fences(request: Request, who: Principal = Depends(farm_principal)) -> dict:
    return {"type": "FeatureCollection", "features": fence_store.list_fences(request.app.state.redis, who.farm_id)}


@router.get("/fences/{fence_id}", summary="One fence")
def get_fence(fence_id: str, request: Request, who: Principal = Depends(farm_principal)) -> dict:
    record = fence_store.load_fence(request.app.state.redis, who.farm_id, fence_id)
    if record is None:
        raise not_found("fence")
    return record["feature"]


@router.put("/fences/{fence_id}", summary="Replace a fence's geometry and properties (devices are re-evaluated at their next report)")
def replace_fence(fence_id: str, request: Request, feature: dict = Body(..., examples=[FENCE_EXAMPLE]),
                  who: Principal = Depends(farm_principal)) -> dict:
    redis = request.app.state.redis
    if fence_store.load_fence(redis, who.farm_id, fence_id) is None:
        raise not_found("fence")
    return fence_store.save_fence(redis, who.farm_id, fence_id, _validated(feature))


@router.delete("/fences/{fence_id}", status_code=204, summary="Delete a fence: no further events, members dropped")
def delete_fence(fence_id: str, request: Request, who: Principal = Depends(farm_principal)) -> Response:
    if not fence_store.delete_fence(request.app.state.redis, who.farm_id, fence_id):
        raise not_found("fence")
    return Response(status_code=204)


@router.post("/devices", status_code=201, summary="Register a device; returns its token (shown once)")
def create_device(request: Request, body: dict = Body(..., examples=[{"device_id": "cow-17", "herd": "north"}]),
                  who: Principal = Depends(farm_principal)) -> dict:
    device_id = body.get("device_id") if isinstance(body, dict) else None
    if not isinstance(device_id, str) or not tenancy.DEVICE_ID.match(device_id):
        raise unprocessable("device_id must be 1..64 characters of A-Z a-z 0-9 . _ : -")
    herd = body.get("herd")
    if herd is not None and (not isinstance(herd, str) or not tenancy.HERD.match(herd)):
        raise unprocessable("herd must be a string of at most 64 letters, digits, spaces or . _ : -")
    redis = request.app.state.redis
    token = tenancy.register_device(redis, who.farm_id, device_id, herd, with_token=True)
    # Another farm registered this id first: gateway records without farm_id go to that farm, so
    # this farm's gateways must name it (docs/api.md, "Kafka gateways")
    owner = tenancy.bare_id_owner(redis, device_id)
    return {"device_id": device_id, "herd": herd, "token": token,
            "gateway_must_send_farm_id": owner != who.farm_id, "farm_id": who.farm_id}


@router.delete("/devices/{device_id}/token", status_code=204,
               summary="Revoke a device's token at once (a new POST /v1/devices issues a new one)")
def revoke_device_token(device_id: str, request: Request, who: Principal = Depends(farm_principal)) -> Response:
    if not tenancy.revoke_device_token(request.app.state.redis, who.farm_id, device_id):
        raise not_found("device")
    return Response(status_code=204)
