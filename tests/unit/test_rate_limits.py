"""api/rate_limits.py against a real redis-server: a bucket shared by several "workers" (bucket objects
with their own held batches), Retry-After, batches for fast limits, expiry instead of resets."""
from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest
import redis as redis_py
from redis import asyncio as redis_asyncio

from api.rate_limits import LEASE_TTL_S, TokenBucket
from tests.chaoskit import wait_until

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is required")


@pytest.fixture
def redis_socket(tmp_path):
    sock = tmp_path / "redis.sock"
    proc = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(sock), "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis_py.Redis(unix_socket_path=str(sock), decode_responses=True)
        wait_until(lambda: _pings(client), timeout=10, interval=0.05, what="redis-server answers")
        yield str(sock)
    finally:
        proc.terminate()
        proc.wait(10)


def _pings(client) -> bool:
    try:
        return client.ping()
    except redis_py.ConnectionError:
        return False


def _script_calls(client) -> int:
    return sum(int(stats["calls"]) for name, stats in client.info("commandstats").items()
               if name in ("cmdstat_evalsha", "cmdstat_eval"))


def test_two_workers_share_one_device_bucket(redis_socket):
    """Each worker has its own bucket object (as each uvicorn worker has its module): together they
    admit the burst once, not once each."""
    client = redis_py.Redis(unix_socket_path=redis_socket, decode_responses=True)
    workers = [TokenBucket("device", 10, 20), TokenBucket("device", 10, 20)]
    key = workers[0].key("farm-a", "cow-1")
    started = time.monotonic()
    decisions = [workers[i % 2].allow(client, key) for i in range(60)]
    elapsed = time.monotonic() - started
    admitted = sum(d.allowed for d in decisions)
    # the burst, plus what the rate refilled while the loop ran
    assert 20 <= admitted <= 20 + int(10 * elapsed) + 1, (admitted, elapsed)
    refused = [d for d in decisions if not d.allowed]
    assert refused and all(d.retry_after_s == 1 for d in refused)
    other = workers[1].key("farm-a", "cow-2")
    assert workers[1].allow(client, other).allowed          # another device has its own bucket
    ttl = client.pttl(key)
    assert 0 < ttl <= 2_100                                 # gone once the bucket would be full again


def test_a_slow_limit_says_how_long_to_wait(redis_socket):
    client = redis_py.Redis(unix_socket_path=redis_socket, decode_responses=True)
    bucket = TokenBucket("farm", 0.1, 1)            # one request per 10 s
    key = bucket.key("farm-slow")
    assert bucket.allow(client, key).allowed
    refused = bucket.allow(client, key)
    assert not refused.allowed and 9 <= refused.retry_after_s <= 10


def test_a_fast_limit_takes_batches_and_never_admits_more_than_the_shared_bucket(redis_socket):
    client = redis_py.Redis(unix_socket_path=redis_socket, decode_responses=True)
    workers = [TokenBucket("farm", 1000, 2000), TokenBucket("farm", 1000, 2000)]
    assert workers[0].lease == 10
    key = workers[0].key("farm-fast")
    started = time.monotonic()          # the bucket refills from its first request on
    within_burst = [workers[i % 2].allow(client, key).allowed for i in range(1000)]
    assert all(within_burst)
    assert _script_calls(client) <= 1000 / workers[0].lease + 2     # one call per batch, not per request
    admitted = 1000 + sum(workers[i % 2].allow(client, key).allowed for i in range(3000))
    elapsed = time.monotonic() - started
    assert 2000 <= admitted <= 2000 + int(1000 * elapsed) + 2 * workers[0].lease, (admitted, elapsed)
    # a batch is spent within LEASE_TTL_S or dropped: held tokens do not outlive it
    workers[0]._held[key] = (5, time.monotonic() + LEASE_TTL_S)
    assert workers[0].take_held(key)
    workers[0]._held[key] = (5, time.monotonic() - 0.001)
    assert not workers[0].take_held(key)


def test_the_asyncio_client_shares_the_bucket(redis_socket):
    sync = redis_py.Redis(unix_socket_path=redis_socket, decode_responses=True)
    bucket = TokenBucket("device", 1, 3)
    key = bucket.key("farm-b", "cow-9")

    async def three_async():
        client = redis_asyncio.Redis(unix_socket_path=redis_socket, decode_responses=True)
        try:
            return [(await bucket.allow_async(client, key)).allowed for _ in range(2)]
        finally:
            await client.aclose()

    assert asyncio.run(three_async()) == [True, True]
    assert [bucket.allow(sync, key).allowed for _ in range(2)] == [True, False]


def test_a_full_redis_does_not_refuse_requests(redis_socket):
    """maxmemory reached (noeviction): the bucket's write fails inside the script and the request is
    admitted; the route's own writes answer 507."""
    client = redis_py.Redis(unix_socket_path=redis_socket, decode_responses=True)
    client.config_set("maxmemory", "1")
    try:
        bucket = TokenBucket("device", 1, 2)
        key = bucket.key("farm-full", "cow-1")
        assert all(bucket.allow(client, key).allowed for _ in range(5))
        assert client.exists(key) == 0
    finally:
        client.config_set("maxmemory", "0")
