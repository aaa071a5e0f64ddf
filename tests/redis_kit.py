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


def take_over(redis: RedisCluster, node: tuple[str, int], epoch: int, scope: str) -> RedisCluster:
    """What a job taking the lease does, in a test's own scope (fencing.model.job_user): count `epoch`,
    admit it on every node, and return the client that writes as its user."""
    from fencing.model.job_user import admit_everywhere, epoch_counter
    from fencing.model.redis_conn import cluster
    redis.set(epoch_counter(scope), epoch)
    assert admit_everywhere(redis, epoch, scope) == []
    return cluster(*node, epoch=epoch, scope=scope)


def scope_users(redis: RedisCluster, scope: str) -> dict[str, set[str]]:
    """Each node's job users of `scope` (node name → user names)."""
    from fencing.model.job_user import user_epoch
    out = {}
    for node in redis.get_nodes():
        names = node.redis_connection.execute_command("ACL", "USERS")
        out[node.name] = {n for n in names if (user_epoch(n) or ("", 0))[0] == scope}
    return out


def drop_scope(redis: RedisCluster, scope: str) -> None:
    """Delete a test scope's job users on every node."""
    for node, names in scope_users(redis, scope).items():
        if names:
            redis.get_node(node_name=node).redis_connection.execute_command("ACL", "DELUSER", *names)
