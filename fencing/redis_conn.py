"""One Redis Cluster client per process (driver, API worker or Spark Python worker), reused."""
from __future__ import annotations

import threading

from redis.cluster import RedisCluster

_clients: dict[tuple[str, int], RedisCluster] = {}
_lock = threading.Lock()


def cluster(host: str, port: int) -> RedisCluster:
    with _lock:
        client = _clients.get((host, port))
        if client is None:
            client = RedisCluster(host=host, port=port, decode_responses=True,
                                  socket_timeout=10, socket_connect_timeout=5,
                                  cluster_error_retry_attempts=6)
            _clients[(host, port)] = client
        return client
