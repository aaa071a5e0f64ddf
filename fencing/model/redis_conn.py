"""The one Redis Cluster client factory: every process (driver, API worker, Spark Python worker, the
launchers) builds its clients here, with the same timeouts and the same retries, which ride out a
failover (replica promotion takes 2-4 s) and slot moves."""
from __future__ import annotations

import threading

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from fencing.config import Settings
from fencing.model.job_user import SCOPE, JobConnection, job_user

_clients: dict[tuple[str, int, int, str], RedisCluster] = {}
_lock = threading.Lock()
TIMEOUTS = {"socket_timeout": 10, "socket_connect_timeout": 5}


def _backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=2.0, base=0.1)


def new_cluster(host: str, port: int, **overrides) -> RedisCluster:
    """A new synchronous client (decoded strings)."""
    return RedisCluster(host=host, port=port, decode_responses=True,
                        **{**TIMEOUTS, "retry": Retry(_backoff(), 8), **overrides})


def node_connection(host: str, port: int, name: str) -> Redis:
    """A plain connection to one node, named `name` (CLIENT LIST shows it; it closes when the process
    dies: the job lease's presence). Short timeouts, no retries: a dead node is an answer."""
    conn = Redis(host=host, port=port, decode_responses=True, socket_timeout=2, socket_connect_timeout=2,
                 client_name=name)
    conn.ping()
    return conn


def cluster(host: str, port: int, epoch: int = 0, scope: str = SCOPE) -> RedisCluster:
    """This process's shared synchronous client for that node's cluster; `epoch` > 0: connected as that
    lease epoch's job user (fencing.model.job_user), whose writes stop when a newer job takes over."""
    with _lock:
        client = _clients.get((host, port, epoch, scope))
        if client is None:
            # with a url, the node clients' pools are built from the kwargs, connection_class included
            as_job = {"username": job_user(epoch, scope), "password": "-", "url": f"redis://{host}:{port}",
                      "connection_class": JobConnection} if epoch else {}
            client = _clients[(host, port, epoch, scope)] = new_cluster(host, port, **as_job)
        return client


def async_cluster(host: str, port: int) -> AsyncRedisCluster:
    """An asyncio client (the API's hot routes and live streams), same timeouts and retries."""
    return AsyncRedisCluster(host=host, port=port, decode_responses=True, socket_timeout=TIMEOUTS["socket_timeout"],
                             retry=AsyncRetry(_backoff(), 8))


def connect(settings: Settings, **overrides) -> RedisCluster:
    """A new synchronous client for the configured (embedded or external) Redis Cluster. No retries
    by default: the launchers and `status` want a quick answer when a node is down."""
    host, port = settings.redis_node
    return new_cluster(host, port, **{"retry": None, **overrides})
