"""When the job's source plans no new records although the log has them (ingest.kafka_source's
latestOffset): while an operator or the benchmark holds its reads, and while a burst it would only take
a slice of is still arriving."""
from __future__ import annotations

import time
from pathlib import Path

BURST_LOOK_S = 0.05     # while a burst is waited for, latestOffset looks again this often ...
BURST_LOOKS = 4         # ... this many times, then leaves the rest of the wait to the next trigger


class BurstGate:
    """Whether a micro-batch should wait for a burst to end. A burst: records arriving faster than
    `rate` per second into a log the job had caught up with (a flood, a backlog uploaded after an
    outage). A batch started at its first records takes a slice and the rest follows in the next one:
    every device the burst touches then pays its state read and write, and Spark its fixed cost, once
    per batch. Waiting, at most `wait_s`, lets one batch take it whole.

    Only a caught-up job's next batch waits, and only while less than a full batch is there: a busy
    job never waits. The records found at the first look may have come in any part of the trigger
    interval, so as many as `rate` brings in FIRST_LOOK_S earn one more look; from then on the log's
    growth between two looks decides. A trickle runs at once; a stream slower than `rate` waits one
    trigger at most, and only after the job had caught up with it."""

    FIRST_LOOK_S = 0.02

    def __init__(self, rate: int, wait_s: float) -> None:
        self.rate, self.wait_s = rate, wait_s
        self._last: tuple[float, int] | None = None     # (when, log end total) at the previous look
        self._caught_up = False                          # the previous look found nothing to read
        self._since: float | None = None                 # when the waiting began

    def wait(self, pending: int, log_end: int, full_batch: int | None, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        last, self._last = self._last, (now, log_end)
        if not pending:
            self._caught_up, self._since = True, None
            return False
        if self.rate and self._caught_up and (full_batch is None or pending < full_batch):
            if self._since is None:
                burst = pending >= self.rate * self.FIRST_LOOK_S
            else:
                burst = last is not None and now > last[0] and (log_end - last[1]) / (now - last[0]) > self.rate
            if burst:
                self._since = self._since or now
                if now - self._since < self.wait_s:
                    return True
        self._caught_up, self._since = False, None       # a batch runs now
        return False


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
    """Whether a hold is in force: `path` names a time (epoch seconds) still to come. No file, a past
    time or anything unreadable: no hold (a stale file never stops a job)."""
    if not path:
        return False
    try:
        with open(path) as f:
            return time.time() < float(f.read().strip())
    except (OSError, ValueError):
        return False
