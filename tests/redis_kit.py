"""A Redis Cluster of a test module's own, started by the project's own deploy code."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from redis.cluster import RedisCluster

from deploy import redis_cluster
from fencing.config import load_settings


@contextmanager
def own_cluster(home: Path, port: int) -> Iterator[RedisCluster]:
    """3 masters on `port`.. (bus ports 10000 higher), stopped when the block ends."""
    settings = load_settings({"HERDFENCE_HOME": str(home), "HERDFENCE_EMBEDDED_REDIS_PORT": str(port)})
    try:
        redis_cluster.up(settings)
        rc = RedisCluster(host="127.0.0.1", port=port, decode_responses=True)
        yield rc
        rc.close()
    finally:
        redis_cluster.down(settings)
