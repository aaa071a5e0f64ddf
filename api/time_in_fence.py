"""Time in paddock: how long each animal was inside each fence over a period, from the farm's event log.

The log holds transitions, not positions: ENTER opens a stay, EXIT closes it; APPROACH and DWELL are only
emitted for a device inside, so they (re)open a stay whose ENTER fell out of the retained log. A stay open
at the period's start is counted from the start; one still open at its end runs to the end (or to now,
whichever is earlier: the future is not counted)."""
from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from fencing.model import event_index

MAX_SCANNED = 500_000     # events read per request at most (the log keeps 30 days by default)
OPENS = frozenset({"enter", "approach", "dwell"})
CLOSES = frozenset({"exit"})


class TooManyEvents(Exception):
    pass


@dataclass
class Stay:
    device_id: str
    fence_id: str
    seconds: float = 0.0
    stays: int = 0                       # stays overlapping the period
    inside_now: bool = False             # still inside at the period's end
    _open_ms: int | None = field(default=None, repr=False)


def events_until(redis, farm_id: str, to_ms: int, *, fence_id: str | None, device_id: str | None):
    """(event time ms, event) of the farm's retained events up to `to_ms`, oldest first, filtered (a
    fence or device filter reads its index: fencing.model.event_index)."""
    scanned = 0
    for score, raw in event_index.scan(redis, farm_id, fence_id=fence_id, device_id=device_id,
                                       forward=True, hi=to_ms):
        scanned += 1
        if scanned > MAX_SCANNED:
            raise TooManyEvents(f"more than {MAX_SCANNED} events before 'to': choose a fence_id or device_id")
        event = orjson.loads(raw)
        if event.get("fence_id") is None or event.get("device_id") is None:
            continue           # e.g. a silent collar: no membership change
        yield int(float(score)), event


def time_inside(events, from_ms: int, to_ms: int, now_ms: int) -> list[Stay]:
    """Fold ordered (ms, event) pairs into one Stay per (device, fence) that was inside during
    [from_ms, to_ms]; pairs never inside in the period are left out."""
    end_ms = min(to_ms, now_ms)
    found: dict[tuple[str, str], Stay] = {}

    def close(stay: Stay, at_ms: int) -> None:
        start, stop = max(stay._open_ms, from_ms), min(at_ms, end_ms)
        if stop > start or (stop == start and stay._open_ms >= from_ms):
            stay.seconds += max(0, stop - start) / 1000
            stay.stays += 1
        stay._open_ms = None

    for at_ms, event in events:
        kind = str(event.get("type", "")).lower()
        pair = (str(event["device_id"]), str(event["fence_id"]))
        stay = found.get(pair)
        if kind in OPENS:
            if stay is None:
                stay = found[pair] = Stay(*pair)
            if stay._open_ms is None:
                stay._open_ms = at_ms
        elif kind in CLOSES and stay is not None and stay._open_ms is not None:
            close(stay, at_ms)
    for stay in found.values():
        if stay._open_ms is not None:
            stay.inside_now = stay._open_ms <= to_ms
            close(stay, to_ms)
    return sorted((s for s in found.values() if s.stays), key=lambda s: (s.fence_id, -s.seconds, s.device_id))
