"""api/event_hub.py's safety-net reads: spread over the period, oldest feeds first."""
from __future__ import annotations

import time

from api import event_hub
from api.event_hub import EventHub, _Feed


def test_stale_feeds_are_read_a_share_at_a_time_oldest_first():
    hub = EventHub(aredis=None, poll_s=30.0)
    now = time.monotonic()
    for i in range(900):
        hub.feeds[f"farm-{i}"] = _Feed("0-0", read_at=now - 31.0 - i)     # farm-899 the oldest
    for i in range(900, 1000):
        hub.feeds[f"farm-{i}"] = _Feed("0-0", read_at=now)               # just read by a notice
    share = hub._stale_share()
    # 1,000 feeds, a 0.5 s tick of a 30 s period: 17 a tick, so every feed about once per period
    assert len(share) == 17 == -(-1000 * event_hub.TICK_S // 30.0)
    assert share == [f"farm-{i}" for i in range(899, 882, -1)]
    for f in share:
        hub.feeds[f].read_at = now
    assert hub._stale_share()[0] == "farm-882"
    fresh = EventHub(aredis=None, poll_s=30.0)
    fresh.feeds["farm-a"] = _Feed("0-0", read_at=now)
    assert fresh._stale_share() == []
