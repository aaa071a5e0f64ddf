"""Change notices for the API workers' caches, on one Redis pub/sub channel (see api/invalidation.py).

Writers of live state (the job's tasks, fence edits) and of secrets publish here after their writes
are applied; a notice is only a hint to drop cached answers, so losing one costs a stale cache entry
for as long as the API trusts it without notices (a few seconds), never lost data.
"""
from __future__ import annotations

from collections.abc import Iterable

CHANNEL = "herdfence:invalidate"
AUTH = "auth"     # "auth": any secret → principal mapping may be stale
LIVE = "live"     # "live\t<farm>,<farm>...": those farms' positions, members or fences changed


def auth_changed(redis) -> None:
    redis.publish(CHANNEL, AUTH)


def live_changed(redis, farm_ids: Iterable[str]) -> None:
    farms = sorted(set(farm_ids))
    if farms:
        redis.publish(CHANNEL, f"{LIVE}\t{','.join(farms)}")


def parse(message: str) -> tuple[str, list[str]]:
    kind, _, rest = message.partition("\t")
    return kind, [f for f in rest.split(",") if f]
