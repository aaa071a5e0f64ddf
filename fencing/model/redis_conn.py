"""One Redis Cluster client per process (driver, API worker or Spark Python worker), reused."""
from __future__ import annotations

import threading

from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from fencing.config import Settings

_clients: dict[tuple[str, int], RedisCluster] = {}
_lock = threading.Lock()


def cluster(host: str, port: int) -> RedisCluster:
    with _lock:
        client = _clients.get((host, port))
        if client is None:
            # retries ride out a failover (replica promotion takes 2-4 s) and slot moves
            client = RedisCluster(host=host, port=port, decode_responses=True,
                                  socket_timeout=10, socket_connect_timeout=5,
                                  retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), 8))
            _clients[(host, port)] = client
        return client


def connect(settings: Settings, **kwargs) -> RedisCluster:
    """A cluster client for the configured (embedded or external) Redis Cluster."""
    host, port = settings.redis_node
    return RedisCluster(host=host, port=port, decode_responses=True, **kwargs)
