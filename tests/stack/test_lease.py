"""The job's lease and who may write (fencing.model.lease, fencing.model.job_user), on the real Redis
Cluster. Keys ({leasetest...}) and job users (scope `lt<n>`) of their own, so the stack's running job,
its lease and its users are not touched."""
from __future__ import annotations

import threading
import time

import pytest
from redis.exceptions import ResponseError

from fencing.model.job_user import Fenced, admit, epoch_counter, job_user
from fencing.model.lease import Lease
from fencing.model.node_pipe import NodePipeline
from fencing.stream.sinks import EventLog
from tests.conftest import wait_for
from tests.redis_kit import drop_scope, scope_users, take_over


@pytest.fixture
def scope(stack):
    name = f"lt{time.time_ns()}"
    yield name
    drop_scope(stack.redis, name)


def _write(client, key: str, value: str) -> None:
    pipe = NodePipeline(client)
    pipe.hset(key, {"cow": value})
    pipe.execute()


def test_a_take_over_stops_the_older_epochs_writes_and_reads_on_every_node(stack, scope):
    redis, node = stack.redis, stack.settings.redis_node
    keys_ = [f"state:{{leasetest-{time.time_ns()}-{i}}}" for i in range(12)]     # spread over every master
    old = take_over(redis, node, 5, scope)
    for key in keys_:
        _write(old, key, "v5")
    assert all(users == {job_user(5, scope)} for users in scope_users(redis, scope).values())
    new = take_over(redis, node, 6, scope)
    assert all(users == {job_user(6, scope)} for users in scope_users(redis, scope).values())
    for key in keys_:
        with pytest.raises(Fenced, match="FENCED epoch 5 is older than 6"):
            _write(old, key, "v5-again")
        _write(new, key, "v6")
    with pytest.raises(Fenced):
        old.get(keys_[0])
    assert all(redis.hget(key, "cow") == "v6" for key in keys_)
    _write(redis, keys_[0], "api")                                  # the default user (the API) is not affected
    assert redis.hget(keys_[0], "cow") == "api"


def test_an_older_epochs_queued_writes_stop_when_the_newer_one_is_admitted(stack, scope):
    """A stream of pipelined writes of the old epoch: once the newer epoch's admission returns, not one
    more of them lands (Redis drops what a closed connection still had queued)."""
    redis, node = stack.redis, stack.settings.redis_node
    counter = f"count:{{leasetest-{time.time_ns()}}}"
    old = take_over(redis, node, 1, scope)
    failure: list[BaseException] = []

    def flood() -> None:
        try:
            while True:
                pipe = NodePipeline(old)
                for _ in range(5_000):
                    pipe.command(counter, "INCR", counter)
                pipe.execute()
        except BaseException as e:  # noqa: BLE001 - what stopped it is the assertion
            failure.append(e)
    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    wait_for(lambda: int(redis.get(counter) or 0) > 10_000, timeout=20, interval=0.01, what="the old epoch writing")
    take_over(redis, node, 2, scope)
    after = int(redis.get(counter))
    writer.join(10)
    assert not writer.is_alive() and isinstance(failure[0], Fenced), failure
    assert int(redis.get(counter)) == after


def test_admission_is_create_then_check_the_older_of_two_epochs_never_stays(stack, scope):
    redis = stack.redis
    master = redis.get_primaries()[0].redis_connection
    admit(master, 8, scope)
    with pytest.raises(Fenced, match="FENCED epoch 7 is older than 8"):
        admit(master, 7, scope)
    admit(master, 8, scope)                                         # idempotent
    names = master.execute_command("ACL", "USERS")
    assert job_user(8, scope) in names and job_user(7, scope) not in names


