"""What the writers share: report rows as JSON payloads, pacing to a target rate, and run stats."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

REPORT_FIELDS = ("device_id", "ts", "lat", "lon", "battery")


def report_dicts(df: pd.DataFrame) -> Iterator[dict]:
    """Rows as the JSON objects the contract names, in row order.

    Columns go through ``tolist()`` once (plain Python floats/ints are several times faster to
    serialize than numpy scalars); a float serialized by orjson parses back to the same float64, so
    the job sees exactly the coordinates the oracle tested. A NaN battery is left out."""
    cols = [c for c in REPORT_FIELDS if c in df.columns]
    values = [df[c].tolist() for c in cols]
    has_battery = "battery" in cols
    for row in zip(*values):
        rec = dict(zip(cols, row))
        if has_battery and rec["battery"] != rec["battery"]:
            del rec["battery"]
        yield rec


class Pacer:
    """Holds callers to ``rate`` rows/s overall (thread-safe); rate None = as fast as possible."""

    def __init__(self, rate: float | None):
        self.rate = rate
        self._start = time.perf_counter()
        self._admitted = 0
        self._lock = threading.Lock()

    def set_rate(self, rate: float | None) -> None:
        """Change the rate; pacing restarts from now."""
        with self._lock:
            self.rate, self._start, self._admitted = rate, time.perf_counter(), 0

    def admit(self, n: int) -> None:
        if not self.rate:
            return
        with self._lock:
            due = self._start + self._admitted / self.rate
            self._admitted += n
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


@dataclass
class WriteStats:
    rows: int                       # rows offered
    sent: int = 0                   # acknowledged by the broker / accepted by the API
    failed: int = 0                 # delivery errors, or rows of requests that finally failed
    rejected: int = 0               # rows the API answered in "rejected" (invalid reports)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)         # first few error messages
    sent_at_ms: np.ndarray | None = None   # wall clock (epoch ms) each row was handed over; for latency
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def rows_per_s(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0

    def note_error(self, message: str, keep: int = 10) -> None:
        if len(self.errors) < keep:
            self.errors.append(message)

    def add(self, sent: int = 0, rejected: int = 0, failed: int = 0, error: str | None = None) -> None:
        """Thread-safe counting (the HTTP writer's workers report concurrently)."""
        with self._lock:
            self.sent += sent
            self.rejected += rejected
            self.failed += failed
            if error:
                self.note_error(error)

    def as_dict(self) -> dict:
        return {"rows": self.rows, "sent": self.sent, "failed": self.failed, "rejected": self.rejected,
                "seconds": round(self.seconds, 3), "rows_per_s": round(self.rows_per_s, 1),
                "errors": self.errors}
