"""Webhooks: a farm registers HTTP(S) URLs (public addresses only, api/webhook_targets.py); every
fence event is POSTed to them, signed with HMAC-SHA256 and retried with exponential backoff.

Signatures: `X-Herdfence-Timestamp: <unix seconds>` and `X-Herdfence-Signature-256: sha256=<hex>`
over `<timestamp>.<raw body>` — a receiver that checks the timestamp is recent cannot be fooled by a
captured request replayed later. (`X-Herdfence-Signature: sha256=<hex>` over the body alone is still
sent for receivers written before.)

Delivery runs in the API workers on each farm's event stream through a Redis consumer group, so it
never blocks the job and several workers never deliver the same event twice; each farm has its own
task, so one slow or dead receiver never delays another farm; entries a crashed worker had read
but not acknowledged are claimed again after a minute. A farm has at most MAX_HOOKS webhooks."""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import secrets
import time

import httpx
import orjson
from fastapi import APIRouter, Body, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from api import webhook_targets
from api.auth import Principal, farm_principal
from api.errors import not_found, unprocessable
from fencing.model import keys, live_stream

log = logging.getLogger("herdfence.webhooks")
router = APIRouter(prefix="/v1", tags=["webhooks"])
FARMS_WITH_HOOKS = "webhooks:farms"
GROUP = "webhooks"
RETRY_DELAYS_S = (0.5, 1, 2, 4, 8, 16)
MAX_HOOKS = 10
CLAIM_IDLE_MS = 60_000          # a pending entry this old belonged to a worker that died
FAILED_KEEP = 1000              # failed deliveries kept per farm (newest)


def hooks_key(farm_id: str) -> str:
    return f"webhooks:{{{farm_id}}}"


def failed_key(farm_id: str) -> str:
    return f"webhooks-failed:{{{farm_id}}}"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signed_headers(secret: str, body: bytes, now: float | None = None) -> dict[str, str]:
    stamp = str(int(time.time() if now is None else now))
    return {"content-type": "application/json", "x-herdfence-timestamp": stamp,
            "x-herdfence-signature-256": sign(secret, stamp.encode() + b"." + body),
            "x-herdfence-signature": sign(secret, body)}


@router.post("/webhooks", status_code=201, summary="Register a URL for the farm's fence events (HMAC-signed POSTs)")
def create_webhook(request: Request, body: dict = Body(..., examples=[{"url": "https://example.org/hook"}]),
                   who: Principal = Depends(farm_principal)) -> dict:
    url = body.get("url") if isinstance(body, dict) else None
    try:
        url = webhook_targets.check(url, request.app.state.settings.webhook_allow_private)
    except webhook_targets.TargetRefused as err:
        raise unprocessable(str(err)) from None
    redis = request.app.state.redis
    if redis.hlen(hooks_key(who.farm_id)) >= MAX_HOOKS:
        raise unprocessable(f"a farm has at most {MAX_HOOKS} webhooks; delete one first")
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
    redis = request.app.state.redis
    if not redis.hdel(hooks_key(who.farm_id), hook_id):
        raise not_found("webhook")
    if not redis.hlen(hooks_key(who.farm_id)):
        redis.delete(failed_key(who.farm_id))    # no webhook left: its failures concern nobody any more
    return Response(status_code=204)