def test_a_node_that_lost_the_users_admits_the_newest_epoch_only(stack, scope):
    """A node restarted (ACLs are not kept) or unreachable at the take-over: the current epoch admits
    itself there on its first connection; an older one is refused and leaves no user behind."""
    redis, node = stack.redis, stack.settings.redis_node
    key = f"state:{{leasetest-{time.time_ns()}}}"
    target = redis.get_node_from_key(key).redis_connection
    current = take_over(redis, node, 3, scope)
    target.execute_command("ACL", "DELUSER", job_user(3, scope))         # the node forgot it
    _write(current, key, "v3")
    assert job_user(3, scope) in target.execute_command("ACL", "USERS")
    redis.set(epoch_counter(scope), 4)                                  # epoch 4 took the lease ...
    for other in redis.get_primaries():                                 # ... and reached every node but one
        if other.redis_connection is not target:
            admit(other.redis_connection, 4, scope)
    target.execute_command("ACL", "DELUSER", job_user(3, scope))         # which then restarted
    with pytest.raises(Fenced, match="FENCED epoch 3 is older than 4"):
        _write(current, key, "v3-again")
    assert job_user(3, scope) not in target.execute_command("ACL", "USERS")
    assert redis.hget(key, "cow") == "v3"


def test_the_event_log_of_an_older_epoch_writes_nothing(stack, scope):
    redis, node = stack.redis, stack.settings.redis_node
    farm = f"leasetest-farm-{time.time_ns()}"
    event = {"event_id": "e1", "type": "enter", "farm_id": farm, "device_id": "cow", "fence_id": "f",
             "ts": 1_700_000_000_000, "lat": 47.0, "lon": 8.0}
    old = take_over(redis, node, 9, scope)
    assert len(EventLog(old).add([event])) == 1
    new = take_over(redis, node, 10, scope)
    with pytest.raises(Fenced):
        EventLog(old).add([{**event, "event_id": "e2"}])
    assert len(EventLog(new).add([{**event, "event_id": "e3"}])) == 1
    assert sorted(redis.hkeys(f"evdata:{{{farm}}}")) == ["e1", "e3"]


def test_pipelined_writes_run_in_queue_order_with_their_own_answers(stack):
    """Writes of many slots go as one buffer per master; a read queued between two writes sees the
    first and not the second, every write gets its own answer, and a write that fails fails alone."""
    redis = stack.redis
    tag = f"leasetest-{time.time_ns()}"
    key, members = f"pos:{{{tag}}}", f"members:{{{tag}}}:f1"
    pipe = NodePipeline(redis)
    first = pipe.hset(key, {"cow": "v1", "calf": "v1"})
    added = pipe.command(members, "SADD", members, "cow", "calf", "bull")
    read = pipe.command(key, "HGET", key, "cow")
    second = pipe.hset(key, {"cow": "v2"})
    removed = pipe.command(members, "SREM", members, "bull", "nobody")
    answers = pipe.execute()
    assert (answers[first], answers[added], answers[read], answers[second], answers[removed]) == (2, 3, "v1", 0, 1)
    assert redis.hget(key, "cow") == "v2" and redis.smembers(members) == {"cow", "calf"}
    pipe = NodePipeline(redis)
    pipe.hset(key, {"calf": "v3"})
    wrong = pipe.command(key, "SADD", key, "x")          # WRONGTYPE: the key is a hash
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        pipe.execute()
    assert redis.hget(key, "calf") == "v3"
    assert wrong == 1


def test_scripts_run_once_with_their_answers_when_masters_lost_them(stack):
    """A master that lost a script (a failover to a replica that never loaded it) fails the pipelined
    EVALSHA with NOSCRIPT: each such call runs again alone, loading the script, and its answer is
    that run's."""
    redis = stack.redis
    tag = time.time_ns()
    keys_ = [f"counted:{{leasetest-{tag}-{i}}}" for i in range(12)]          # spread over every master
    incr = redis.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    redis.script_load("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    pipe = NodePipeline(redis)
    at = [pipe.script(incr, [key], [5]) for key in keys_]
    for node in redis.get_primaries():             # after the script was loaded for the pipeline
        node.redis_connection.script_flush()
    answers = pipe.execute()
    assert [answers[i] for i in at] == [5] * len(keys_)             # each ran exactly once
    assert all(redis.get(key) == "5" for key in keys_)


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
