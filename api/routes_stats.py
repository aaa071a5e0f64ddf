"""Farm statistics computed from the event log: time in paddock (`GET /v1/time-in-fence`)."""
from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from api import tenancy, time_in_fence
from api.auth import Principal, farm_principal
from api.errors import not_found, unprocessable
from fencing.model import fence_store
from fencing.model.timeutil import MIN_MS, iso, to_ms

router = APIRouter(prefix="/v1", tags=["queries"])

DEFAULT_SPAN_MS = 24 * 3600 * 1000
MAX_SPAN_MS = 366 * 24 * 3600 * 1000


class TimeInFence(BaseModel):
    device_id: str
    fence_id: str
    seconds: float = Field(description="seconds inside the fence within the period (up to now)")
    stays: int = Field(description="stays (enter … exit) that overlap the period")
    inside_now: bool = Field(description="still inside at the end of the period")


class TimeInFenceAnswer(BaseModel):
    from_: str = Field(alias="from", description="start of the period, ISO 8601 UTC")
    to: str = Field(description="end of the period, ISO 8601 UTC")
    seconds: float = Field(description="length of the period that has passed (to, or now if earlier, minus from)")
    items: list[TimeInFence] = Field(description="one row per animal and fence that was inside during the "
                                                 "period, by fence then longest first")

    model_config = {"populate_by_name": True}


def _time(name: str, value: str | None, default: int) -> int:
    if value is None:
        return default
    try:
        return to_ms(value)
    except ValueError as err:
        raise unprocessable(f"{name}: {err}") from None


@router.get("/time-in-fence", response_model=TimeInFenceAnswer, response_model_by_alias=True,
            summary="Time each animal spent inside each fence over a period (from the event log; "
                    "default: the last 24 h)")
def get_time_in_fence(
        request: Request,
        from_: str | None = Query(None, alias="from", description="ISO 8601 or epoch ms; default: to − 24 h"),
        to: str | None = Query(None, description="ISO 8601 or epoch ms; default: now"),
        fence_id: str | None = Query(None, max_length=200, description="only this fence"),
        device_id: str | None = Query(None, max_length=200, description="only this animal"),
        who: Principal = Depends(farm_principal)) -> dict:
    now_ms = int(time.time() * 1000)
    to_ms_ = _time("to", to, now_ms)
    # the default period must not start before year 1 (an answer could not name its start)
    from_ms = _time("from", from_, max(MIN_MS, to_ms_ - DEFAULT_SPAN_MS))
    if from_ms >= to_ms_:
        raise unprocessable("from: must be before to")
    if to_ms_ - from_ms > MAX_SPAN_MS:
        raise unprocessable("from: the period may span at most 366 days")
    redis = request.app.state.redis
    if fence_id is not None and fence_store.load_fence(redis, who.farm_id, fence_id) is None:
        raise not_found("fence")
    if device_id is not None and tenancy.device_record(redis, who.farm_id, device_id) is None:
        raise not_found("device")
    try:
        stays = time_in_fence.time_inside(
            time_in_fence.events_until(redis, who.farm_id, to_ms_, fence_id=fence_id, device_id=device_id),
            from_ms, to_ms_, now_ms)
    except time_in_fence.TooManyEvents as err:
        raise unprocessable(str(err)) from None
    return {"from": iso(from_ms), "to": iso(to_ms_), "seconds": max(0, min(to_ms_, now_ms) - from_ms) / 1000,
            "items": [{"device_id": s.device_id, "fence_id": s.fence_id, "seconds": round(s.seconds, 3),
                       "stays": s.stays, "inside_now": s.inside_now} for s in stays]}
