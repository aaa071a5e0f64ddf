"""Live event streams at scale (api/event_hub.py): many open maps share one reader per API worker,
each gets every event of its farm and none of another's; per-farm caps answer 429; a reconnect with
Last-Event-ID catches up; the rest of the API keeps answering while the streams are open."""
from __future__ import annotations

import asyncio
import json

import httpx

from tests.farmkit import Farm, square

INSIDE, INSIDE2, OUTSIDE = (8.505, 47.005), (8.506, 47.006), (8.505, 47.05)


async def _stream(client: httpx.AsyncClient, key: str, want: int, ready: asyncio.Semaphore) -> tuple[int, list]:
    """One open map: its status, then its first `want` events."""
    got: list[dict] = []
    async with client.stream("GET", "/v1/events/stream", headers={"Authorization": f"Bearer {key}"}) as resp:
        ready.release()
        if resp.status_code != 200:
            return resp.status_code, got
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                got.append(json.loads(line[5:]))
                if len(got) >= want:
                    break
    return 200, got


def test_many_streams_one_farm_each_gets_every_event_and_no_other_farms(stack):
    farm, other = Farm(stack, "streams"), Farm(stack, "neighbour")
    fence_id = farm.fence(square(8.50, 47.00))
    other.fence(square(8.50, 47.00))
    farm.device("s-cow")
    other.device("n-cow")

    async def scenario():
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=stack.api_url, limits=limits, timeout=60) as c:
            ready = asyncio.Semaphore(0)
            # 40: the per-farm cap of one API worker (HERDFENCE_STREAMS_PER_FARM), so the test holds
            # however the kernel spreads the connections over the workers
            mine = [asyncio.create_task(_stream(c, farm.key, 2, ready)) for _ in range(40)]
            theirs = [asyncio.create_task(_stream(c, other.key, 1, ready)) for _ in range(5)]
            for _ in range(45):
                await asyncio.wait_for(ready.acquire(), 30)
            # with 45 streams open, the rest of the API answers
            r = await c.get("/v1/fences", headers={"Authorization": f"Bearer {farm.key}"})
            assert r.status_code == 200 and r.json()["features"][0]["id"] == fence_id
            await asyncio.to_thread(farm.report, "s-cow", INSIDE, INSIDE2, OUTSIDE, OUTSIDE)
            results = await asyncio.wait_for(asyncio.gather(*mine), 60)
            await asyncio.sleep(2)                      # the neighbour's streams had time to (wrongly) see it
            leaked = [t.result()[1] for t in theirs if t.done()]
            for t in theirs:
                t.cancel()
            return [st for st, _ in results], [g for _, g in results], leaked

    statuses, got, leaked = asyncio.run(scenario())
    assert statuses.count(200) == 40, statuses
    for events in got:
        assert [(e["type"], e["device_id"], e["fence_id"]) for e in events] == \
            [("enter", "s-cow", fence_id), ("exit", "s-cow", fence_id)], events
    assert not any(leaked), "a neighbour's stream saw another farm's events"


def test_streams_per_farm_are_capped(stack):
    """The session stack runs with HERDFENCE_STREAMS_PER_FARM=40 per API worker (2 workers)."""
    farm = Farm(stack, "capped")

    async def scenario():
        limits = httpx.Limits(max_connections=120, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=stack.api_url, limits=limits, timeout=30) as c:
            streams = [c.stream("GET", "/v1/events/stream", headers={"Authorization": f"Bearer {farm.key}"})
                       for _ in range(100)]
            opened = [await s.__aenter__() for s in streams]
            codes = [r.status_code for r in opened]
            tail = opened[[i for i, code in enumerate(codes) if code == 429][0]] if 429 in codes else None
            detail = (await tail.aread()).decode() if tail is not None else ""
            for s in streams:
                await s.__aexit__(None, None, None)
            return codes, detail, tail.headers.get("retry-after") if tail is not None else None
    codes, detail, retry_after = asyncio.run(scenario())
    assert codes.count(429) >= 20 and codes.count(200) >= 40, codes
    assert "live streams" in detail and retry_after
    # closed streams free their places
    async def again():
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as c:
            async with c.stream("GET", "/v1/events/stream", headers={"Authorization": f"Bearer {farm.key}"}) as r:
                return r.status_code
    assert asyncio.run(again()) == 200


def test_reconnect_with_last_event_id_catches_up(stack):
    farm = Farm(stack, "resume")
    farm.fence(square(8.50, 47.00))
    farm.device("r-cow")
    farm.report("r-cow", INSIDE, INSIDE2, OUTSIDE, OUTSIDE, INSIDE, INSIDE2)
    events = farm.wait_events(3, device_id="r-cow")
    first_id = None
    # a resume from the very start replays the farm's stream, with its ids
    with farm.api.stream("GET", "/v1/events/stream", headers={"Last-Event-ID": "0-0"}, timeout=30) as sse:
        seen = []
        for line in sse.iter_lines():
            if line.startswith("id:"):
                first_id = first_id or line[3:].strip()
            if line.startswith("data:"):
                seen.append(json.loads(line[5:])["type"])
                if len(seen) == 3:
                    break
    assert seen == [e["type"] for e in events[:3]] == ["enter", "exit", "enter"]
    with farm.api.stream("GET", "/v1/events/stream", headers={"Last-Event-ID": first_id}, timeout=30) as sse:
        rest = []
        for line in sse.iter_lines():
            if line.startswith("data:"):
                rest.append(json.loads(line[5:])["type"])
                if len(rest) == 2:
                    break
    assert rest == ["exit", "enter"]
    assert farm.api.get("/v1/events/stream", headers={"Last-Event-ID": "not-an-id"}).status_code == 422


def test_the_change_notice_comes_after_the_events_so_no_poll_is_waited_for(stack):
    """The job's task announces a farm once its events are in the farm's stream: a hub that only
    polls every 2 minutes gets the event from the notice alone (announced before the events, the
    read it triggers found nothing and the event waited for the poll)."""
    from api import invalidation
    from api.event_hub import EventHub
    from fencing.model import notify
    from fencing.model.redis_conn import async_cluster

    farm = Farm(stack, "notice order")
    fence_id = farm.fence(square(8.50, 47.00))
    farm.device("cow-n")

    async def main() -> bytes:
        hub = EventHub(async_cluster(*stack.settings.redis_node), poll_s=240)
        invalidation.on(notify.LIVE, hub.changed)
        tasks = [asyncio.create_task(invalidation.listen(stack.settings.redis_nodes)), asyncio.create_task(hub.run())]
        try:
            sub = await hub.subscribe(farm.farm_id, None)
            for _ in range(100):
                if invalidation.listening():
                    break
                await asyncio.sleep(0.1)
            await asyncio.to_thread(farm.report, "cow-n", INSIDE, INSIDE2)
            return await asyncio.wait_for(sub.queue.get(), 60)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    frame = asyncio.run(main())
    event = json.loads(frame.decode().split("data: ", 1)[1])
    assert (event["type"], event["fence_id"], event["device_id"]) == ("enter", fence_id, "cow-n")
