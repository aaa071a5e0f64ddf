"""Listening for change notices (fencing/model/notify.py) in every API worker and dropping cached entries.

Each worker caches what it can answer again cheaply only while it hears every notice. In a Redis
Cluster a PUBLISH reaches subscribers on every node, so a worker listens on one node and moves to the
next when that node goes away. While a worker is not listening its caches are trusted for a short
time only (`fresh_for`), and whenever the subscription breaks every cache is cleared (a notice may
have been missed in between).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.asyncio import Redis as AsyncRedis

from fencing.model import notify

log = logging.getLogger("herdfence.invalidation")
# kind → handlers(farm_ids); farm_ids is None for "everything"
_handlers: dict[str, list[Callable[[list[str] | None], None]]] = {}
_listening = False


def on(kind: str, handler: Callable[[list[str] | None], None]) -> None:
    _handlers.setdefault(kind, []).append(handler)


def listening() -> bool:
    return _listening


def fresh_for(long_s: float, short_s: float) -> float:
    """How long a cached entry may be trusted: long while notices arrive, short otherwise."""
    return long_s if _listening else short_s


def dispatch(message: str) -> None:
    kind, farms = notify.parse(message)
    for handler in _handlers.get(kind, []):
        handler(farms or None)


def _drop_everything() -> None:
    for handlers in _handlers.values():
        for handler in handlers:
            handler(None)


async def listen(nodes: list[tuple[str, int]], retry_s: float = 1.0) -> None:
    """Run for the worker's lifetime: subscribe, dispatch, and on any failure clear every cache and
    try the next node."""
    global _listening
    attempt = 0
    while True:
        host, port = nodes[attempt % len(nodes)]
        attempt += 1
        client = AsyncRedis(host=host, port=port, decode_responses=True, socket_connect_timeout=2)
        try:
            async with client.pubsub() as sub:
                await sub.subscribe(notify.CHANNEL)
                _drop_everything()          # anything cached before now was not covered by notices
                _listening = True
                async for item in sub.listen():
                    if item.get("type") == "message":
                        dispatch(item["data"])
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - any failure: stop trusting the caches, reconnect
            log.warning("invalidation channel lost on %s:%d (%s); retrying", host, port, err)
        finally:
            _listening = False
            _drop_everything()
            await client.aclose()
        await asyncio.sleep(retry_s)
