"""POST /v1/reports: validate, bind to the caller's farm and device, produce to Kafka `gps.reports`."""
from __future__ import annotations

from confluent_kafka import KafkaException
from fastapi import APIRouter, Body, Depends, HTTPException, Request

from api import metrics, rate_limits, tenancy
from api.auth import Principal, principal
from ingest.producer import BrokerUnavailable
from ingest.validate import validate_report_dicts

router = APIRouter(prefix="/v1", tags=["reports"])

MAX_REPORTS = 10_000
REPORTS_EXAMPLE = {"reports": [{"device_id": "cow-17", "ts": "2026-11-22T06:00:00Z", "lat": 47.005,
                                "lon": 8.505, "battery": 87, "accuracy_m": 4.5}]}


@router.post("/reports", status_code=202,
             summary="Post GPS reports (up to 10,000 per request); invalid ones are rejected with a reason")
def post_reports(request: Request, body: dict = Body(..., examples=[REPORTS_EXAMPLE]),
                 who: Principal = Depends(principal)) -> dict:
    bucket = rate_limits.DEVICE_REPORTS if who.is_device else rate_limits.FARM_REPORTS
    decision = bucket.allow(request.app.state.redis, bucket.key(who.farm_id, who.device_id))
    if not decision.allowed:
        raise HTTPException(429, "too many report requests; batch reports or slow down",
                            headers={"Retry-After": str(decision.retry_after_s)})
    reports = body.get("reports") if isinstance(body, dict) else None
    if not isinstance(reports, list):
        raise HTTPException(422, 'body must be {"reports": [ ... ]}')
    if len(reports) > MAX_REPORTS:
        raise HTTPException(413, f"at most {MAX_REPORTS} reports per request; got {len(reports)}")
    if who.is_device:
        foreign = next((r.get("device_id") for r in reports
                        if isinstance(r, dict) and r.get("device_id") != who.device_id), None)
        if foreign is not None or any(isinstance(r, dict) and "device_id" not in r for r in reports):
            raise HTTPException(403, f"this device token may only post reports for device {who.device_id!r}")
    columns, rejected = validate_report_dicts(reports)
    accepted = columns.to_dicts(farm_id=who.farm_id)
    redis = request.app.state.redis
    if not who.is_device:
        # A gateway with the farm key may post for devices it has not registered yet: register them.
        ids = sorted({r["device_id"] for r in accepted})
        for device_id in sorted(set(ids) - tenancy.known_devices(redis, who.farm_id, ids)):
            tenancy.register_device(redis, who.farm_id, device_id, None, with_token=False)
    try:
        request.app.state.producer().send_many(accepted)
    except (BrokerUnavailable, KafkaException) as err:
        # librdkafka's idempotent producer turns fatal for good when the broker loses its state (a
        # restarted embedded broker): every later produce fails. Drop it; the next request makes a new one.
        request.app.state.producer.cache_clear()
        raise HTTPException(503, f"the report log is unavailable, nothing was accepted: {err}",
                            headers={"Retry-After": "5"}) from None
    metrics.REPORTS_ACCEPTED.inc(len(accepted))
    metrics.REPORTS_REJECTED.inc(len(rejected))
    return {"accepted": len(accepted), "rejected": [{"index": r.index, "reason": r.reason} for r in rejected]}
