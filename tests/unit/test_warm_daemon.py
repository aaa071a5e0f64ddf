"""The idle refresh of the warm daemon (fencing/stream/warm_daemon.py) on a real poll object: due after
its period while nothing is asked, never in the way of a waiting fork request. Refreshing itself, and the
fork, are tested on the stack (tests/stack/test_keep_warm.py)."""
from __future__ import annotations

import os
import select
import time

from fencing.stream import warm_daemon


def test_an_idle_daemon_refreshes_once_a_period_and_never_before_a_waiting_request(monkeypatch):
    refreshed: list[float] = []
    monkeypatch.setattr(warm_daemon, "refresh_before_fork", lambda: refreshed.append(time.monotonic()))
    read_end, write_end = os.pipe()
    try:
        waiting = warm_daemon._RefreshingPoll(select.poll(), every_s=0.2)
        waiting.register(read_end, select.POLLIN)
        assert waiting.poll(20) == [] and refreshed == []            # idle, but not due yet
        time.sleep(0.25)
        assert waiting.poll(20) == [] and len(refreshed) == 1        # idle and due
        assert waiting.poll(20) == [] and len(refreshed) == 1        # the period starts again
        os.write(write_end, b"x")                                    # a fork request waits
        time.sleep(0.25)
        assert waiting.poll(20) and len(refreshed) == 1              # answered first, no refresh
    finally:
        os.close(read_end)
        os.close(write_end)
