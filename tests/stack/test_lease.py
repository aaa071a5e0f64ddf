"""The job's lease and the epoch fencing of its writes (fencing.model.lease), on the real Redis Cluster.
Keys of their own ({leasetest...}), so the stack's running job and its lease are not touched."""
from __future__ import annotations

import threading
import time

import pytest
from redis.crc import key_slot
from redis.exceptions import ResponseError

from fencing.model import node_pipe
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


def test_fenced_writes_of_one_slot_run_together_in_queue_order_with_their_own_answers(stack):
    """A batch's fenced writes into one slot go as one checked call; a read of that slot queued between
    two writes sees the first and not the second, and every write gets its own answer."""
    redis = stack.redis
    tag = f"leasetest-{time.time_ns()}"
    key, members = f"pos:{{{tag}}}", f"members:{{{tag}}}:f1"
    pipe = NodePipeline(redis, epoch=7)
    first = pipe.hset(key, {"cow": "v1", "calf": "v1"})
    added = pipe.command(members, "SADD", members, "cow", "calf", "bull")
    read = pipe.command(key, "HGET", key, "cow")
    second = pipe.hset(key, {"cow": "v2"})
    removed = pipe.command(members, "SREM", members, "bull", "nobody")
    answers = pipe.execute()
    assert (answers[first], answers[added], answers[read], answers[second], answers[removed]) == (2, 3, "v1", 0, 1)
    assert redis.hget(key, "cow") == "v2" and redis.smembers(members) == {"cow", "calf"}
    assert redis.get(epoch_key(key)) == "7"
    # a write that fails on the server fails alone: the others of its slot still land
    pipe = NodePipeline(redis, epoch=7)
    pipe.hset(key, {"calf": "v3"})
    wrong = pipe.command(key, "SADD", key, "x")          # WRONGTYPE: the key is a hash
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        pipe.execute()
    assert redis.hget(key, "calf") == "v3"
    assert wrong == 1


def _same_slot_tag(tag: str, prefix: str) -> str:
    """A hash tag other than `tag` whose keys share its slot (so its epoch mark shares that slot too)."""
    slot = key_slot(tag.encode())
    return next(t for t in (f"{prefix}-{i}" for i in range(1_000_000)) if key_slot(t.encode()) == slot)


def _counting_retries(pipe: NodePipeline) -> list:
    """The writes `pipe` has to make again alone (the grouped call did not run them)."""
    alone: list = []
    run_alone = pipe._fenced_alone
    pipe._fenced_alone = lambda mark, part: alone.append(part) or run_alone(mark, part)
    return alone


def test_fenced_writes_of_many_farms_go_as_one_call_per_master_and_a_refused_farm_refuses_only_its_own(stack):
    """A batch's fenced writes into many farms' slots are checked and run by one script call per
    master, each farm's against its own epoch mark, even where two farms share a slot; where a newer
    epoch wrote, that farm's writes are refused (FENCED) and every other farm's land, on the same
    master and in the same slot too."""
    redis = stack.redis
    tag = time.time_ns()
    farms = [f"leasetest-{tag}-{i}" for i in range(40)]                # spread over every master
    taken = farms[5]                                                      # a newer job writes here
    twin = _same_slot_tag(taken, f"leasetest-{tag}-twin")                 # same slot, a mark of its own
    farms.append(twin)
    pos = {farm: f"pos:{{{farm}}}" for farm in farms}
    seen = {farm: f"lastseen:{{{farm}}}" for farm in farms}
    first = NodePipeline(redis, epoch=7)
    alone = _counting_retries(first)
    for farm in farms:
        first.hset(pos[farm], {"cow": "v7"})
        first.command(seen[farm], "ZADD", seen[farm], 7, "cow")
    masters = {redis.get_node_from_key(pos[farm]).name for farm in farms}
    requests = first._requests(first._calls, first._fenced)
    assert len(requests) == len(masters) == len(redis.get_primaries())
    assert sorted(i for r in requests for i in r.members) == list(range(2 * len(farms)))
    assert first.execute() == [1, 1] * len(farms) and alone == []        # every answer from the grouped calls
    assert all(redis.hget(pos[farm], "cow") == "v7" for farm in farms)
    newer = NodePipeline(redis, epoch=8)
    newer.hset(pos[taken], {"cow": "v8"})
    newer.execute()
    assert redis.get(epoch_key(pos[taken])) == "8" and redis.get(epoch_key(pos[twin])) == "7"
    stale = NodePipeline(redis, epoch=7)
    for farm in [twin, *farms[:-1]]:                                     # the twin's mark first in its slot
        stale.hset(pos[farm], {"cow": "v7b"})
        stale.command(seen[farm], "ZADD", seen[farm], 9, "cow")
    with pytest.raises(ResponseError, match="FENCED"):
        stale.execute()
    assert redis.hget(pos[taken], "cow") == "v8" and redis.zscore(seen[taken], "cow") == 7
    others = [farm for farm in farms if farm != taken]
    assert all(redis.hget(pos[farm], "cow") == "v7b" and redis.zscore(seen[farm], "cow") == 9 for farm in others)


