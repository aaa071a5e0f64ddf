"""Times: requests accept ISO 8601 or epoch milliseconds; responses are ISO 8601 UTC strings."""
from __future__ import annotations

import math
from datetime import datetime, timezone

import numpy as np


def iso(ms: int | float | None) -> str | None:
    if ms is None:
        return None
    moment = datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc)
    # the year by hand: strftime's %Y does not pad years before 1000 ("1-01-01" is not ISO 8601)
    return f"{moment.year:04d}" + moment.strftime("-%m-%dT%H:%M:%S.") + f"{int(ms) % 1000:03d}Z"


def iso_many(ms: list[int]) -> list[str]:
    """`iso` of many epoch-ms times at once (numpy formats them; ~10x faster than one by one)."""
    if not ms:
        return []
    text = np.datetime_as_string(np.asarray(ms, dtype=np.int64).astype("datetime64[ms]"), unit="ms")
    return [t + "Z" for t in text.tolist()]


# Years 1..9999: what an ISO 8601 answer can say back (and Python's datetime can hold).
MIN_MS, MAX_MS = -62_135_596_800_000, 253_402_300_799_999


def to_ms(value) -> int:
    """ISO 8601 string or epoch milliseconds (number or digit string) → epoch ms; ValueError otherwise
    (also for a time outside the years 1..9999)."""
    ms = _to_ms(value)
    if not MIN_MS <= ms <= MAX_MS:
        raise ValueError("time out of range (years 1 to 9999)")
    return ms


def _to_ms(value) -> int:
    if isinstance(value, bool):
        raise ValueError("time must be ISO 8601 or epoch milliseconds")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):   # (an int of 400 digits would overflow it)
            raise ValueError("time must be finite")
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            if len(text) > 20:
                raise ValueError("time out of range (years 1 to 9999)")
            return int(text)
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError(f"not an ISO 8601 time or epoch milliseconds: {value[:40]!r}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return int(moment.timestamp() * 1000)
    raise ValueError("time must be ISO 8601 or epoch milliseconds")
