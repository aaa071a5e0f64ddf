"""fencing/model/live_stream.py: the events of a live stream entry and the SSE ids that point into it."""
from __future__ import annotations

import asyncio

from api.event_hub import EventHub, _Feed
from fencing.model import live_stream


def test_an_entry_holds_its_events_in_order_whatever_its_form():
    assert live_stream.entry_events({"events": '{"a":1}\n{"b":2}'}) == ['{"a":1}', '{"b":2}']
    assert live_stream.entry_events({b"events": b'{"a":1}'}) == ['{"a":1}']
    assert live_stream.entry_events({"event": '{"old":1}'}) == ['{"old":1}']      # one event an entry
    assert live_stream.entry_events({}) == []                                      # trimmed


def test_event_ids_name_the_entry_and_the_place_in_it():
    assert live_stream.event_id("1764223200123-0", 2) == "1764223200123-0.2"
    assert live_stream.parse_event_id("1764223200123-0.2") == ("1764223200123-0", 2)
    entry, k = live_stream.parse_event_id("1764223200123-4")          # a bare entry: all of it seen
    assert entry == "1764223200123-4" and k > 10_000
    for bad in ("not-an-id", "1-2.x", "1764223200123", "1-2.3.4", ""):
        assert live_stream.parse_event_id(bad) is None


class _Stream:
    """XRANGE over fixed entries, as a Redis client answers it (inclusive bounds)."""

    def __init__(self, entries: list[tuple[str, dict]]) -> None:
        self.entries = entries

    async def xrange(self, key, lo, hi, count):  # noqa: ANN001
        def at(i: str) -> tuple[int, int]:
            ms, _, seq = i.partition("-")
            return int(ms), int(seq)
        return [(i, f) for i, f in self.entries if at(lo) <= at(i) <= at(hi)][:count]


def _resume(last_id: str, entries: list | None = None, queue_max: int = 1000) -> list[tuple[str, str]]:
    entries = entries or [("5-0", {"events": "a\nb\nc"}), ("6-0", {"events": "d"}), ("7-0", {"event": "e"})]
    hub = EventHub(_Stream(entries), queue_max=queue_max)
    hub.feeds["farm"] = _Feed(entries[-1][0])

    async def run():
        sub = await hub.subscribe("farm", last_id)
        got = []
        while not sub.queue.empty():
            frame = sub.queue.get_nowait().decode()
            got.append((frame.split("\n")[0][4:], frame.split("data: ")[1].strip()))
        return got
    return asyncio.run(run())


def test_a_reconnect_resumes_after_the_last_event_seen_even_inside_an_entry():
    assert _resume("5-0.0") == [("5-0.1", "b"), ("5-0.2", "c"), ("6-0.0", "d"), ("7-0.0", "e")]
    assert _resume("5-0.2") == [("6-0.0", "d"), ("7-0.0", "e")]
    assert _resume("5-0") == [("6-0.0", "d"), ("7-0.0", "e")]        # an id from one event an entry
    assert _resume("7-0.0") == []
    assert _resume("8-0.0") == []                                      # ahead of the stream: nothing


def test_a_long_absence_catches_up_as_much_as_the_queue_holds_oldest_first():
    per = live_stream.ENTRY_EVENTS
    entries = [(f"{10 + e}-0", {"events": "\n".join(f"e{e}.{i}" for i in range(per))}) for e in range(30)]
    got = _resume("9-0.0", entries, queue_max=250)
    assert len(got) == 250
    assert got[0] == ("10-0.0", "e0.0") and got[-1] == (f"12-0.{249 - 2 * per}", f"e2.{249 - 2 * per}")
