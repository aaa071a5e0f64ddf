"""Live fence events for every open stream of an API worker, read once per farm.

A farmer's open map holds one `GET /v1/events/stream`. Each worker keeps ONE feed per farm that has
open streams: a cursor in the farm's event stream (Redis), read with a non-blocking XREAD on the
asyncio cluster client when a change notice names the farm (api/invalidation.py: the job's tasks
announce the farms they wrote after every micro-batch, once their events are in the farm's stream)
and, for a farm nothing read for `poll_s` (30 s, spread over the period), then anyway: a safety net
(notices come after the events, and a broken subscription reads every feed when it is back,
api/invalidation.py). What is read is
rendered once as an SSE frame and that frame is put on each stream's own bounded queue. No thread
and no blocking Redis call per stream: 2,000 open maps cost 2,000 small queues and, per micro-batch,
one read per farm that changed.

A stream whose queue is full (a client that does not read) is dropped, not buffered without bound;
its browser reconnects with Last-Event-ID and catches up from the farm's stream. Streams per farm
and per worker are capped (429 beyond).
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import math
import random
import time
from dataclasses import dataclass, field

from fencing.model import keys, live_stream

log = logging.getLogger("herdfence.events")
READ_COUNT = 5         # stream entries a read takes: at most 500 events (live_stream.ENTRY_EVENTS each)
# The safety net's period: notices are the way events reach a feed, and a broken subscription reads
# every feed once it is back (api/invalidation.py), so this only covers a notice lost on a healthy
# connection. Its reads are spread over the period, never one burst: 834 farms' feeds read at once
# every 5 s stalled a worker's event loop (and every request waiting on it) for ~0.1 s.
POLL_S = 30.0
TICK_S = 0.5
REDIS_CALLS_AT_ONCE = 32     # 2,000 maps opened at once must not open 2,000 Redis connections at once


class TooManyStreams(Exception):
    pass


@dataclass(eq=False)
class Subscriber:
    farm_id: str
    queue: asyncio.Queue
    dropped: bool = False


@dataclass(eq=False)
class _Feed:
    cursor: str
    subscribers: set[Subscriber] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    read_at: float = 0.0                 # monotonic time of the last read


class EventHub:
    def __init__(self, aredis, per_farm: int = 100, per_worker: int = 5000, queue_max: int = 1000,
                 poll_s: float = POLL_S) -> None:
        self.aredis = aredis
        self.per_farm, self.per_worker, self.queue_max, self.poll_s = per_farm, per_worker, queue_max, poll_s
        self.feeds: dict[str, _Feed] = {}
        self._due: set[str] = set()
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(REDIS_CALLS_AT_ONCE)

    async def _redis(self, method: str, *args, **kwargs):
        """A Redis call of the hub, a bounded number at a time, tried up to three times: a burst of new
        streams (every map of a region reconnecting after a restart) must not turn into errors."""
        for attempt in range(3):
            async with self._slots:
                try:
                    return await getattr(self.aredis, method)(*args, **kwargs)
                except Exception as err:  # noqa: BLE001 - connection trouble: a short pause, then again
                    if attempt == 2:
                        log.warning("live events: %s failed three times: %r", method, err)
                        raise
            await asyncio.sleep(0.1 * (attempt + 1))

    @property
    def streams(self) -> int:
        return sum(len(f.subscribers) for f in self.feeds.values())

    # --- streams ---------------------------------------------------------------------------------
    async def subscribe(self, farm_id: str, last_id: str | None) -> Subscriber:
        feed = self.feeds.get(farm_id)
        if self.streams >= self.per_worker:
            raise TooManyStreams(f"this server holds {self.per_worker} live streams already")
        if feed is not None and len(feed.subscribers) >= self.per_farm:
            raise TooManyStreams(f"this farm has {self.per_farm} live streams open already")
        if feed is None:
            newest = await self._redis("xrevrange", keys.event_stream(farm_id), "+", "-", 1)
            feed = self.feeds.setdefault(farm_id, _Feed(newest[0][0] if newest else "0-0"))
        sub = Subscriber(farm_id, asyncio.Queue(self.queue_max))
        async with feed.lock:        # the hub does not move the cursor while we catch up
            seen = live_stream.parse_event_id(last_id) if last_id else None
            if seen is not None and not _before(feed.cursor, seen[0]):
                entry, k = seen
                # as many missed events as its queue holds, oldest first (a longer absence loses the rest);
                # entries enough to fill it, the first of them perhaps seen in part
                missed = await self._redis("xrange", keys.event_stream(farm_id), entry, feed.cursor,
                                           self.queue_max // live_stream.ENTRY_EVENTS + 2)
                for entry_id, fields in missed:
                    for i, event in enumerate(live_stream.entry_events(fields)):
                        if (entry_id != entry or i > k) and not sub.queue.full():
                            sub.queue.put_nowait(frame(live_stream.event_id(entry_id, i), event))
            feed.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        feed = self.feeds.get(sub.farm_id)
        if feed is None:
            return
        feed.subscribers.discard(sub)
        if not feed.subscribers and not feed.lock.locked():
            del self.feeds[sub.farm_id]

    # --- the reader ------------------------------------------------------------------------------
    def changed(self, farms: list[str] | None) -> None:
        """Change notice handler: read these farms (None: every farm) now."""
        self._due.update(self.feeds if farms is None else (f for f in farms if f in self.feeds))
        self._wake.set()

    async def run(self) -> None:
        """For the worker's lifetime."""
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=TICK_S)
            except asyncio.TimeoutError:
                pass
            due, self._due = self._due, set()
            self._wake.clear()
            due.update(self._stale_share())
            if due:
                await asyncio.gather(*(self._read(f) for f in due if f in self.feeds))

    def _stale_share(self) -> list[str]:
        """The periodic read, in case a notice was lost: of the feeds nothing has read for poll_s, the
        oldest, a tick's share of all feeds at most (each feed read about once per poll_s)."""
        stale = time.monotonic() - self.poll_s
        share = max(1, math.ceil(len(self.feeds) * TICK_S / self.poll_s))
        return heapq.nsmallest(share, (f for f, feed in self.feeds.items() if feed.read_at < stale),
                               key=lambda f: self.feeds[f].read_at)

    async def _read(self, farm_id: str) -> None:
        feed = self.feeds.get(farm_id)
        if feed is None:
            return
        async with feed.lock:
            feed.read_at = time.monotonic()
            try:
                batch = await self._redis("xread", {keys.event_stream(farm_id): feed.cursor}, count=READ_COUNT)
            except Exception as err:  # noqa: BLE001 - a failover: the next pass reads again
                log.warning("live events of %s: %s", farm_id, err)
                return
            entries = batch[0][1] if batch else []
            for entry_id, fields in entries:
                feed.cursor = entry_id
                for i, event in enumerate(live_stream.entry_events(fields)):
                    # rendered once for all of the farm's streams
                    data = frame(live_stream.event_id(entry_id, i), event)
                    for sub in list(feed.subscribers):
                        try:
                            sub.queue.put_nowait(data)
                        except asyncio.QueueFull:
                            sub.dropped = True                 # a client that does not read: let it go
                            feed.subscribers.discard(sub)
                            sub.queue = asyncio.Queue(1)
                            sub.queue.put_nowait(None)
        if len(entries) == READ_COUNT:
            self._due.add(farm_id)                          # more are waiting
            self._wake.set()
        if not feed.subscribers:
            self.feeds.pop(farm_id, None)


def frame(event_id: str, event: str) -> bytes:
    """One event as an SSE frame."""
    return f"id: {event_id}\nevent: fence\ndata: {event}\n\n".encode()


def _before(a: str, b: str) -> bool:
    """Stream ids `ms-seq`: is a older than b?"""
    try:
        ams, _, aseq = a.partition("-")
        bms, _, bseq = b.partition("-")
        return (int(ams), int(aseq or 0)) < (int(bms), int(bseq or 0))
    except ValueError:
        return False


async def frames(hub: EventHub, sub: Subscriber, is_disconnected, keepalive_s: float = 15.0):
    """SSE frames for one stream. The first keep-alive comes after a random part of the period, so
    that maps opened together (a region's after a restart) do not wake together every period."""
    yield b": connected\n\n"
    wait_s = keepalive_s * random.uniform(0.5, 1.0)
    try:
        while not sub.dropped or not sub.queue.empty():
            try:
                item = await asyncio.wait_for(sub.queue.get(), timeout=wait_s)
            except asyncio.TimeoutError:
                wait_s = keepalive_s
                if await is_disconnected():
                    return
                yield b": keep-alive\n\n"
                continue
            if item is None:
                return
            yield item
    finally:
        hub.unsubscribe(sub)
