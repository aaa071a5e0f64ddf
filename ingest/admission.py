"""When the job's source plans no new records although the log has them (ingest.kafka_source's
latestOffset): while an operator or the benchmark holds its reads, and while a burst it would only take
a slice of is still arriving."""
from __future__ import annotations

import math
import time
from pathlib import Path

BURST_LOOK_S = 0.05     # while a burst is waited for, latestOffset looks again this often ...
BURST_LOOKS_S = 0.3     # ... for this long in one call (a whole BURST_WINDOW_S), then leaves the rest of the
                        # wait to the next trigger
# A burst has ended when the log grew slower than the burst rate over this long, not between two looks:
# a producer or broker pausing for one look (a flush, a collection; 50 ms) under a 380,000/s flood
# (measured 2026-11-29) ended the wait at 825,000 of 1,000,000 records, and every device the rest
# touched paid its state read and write again in a second batch
BURST_WINDOW_S = 0.25


class BurstGate:
    """Whether a micro-batch should wait for a burst to end. A burst: records arriving faster than
    `rate` per second into a log the job had caught up with (a flood, a backlog uploaded after an
    outage). A batch started at its first records takes a slice and the rest follows in the next one:
    every device the burst touches then pays its state read and write, and Spark its fixed cost, once
    per batch. Waiting, about `wait_s` at most, lets one batch take it whole.

    Caught up: a look found no more than a trickle waiting (fewer than `rate` × FIRST_LOOK_S records).
    Only a caught-up job's next batch waits, and only while less than a full batch is there: a busy
    job never waits. At least `rate` × FIRST_LOOK_S records found at once earn one more look; from then
    on the log's growth over the last BURST_WINDOW_S decides (between the first two looks: over that
    one). So a trickle runs at once, and a stream slower than `rate` waits one look at most
    (BURST_LOOK_S and a probe)."""

    FIRST_LOOK_S = 0.02

    def __init__(self, rate: int, wait_s: float) -> None:
        self.rate, self.wait_s = rate, wait_s
        self._looks: list[tuple[float, int]] = []       # (when, log end total) of the looks in the window
        self._caught_up = False                          # set by a trickle, kept while waiting
        self._since: float | None = None                 # when the waiting began

    def wait(self, pending: int, log_end: int, full_batch: int | None, now: float | None = None) -> bool:
        """True: plan nothing now, look again. `pending`: records past the committed offsets;
        `log_end`: the log ends summed over the partitions; `full_batch`: the most a batch takes
        (None: no limit)."""
        now = time.monotonic() if now is None else now
        since = self._since_window(now)
        self._looks.append((now, log_end))
        trickle = pending < self.rate * self.FIRST_LOOK_S
        if self.rate and self._caught_up and not trickle and (full_batch is None or pending < full_batch):
            growing = since is not None and now > since[0] and (log_end - since[1]) / (now - since[0]) > self.rate
            if self._since is None or growing:           # many at once earn one more look
                if self._since is None:
                    self._since = now
                if now - self._since < self.wait_s:
                    return True
        self._caught_up, self._since = trickle, None     # a batch runs now
        return False

    def _since_window(self, now: float) -> tuple[float, int] | None:
        """The look the growth is measured from: the newest at least BURST_WINDOW_S old, else the
        oldest there is (None: none yet). Older looks are forgotten."""
        looks = self._looks                 # in time order
        while len(looks) > 1 and now - looks[1][0] >= BURST_WINDOW_S:
            del looks[0]
        return looks[0] if looks else None


def hold(path: Path, seconds: float) -> None:
    """Plan no new records for `seconds` (or until `release`): a running query keeps its state, its
    workers and their caches, and finishes the batch it is in; records wait in the log. The file holds
    the time the hold ends, so a hold never outlives its writer by more than that."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{time.time() + seconds:.3f}\n")
    tmp.replace(path)


def release(path: Path) -> None:
    path.unlink(missing_ok=True)


def held(path: str | None) -> bool:
    """Whether a hold is in force: `path` names a finite time (epoch seconds) still to come. No file, a
    past or non-finite time, or anything unreadable: no hold."""
    if not path:
        return False
    try:
        with open(path) as f:
            until = float(f.read().strip())
    except (OSError, ValueError):
        return False
    return math.isfinite(until) and time.time() < until
