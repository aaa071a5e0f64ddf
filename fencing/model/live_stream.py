"""A farm's live event stream (`evstream:{farm}`, a Redis stream): what its entries hold and the ids the
API gives the events in them.

The event log's writer (fencing.stream.sinks) adds one entry per write call that logged new events
(more for more than ENTRY_EVENTS): field `events`, the new events' public JSON in time order, one per
line (compact JSON holds no raw line break). An XADD per event was ~2.4 µs of Redis CPU more per
event, with the AOF on (measured 2026-11-28 with the writer's script on a standalone redis-server, 16
events a call); a sparse herd's batch logs ~150k events. Entries written one event each (field
`event`) read the same way.

An entry holds at most ENTRY_EVENTS events (a write call with more adds several entries), so a reader
that takes N entries at a time takes at most N x ENTRY_EVENTS events into its bounded queues. The live
streams (api/event_hub.py) and webhooks (api/webhooks.py) read entries and hand out their events one
by one; an SSE event's id is its entry's id and its place in the entry (`<entry>.<k>`), so a browser
that reconnects with Last-Event-ID resumes inside an entry, where it stopped.
"""
from __future__ import annotations

import re

FIELD = "events"
ENTRY_EVENTS = 100    # events per entry at most
MAXLEN = 100_000      # entries kept (an approximate trim), each of 1 to ENTRY_EVENTS events

# an SSE event id: the entry's stream id, optionally `.k` (the k-th event of the entry, from 0)
EVENT_ID = re.compile(r"(\d{1,20}-\d{1,20})(?:\.(\d{1,5}))?")


def entry_events(fields: dict) -> list[str]:
    """The events of one stream entry as JSON text, in order (a trimmed entry: none). `fields` as a
    client returns them, decoded or not."""
    for name in (FIELD, FIELD.encode()):
        if name in fields:
            value = fields[name]
            return (value if isinstance(value, str) else value.decode()).split("\n")
    one = fields.get("event", fields.get(b"event"))          # an entry written one event each
    if one is None:
        return []
    return [one if isinstance(one, str) else one.decode()]


def event_id(entry_id: str, k: int) -> str:
    return f"{entry_id}.{k}"


def parse_event_id(text: str) -> tuple[str, int] | None:
    """(entry id, index of the last event seen in that entry) or None when `text` is not an id. A bare
    entry id (one given out before entries held several events) means the whole entry was seen."""
    m = EVENT_ID.fullmatch(text)
    if m is None:
        return None
    return m.group(1), int(m.group(2)) if m.group(2) is not None else 1 << 30
