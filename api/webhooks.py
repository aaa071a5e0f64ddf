"""Webhooks: a farm registers HTTP(S) URLs; every fence event is POSTed to them, signed with
HMAC-SHA256 (`X-Herdfence-Signature: sha256=<hex>` over the raw body), retried with exponential
backoff. Delivery runs in the API process on the farm's event stream through a Redis consumer group,
so it never blocks the job and several API workers never deliver the same event twice."""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import secrets
from urllib.parse import urlparse

import httpx
import orjson
from fastapi import APIRouter, Body, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from api.auth import Principal, farm_principal
from api.errors import not_found, unprocessable
from fencing.model import keys

log = logging.getLogger("herdfence.webhooks")
router = APIRouter(prefix="/v1", tags=["webhooks"])
FARMS_WITH_HOOKS = "webhooks:farms"
GROUP = "webhooks"
RETRY_DELAYS_S = (0.5, 1, 2, 4, 8, 16)


def hooks_key(farm_id: str) -> str:
    return f"webhooks:{{{farm_id}}}"


def failed_key(farm_id: str) -> str:
    return f"webhooks-failed:{{{farm_id}}}"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@router.post("/webhooks", status_code=201, summary="Register a URL for the farm's fence events (HMAC-signed POSTs)")
def create_webhook(request: Request, body: dict = Body(..., examples=[{"url": "https://example.org/hook"}]),
                   who: Principal = Depends(farm_principal)) -> dict:
    url = body.get("url") if isinstance(body, dict) else None
    parsed = urlparse(url) if isinstance(url, str) else None
    if not parsed or parsed.scheme not in ("http", "https") or not parsed.netloc or len(url) > 2000:
        raise unprocessable("url must be an absolute http:// or https:// URL")
    redis = request.app.state.redis
    hook = {"id": "wh-" + secrets.token_hex(6), "url": url, "secret": secrets.token_urlsafe(24)}
    redis.hset(hooks_key(who.farm_id), hook["id"], orjson.dumps(hook))
    try:   # deliver from now on: the consumer group starts at the stream's end
        redis.xgroup_create(keys.event_stream(who.farm_id), GROUP, id="$", mkstream=True)
    except Exception as err:   # BUSYGROUP: it exists already
        if "BUSYGROUP" not in str(err):
            raise
    redis.sadd(FARMS_WITH_HOOKS, who.farm_id)
    return hook


@router.get("/webhooks", summary="The farm's webhooks")
def list_webhooks(request: Request, who: Principal = Depends(farm_principal)) -> dict:
    raw = request.app.state.redis.hgetall(hooks_key(who.farm_id))
    return {"webhooks": [{k: v for k, v in orjson.loads(h).items() if k != "secret"} for h in raw.values()]}


@router.delete("/webhooks/{hook_id}", status_code=204, summary="Remove a webhook")
def delete_webhook(hook_id: str, request: Request, who: Principal = Depends(farm_principal)) -> Response:
    if not request.app.state.redis.hdel(hooks_key(who.farm_id), hook_id):
        raise not_found("webhook")
    return Response(status_code=204)


class Deliverer:
    """Background task of an API worker: reads each hooked farm's stream as one consumer of the group."""

    def __init__(self, redis, consumer: str | None = None):
        self.redis = redis
        self.consumer = consumer or f"api-{os.getpid()}"
        self.client = httpx.AsyncClient(timeout=5)

    async def run(self) -> None:
        while True:
            try:
                farms = await run_in_threadpool(self.redis.smembers, FARMS_WITH_HOOKS)
                busy = False
                for farm_id in sorted(farms):
                    busy |= await self._deliver_farm(farm_id)
                if not busy:
                    await asyncio.sleep(0.5)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook delivery loop error; continuing")
                await asyncio.sleep(2)

    async def _deliver_farm(self, farm_id: str) -> bool:
        stream = keys.event_stream(farm_id)
        entries = await run_in_threadpool(self.redis.xreadgroup, GROUP, self.consumer, {stream: ">"}, 100)
        if not entries:
            return False
        hooks = [orjson.loads(h) for h in (await run_in_threadpool(self.redis.hgetall, hooks_key(farm_id))).values()]
        for entry_id, fields in entries[0][1]:
            body = fields["event"].encode()
            await asyncio.gather(*(self._post(farm_id, hook, body) for hook in hooks))
            await run_in_threadpool(self.redis.xack, stream, GROUP, entry_id)
        return True

    async def _post(self, farm_id: str, hook: dict, body: bytes) -> None:
        headers = {"content-type": "application/json", "x-herdfence-signature": sign(hook["secret"], body)}
        for delay in RETRY_DELAYS_S:
            try:
                resp = await self.client.post(hook["url"], content=body, headers=headers)
                if resp.status_code < 300:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(delay)
        await run_in_threadpool(self.redis.lpush, failed_key(farm_id), orjson.dumps(
            {"webhook": hook["id"], "event": orjson.loads(body)}))