class Deliverer:
    """Background task of an API worker: reads each hooked farm's stream as one consumer of the group."""

    def __init__(self, redis, consumer: str | None = None, allow_private: bool = False):
        self.redis = redis
        self.consumer = consumer or f"api-{os.getpid()}"
        self.allow_private = allow_private
        # never follows redirects: a 3xx is a failed delivery, not a way around the target check.
        # Connections are pooled by address: over plain HTTP one may carry several names' deliveries,
        # but a TLS connection is verified for one name, so HTTPS deliveries each get their own.
        self.client = httpx.AsyncClient(timeout=5, follow_redirects=False)
        self.tls_client = httpx.AsyncClient(timeout=5, follow_redirects=False,
                                            limits=httpx.Limits(max_keepalive_connections=0))
        self.farms: dict[str, asyncio.Task] = {}

    async def run(self) -> None:
        """One delivery task per hooked farm (started here, ended when the farm has no hooks)."""
        while True:
            try:
                farms = await run_in_threadpool(self.redis.smembers, FARMS_WITH_HOOKS)
                for farm_id in farms:
                    task = self.farms.get(farm_id)
                    if task is None or task.done():
                        self.farms[farm_id] = asyncio.create_task(self._farm_loop(farm_id))
                await asyncio.sleep(2)
            except asyncio.CancelledError:
                for task in self.farms.values():
                    task.cancel()
                raise
            except Exception:
                log.exception("webhook delivery loop error; continuing")
                await asyncio.sleep(2)

    async def _farm_loop(self, farm_id: str) -> None:
        while True:
            try:
                hooks = [orjson.loads(h) for h in
                         (await run_in_threadpool(self.redis.hgetall, hooks_key(farm_id))).values()]
                if not hooks:
                    await run_in_threadpool(self.redis.srem, FARMS_WITH_HOOKS, farm_id)
                    return
                if not await self._deliver_farm(farm_id, hooks):
                    await asyncio.sleep(0.5)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - Redis trouble: this farm waits, the others go on
                log.warning("webhook delivery for %s: %s; retrying", farm_id, err)
                await asyncio.sleep(2)

    async def _deliver_farm(self, farm_id: str, hooks: list[dict]) -> bool:
        stream = keys.event_stream(farm_id)
        # first what a dead worker had read and never acknowledged, then what is new
        claimed = await run_in_threadpool(self.redis.xautoclaim, stream, GROUP, self.consumer, CLAIM_IDLE_MS,
                                          "0-0", 10)
        todo = claimed[1] if claimed and claimed[1] else None
        if not todo:
            entries = await run_in_threadpool(self.redis.xreadgroup, GROUP, self.consumer, {stream: ">"}, 10)
            todo = entries[0][1] if entries else None
        if not todo:
            return False
        for entry_id, fields in todo:
            # an entry holds one write's new events, in time order (a trimmed one comes back empty)
            for event in live_stream.entry_events(fields):
                body = event.encode()
                await asyncio.gather(*(self._post(farm_id, hook, body) for hook in hooks))
            await run_in_threadpool(self.redis.xack, stream, GROUP, entry_id)
        return True

    async def send(self, url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        """POST to the address the target check passed (resolved once, here), never to whatever the
        name resolves to by the time the connection opens."""
        target = await run_in_threadpool(webhook_targets.pin, url, self.allow_private)
        client = self.tls_client if target.server_name else self.client
        return await client.post(target.url, content=body, headers={**headers, "host": target.host},
                                 extensions=target.extensions)

    async def _post(self, farm_id: str, hook: dict, body: bytes) -> None:
        problem = ""
        for delay in RETRY_DELAYS_S:
            try:
                resp = await self.send(hook["url"], body, signed_headers(hook["secret"], body))
                if resp.status_code < 300:
                    return
                problem = f"HTTP {resp.status_code}"
            except webhook_targets.Unresolvable as err:
                problem = str(err)           # DNS trouble may pass: try again
            except webhook_targets.TargetRefused as err:
                problem = str(err)
                break                        # re-pointed at a private address: do not try again
            except httpx.HTTPError as err:
                problem = type(err).__name__
            await asyncio.sleep(delay)
        await run_in_threadpool(record_failure, self.redis, farm_id, hook["id"], problem, body)


def record_failure(redis, farm_id: str, hook_id: str, reason: str, body: bytes, keep: int = FAILED_KEEP) -> None:
    """A delivery that failed for good, kept for the operator: the newest `keep` per farm (pushed and
    trimmed in one round trip, so the list never holds more)."""
    failed = failed_key(farm_id)
    pipe = redis.pipeline()
    pipe.lpush(failed, orjson.dumps({"webhook": hook_id, "reason": reason, "event": orjson.loads(body)}))
    pipe.ltrim(failed, 0, keep - 1)
    pipe.execute()