def test_fenced_writes_split_into_several_calls_per_master_keep_each_keys_queue_order(stack, monkeypatch):
    """Groups cut by their size, and a plain command between writes: each key's writes still land in
    queue order, and the plain command sees exactly the writes queued before it."""
    monkeypatch.setattr(node_pipe, "GROUP_ARGS", 12)                     # a few writes per call
    redis = stack.redis
    tag = time.time_ns()
    keys_ = [f"order:{{leasetest-{tag}-{i}}}" for i in range(6)]
    pipe = NodePipeline(redis, epoch=3)
    for step in range(5):
        for key in keys_:
            pipe.hset(key, {"v": f"{step}"})
    read = pipe.command(keys_[0], "HGET", keys_[0], "v")
    for key in keys_:
        pipe.hset(key, {"v": "last"})
    assert len(pipe._requests(pipe._calls, pipe._fenced)) > 2 * len(redis.get_primaries())
    answers = pipe.execute()
    assert answers[read] == "4"
    assert all(redis.hget(key, "v") == "last" for key in keys_)


def test_fenced_writes_land_once_with_their_answers_when_masters_lost_the_script(stack):
    """A master that lost the fencing script (a failover to a replica that never loaded it) fails the
    pipelined EVALSHA with NOSCRIPT: each such write runs again alone, loading the script, and its
    answer is that run's."""
    redis = stack.redis
    tag = time.time_ns()
    keys_ = [f"fenced:{{leasetest-{tag}-{i}}}" for i in range(12)]          # spread over every master
    pipe = NodePipeline(redis, epoch=4)
    at = [pipe.hset(key, {"cow": "v4", "calf": "v4"}) for key in keys_]
    counters = [pipe.command(key + ":n", "INCRBY", key + ":n", 5) for key in keys_]
    for node in redis.get_primaries():             # after the script was loaded for the pipeline
        node.redis_connection.script_flush()
    answers = pipe.execute()
    assert [answers[i] for i in at] == [2] * len(keys_)
    assert [answers[i] for i in counters] == [5] * len(keys_)         # each INCRBY ran exactly once
    assert all(redis.hgetall(key) == {"cow": "v4", "calf": "v4"} for key in keys_)
    assert all(redis.get(epoch_key(key)) == "4" for key in keys_)
    stale = NodePipeline(redis, epoch=3)
    stale.hset(keys_[0], {"cow": "v3"})
    with pytest.raises(ResponseError, match="FENCED"):
        stale.execute()


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


