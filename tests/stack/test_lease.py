"""The job's lease and the epoch fencing of its writes (fencing.model.lease), on the real Redis Cluster.
Keys of their own ({leasetest...}), so the stack's running job and its lease are not touched."""
from __future__ import annotations

import threading
import time

import pytest
from redis.exceptions import ResponseError

from fencing.model.lease import Lease, epoch_key, split_command
from fencing.model.node_pipe import NodePipeline
from fencing.stream.sinks import EventLog
from tests.conftest import wait_for


def test_a_write_under_an_older_epoch_is_refused_where_a_newer_one_wrote(stack):
    redis = stack.redis
    tag = f"leasetest-{time.time_ns()}"
    key, other = f"state:{{{tag}}}", f"state:{{{tag}-b}}"
    old = NodePipeline(redis, epoch=5)
    old.hset(key, {"cow": "v5"})
    old.hset(other, {"cow": "v5"})
    old.execute()
    new = NodePipeline(redis, epoch=6)
    new.hset(key, {"cow": "v6"})
    new.execute()
    assert redis.get(epoch_key(key)) == "6"
    stale = NodePipeline(redis, epoch=5)
    stale.hset(key, {"cow": "v5-again"})
    with pytest.raises(ResponseError, match="FENCED"):
        stale.execute()
    assert redis.hget(key, "cow") == "v6"                     # nothing written
    # a slot the new epoch has not written yet still takes the old one (the same batch's result)
    late = NodePipeline(redis, epoch=5)
    late.hset(other, {"cow": "v5b"})
    late.execute()
    assert redis.hget(other, "cow") == "v5b"
    # unfenced writers (the API) are not affected
    plain = NodePipeline(redis)
    plain.hset(key, {"api": "x"})
    plain.execute()
    assert redis.hget(key, "api") == "x"


def test_the_event_log_is_fenced_too(stack):
    redis = stack.redis
    farm = f"leasetest-farm-{time.time_ns()}"
    log = EventLog(redis)
    event = {"event_id": "e1", "type": "enter", "farm_id": farm, "device_id": "cow", "fence_id": "f",
             "ts": 1_700_000_000_000, "lat": 47.0, "lon": 8.0}
    assert len(log.add([event], epoch=9)) == 1
    with pytest.raises(ResponseError, match="FENCED"):
        log.add([{**event, "event_id": "e2"}], epoch=8)
    assert len(log.add([{**event, "event_id": "e3"}], epoch=9)) == 1
    assert len(log.add([{**event, "event_id": "e4"}])) == 1       # epoch 0: not fenced (tests, tools)


def test_long_commands_are_split_to_fit_the_fenced_script(stack):
    redis = stack.redis
    key = f"big:{{leasetest-{time.time_ns()}}}"
    mapping = {f"d{i}": i for i in range(20_000)}            # 40,000 arguments: over Lua's unpack limit
    assert len(split_command(("HSET", key, *[x for kv in mapping.items() for x in kv]))) == 6
    pipe = NodePipeline(redis, epoch=3)
    pipe.hset(key, mapping)
    pipe.execute()
    assert redis.hlen(key) == 20_000 and redis.hget(key, "d19999") == "19999"


def test_the_lease_is_held_renewed_and_taken_over_with_the_next_epoch(stack):
    redis = stack.redis
    tag = f"leasetest-{time.time_ns()}"
    lost = threading.Event()
    keys = {"lease_key": f"{{{tag}}}:lease", "epoch_counter": f"{{{tag}}}:epoch"}
    first = Lease(redis, "host:1", 600, lost.set, **keys)
    second = Lease(redis, "host:2", 600, lambda: None, **keys)
    assert first.acquire() == 1
    time.sleep(1.5)                                            # 2.5 TTLs: renewed meanwhile
    assert second.try_acquire() == 0 and not lost.is_set()
    first._stop.set()                                         # the holder stops renewing (paused)
    epoch = wait_for(second.try_acquire, timeout=5, interval=0.05, what="the lease to expire")
    assert epoch == 2 and redis.get(keys["lease_key"]) == "host:2"
    first._stop.clear()
    threading.Thread(target=first._keep, daemon=True).start()  # resumed: it learns it lost the lease
    assert lost.wait(3)
