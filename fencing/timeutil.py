"""Times: requests accept ISO 8601 or epoch milliseconds; responses are ISO 8601 UTC strings."""
from __future__ import annotations

import math
from datetime import datetime, timezone


def iso(ms: int | float | None) -> str | None:
    if ms is None:
        return None
    moment = datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(ms) % 1000:03d}Z"


def to_ms(value) -> int:
    """ISO 8601 string or epoch milliseconds (number or digit string) → epoch ms; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("time must be ISO 8601 or epoch milliseconds")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError("time must be finite")
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError(f"not an ISO 8601 time or epoch milliseconds: {value[:40]!r}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return int(moment.timestamp() * 1000)
    raise ValueError("time must be ISO 8601 or epoch milliseconds")