def test_a_late_renewal_keeps_the_lease_only_if_no_job_took_it_meanwhile(stack):
    """A starved holder (a long GC pause, a busy machine) renews after its lease expired: with no
    standby around it holds it again under the same epoch; once another job took the next epoch, it
    has lost it for good, even if that job's lease has expired too."""
    redis = stack.redis
    tag = f"leasetest-{time.time_ns()}"
    keys = {"lease_key": f"{{{tag}}}:lease", "epoch_counter": f"{{{tag}}}:epoch"}
    lost = threading.Event()
    holder = Lease(redis, "host:1", 400, lost.set, **keys)
    assert holder.acquire() == 1
    holder._stop.set()                                        # starved: no renewal ...
    wait_for(lambda: redis.get(keys["lease_key"]) is None, timeout=5, interval=0.05, what="the lease to expire")
    holder._stop.clear()
    threading.Thread(target=holder._keep, daemon=True).start()    # ... until now
    wait_for(lambda: redis.get(keys["lease_key"]) == "host:1", timeout=3, interval=0.05, what="the late renewal")
    assert not lost.is_set() and redis.get(keys["epoch_counter"]) == "1"
    assert holder.take_worst_gap_ms() >= 400                  # the starved spell is on record
    holder._stop.set()
    time.sleep(0.2)
    other = Lease(redis, "host:2", 400, lambda: None, **keys)
    redis.delete(keys["lease_key"])
    assert other.try_acquire() == 2
    redis.delete(keys["lease_key"])                           # the new holder's lease is gone as well
    holder._stop.clear()
    threading.Thread(target=holder._keep, daemon=True).start()
    assert lost.wait(3) and redis.get(keys["lease_key"]) is None


_HOLDER = """
import sys, threading, time
from fencing.model.lease import Lease
from fencing.model.redis_conn import new_cluster
host, port, tag, ttl = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
lease = Lease(new_cluster(host, port), "holder:" + tag, ttl, lambda: None,
              lease_key="{%s}:lease" % tag, epoch_counter="{%s}:epoch" % tag)
print(lease.acquire(), flush=True)
threading.Event().wait()
"""


def _holder_process(stack, tag: str, ttl_ms: int):
    import subprocess
    import sys
    host, port = stack.settings.redis_node
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, host, str(port), tag, str(ttl_ms)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "1"          # it holds the lease, epoch 1
    return proc


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_killed_holder_is_replaced_before_its_ttl_a_paused_one_only_after(stack, fault):
    """kill -9 closes the holder's presence connection: the standby takes over well inside the TTL.
    A paused holder keeps its connection: nobody takes its lease before the TTL runs out."""
    import os
    import signal
    redis = stack.redis
    tag = f"leasetest-{time.time_ns()}"
    ttl_ms = 6_000
    holder = _holder_process(stack, tag, ttl_ms)
    standby = Lease(redis, "standby:" + tag, ttl_ms, lambda: None,
                    lease_key=f"{{{tag}}}:lease", epoch_counter=f"{{{tag}}}:epoch")
    got: list[tuple[int, float]] = []
    stop = threading.Event()
    waiter = threading.Thread(target=lambda: got.append((standby.acquire(stop=stop), time.monotonic())), daemon=True)
    try:
        waiter.start()          # standing by: it finds the holder's connection, then checks it by id
        wait_for(lambda: standby._seen_at is not None, timeout=5, interval=0.05, what="the holder's presence seen")
        time.sleep(0.3)
        assert not got
        faulted = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        waiter.join(ttl_ms / 1000 + 5)
        assert got and got[0][0] == 2, "the standby never took the lease"
        waited = got[0][1] - faulted
        if fault == "kill":
            assert waited < 2.0, f"took {waited:.1f} s: the presence connection was not noticed"
        else:
            # renewed every ttl/5: at least 4/5 of the TTL was left when it was paused
            assert waited >= 0.8 * ttl_ms / 1000 - 0.3, f"a paused holder's lease was taken after {waited:.1f} s"
        assert redis.get(f"{{{tag}}}:lease") == "standby:" + tag
    finally:
        stop.set()
        standby.release()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
