"""Chaos: real processes killed with SIGKILL mid-stream; every ENTER/EXIT the simulated tracks call for
(loadgen.truth) is there exactly once afterwards.

(a) the Spark job, three times in one run (driver only, JVM only, the whole process group);
(b) a Redis master of a cluster with replicas (the disposable stack, `--redis-replicas 1` added);
(c) the API under load (clients retry; nothing accepted is lost);
(d) the broker (its log is on disk, deploy/objectstore.py): 503 + Retry-After while it is down and
    nobody restarts it; reports acknowledged before the kill are processed after it, exactly once.
"""
from __future__ import annotations

import json
import os
import random
import signal
import threading
import time

import pytest

from fencing.model.heartbeat import Heartbeat
from loadgen import http_writer, kafka_writer
from tests.chaoskit import Herd, alive, children, heartbeat, kill9, read_pid, wait_until
from tests.conftest import Stack

def _fresh_beat(redis, since: float, min_points: int = 1) -> Heartbeat | None:
    beat = heartbeat(redis)
    return beat if beat is not None and beat.time > since and beat.points >= min_points else None


def _job_restarted(stack: Stack, old_pid: int, timeout: float = 90) -> int:
    """The supervisor restarts the job; if it does not within `timeout`, `herdfence up --detach` does."""
    home = stack.env["HERDFENCE_HOME"]
    try:
        return wait_until(lambda: (lambda p: p if p and p != old_pid and alive(p) else None)(read_pid(home, "job")),
                          timeout, what="the supervisor to restart the job")
    except AssertionError:
        stack.cli("up", "--detach", timeout=300)
        return read_pid(home, "job")


def _kill_job(stack: Stack, how: str) -> int:
    pid = read_pid(stack.env["HERDFENCE_HOME"], "job")
    assert alive(pid), "the job is not running"
    if how == "driver":                    # the Python driver only (its JVM notices and exits)
        kill9(pid)
    elif how == "jvm":                     # the JVM under the driver only
        jvms = [c for c in children(pid) if b"java" in open(f"/proc/{c}/cmdline", "rb").read()]
        assert jvms, "no JVM under the job's driver"
        for c in jvms:
            kill9(c)
    else:                                  # the whole process group at once
        kill9(pid, group=True)
    return pid


def test_job_killed_three_times_mid_stream(stack):
    """The acceptance scenario: 30 devices streaming; the job is SIGKILLed three times while batches
    are in flight and restarted from its checkpoint; every event exactly once."""
    farm_id, key = stack.new_farm("chaos job")
    herd = Herd.create(stack.api_url, farm_id, key, "cj", devices=30, steps=80, seed=21)
    parts = 4
    df = herd.reports
    segments = [df.iloc[i * len(df) // parts:(i + 1) * len(df) // parts] for i in range(parts)]
    redis = stack.redis
    rng = random.Random(8)
    started = time.monotonic()
    for round_, how in enumerate(("driver", "jvm", "group")):
        since = time.time()
        writer = threading.Thread(target=kafka_writer.write_reports, args=(stack.kafka_bootstrap, segments[round_]),
                                  kwargs={"rate": 60, "progress": False})
        writer.start()
        # mid-stream: the job has processed a batch of this segment and more records keep arriving
        wait_until(lambda: _fresh_beat(redis, since), 180, what=f"a batch with points before kill {round_ + 1}")
        time.sleep(rng.uniform(0.3, 1.5))
        old = _kill_job(stack, how)
        print(f"kill {round_ + 1} ({how}) of job pid {old} at {time.monotonic() - started:.0f}s")
        writer.join()
        _job_restarted(stack, old)
    since = time.time()
    kafka_writer.write_reports(stack.kafka_bootstrap, segments[-1], rate=200, progress=False)
    result = herd.reconcile(timeout=240)
    print(f"job chaos: {result} in {time.monotonic() - started:.0f}s")
    assert result["events"] >= 20, "the simulated tracks should cross fences"
    assert (result["lost"], result["duplicated"], result["unexpected"], result["duplicate_event_ids"]) == (0, 0, 0, 0), result
    rec = json.loads((stack.settings.run_dir / "job.json").read_text())
    assert rec["restarts"] >= 3 or stack.cli("status", "--json", check=False)
    stack.cli("up", "--detach", timeout=300)


def test_api_killed_under_load(stack):
    """Reports posted through the API by 4 retrying clients while the API is SIGKILLed twice (the
    supervisor restarts it): every report ends up accepted, and the events reconcile."""
    farm_id, key = stack.new_farm("chaos api")
    herd = Herd.create(stack.api_url, farm_id, key, "ca", devices=30, steps=40, seed=5, register=False)
    home = stack.env["HERDFENCE_HOME"]
    out: dict = {}

    def post() -> None:
        out["stats"] = http_writer.write_reports(stack.api_url, herd.reports, key=key, rate=80, batch_size=20,
                                                 workers=4, retries=14, timeout_s=20, progress=False)
    writer = threading.Thread(target=post)
    writer.start()
    for delay in (3, 6):
        time.sleep(delay)
        pid = read_pid(home, "api")
        assert alive(pid)
        kill9(pid, group=True)
        wait_until(lambda: (lambda p: p if p != pid and alive(p) else None)(read_pid(home, "api")), 60,
                   what="the supervisor to restart the API")
    writer.join()
    stats = out["stats"]
    print(f"api chaos writer: {stats.as_dict()}")
    assert stats.failed == 0 and stats.sent == len(herd.reports), stats.as_dict()
    result = herd.reconcile(timeout=180)
    print(f"api chaos: {result}")
    assert result["events"] >= 10
    assert (result["lost"], result["duplicated"], result["unexpected"], result["duplicate_event_ids"]) == (0, 0, 0, 0), result
    stack.cli("up", "--detach", timeout=300)


# --- own stack with Redis replicas: (b) master failover, (d) broker down -------------------------
@pytest.fixture(scope="module")
def ha_stack(disposable) -> Stack:
    """The disposable stack with a replica per Redis master (added to the running cluster)."""
    disposable.cli("up", "--detach", "--redis-replicas", "1", timeout=600)
    return disposable


def _master_of(stack: Stack, key: str) -> int:
    rc = stack.redis
    node = rc.get_node_from_key(key)
    return int(node.port)


def test_redis_master_killed_with_replicas(ha_stack):
    stack = ha_stack
    farm_id, key = stack.new_farm("chaos redis")
    herd = Herd.create(stack.api_url, farm_id, key, "cr", devices=20, steps=50, seed=3)
    df = herd.reports
    first, second = df.iloc[: len(df) // 2], df.iloc[len(df) // 2:]
    kafka_writer.write_reports(stack.kafka_bootstrap, first, rate=300, progress=False)
    wait_until(lambda: _fresh_beat(stack.redis, 0), 120, what="the job to process reports")
    port = _master_of(stack, f"pos:{{{farm_id}}}")             # the master holding the farm's live state
    pid = read_pid(stack.env["HERDFENCE_HOME"], f"redis_{port}")
    assert alive(pid)
    writer = threading.Thread(target=kafka_writer.write_reports, args=(stack.kafka_bootstrap, second),
                              kwargs={"rate": 100, "progress": False})
    writer.start()
    time.sleep(1.0)
    kill9(pid)
    t0 = time.monotonic()
    print(f"killed redis master {port} (pid {pid})")

    def api_serves() -> bool:
        with herd.client() as c:
            return c.get("/v1/fences").status_code == 200 and c.get("/v1/positions").status_code == 200
    wait_until(api_serves, 60, what="the API to serve after the failover")
    print(f"API serving again {time.monotonic() - t0:.1f}s after the kill")
    writer.join()
    result = herd.reconcile(timeout=240)
    print(f"redis chaos: {result}")
    assert result["events"] >= 10
    assert (result["lost"], result["duplicated"], result["unexpected"], result["duplicate_event_ids"]) == (0, 0, 0, 0), result


def test_broker_killed_503_then_nothing_lost(ha_stack):
    stack = ha_stack
    farm_id, key = stack.new_farm("chaos broker")
    herd = Herd.create(stack.api_url, farm_id, key, "cb", devices=10, steps=30, seed=9)
    df = herd.reports
    first, second = df.iloc[: len(df) // 2], df.iloc[len(df) // 2:]
    http_writer.write_reports(stack.api_url, first, key=key, batch_size=100, progress=False)
    home = stack.env["HERDFENCE_HOME"]
    supervisor = read_pid(home, "supervisor")
    os.kill(supervisor, signal.SIGSTOP)          # nobody restarts the broker while we look
    broker = read_pid(home, "broker")
    kill9(broker)                                # the first half is acknowledged, maybe not processed
    client = herd.client()
    body = {"reports": [{"device_id": "cb-down", "ts": int(time.time() * 1000), "lat": 47.0, "lon": 8.5}]}
    t0 = time.monotonic()
    resp = client.post("/v1/reports", json=body)
    assert resp.status_code == 503, resp.text
    assert int(resp.headers["retry-after"]) > 0 and "unavailable" in resp.json()["detail"]
    assert time.monotonic() - t0 < 15, "a dead broker must not hang a request"
    assert client.get("/healthz").json() == {"status": "ok"}      # reads keep working
    assert client.get("/v1/fences").status_code == 200
    os.kill(supervisor, signal.SIGCONT)          # it restarts the broker on its own log
    wait_until(lambda: (lambda p: p and p != broker and alive(p))(read_pid(home, "broker")), 60,
               what="the supervisor to restart the broker")
    stats = http_writer.write_reports(stack.api_url, second, key=key, batch_size=100, progress=False)
    assert stats.failed == 0, stats.as_dict()
    result = herd.reconcile(timeout=240)
    print(f"broker chaos: {result}")
    assert (result["lost"], result["duplicated"], result["unexpected"], result["duplicate_event_ids"]) == (0, 0, 0, 0), result
    client.close()


def test_fence_events_produced_after_broker_restart(ha_stack):
    """After the broker restart above, events of the new run must reach Kafka `fence.events`."""
    from confluent_kafka import Consumer, TopicPartition
    stack = ha_stack
    farm_id, key = stack.new_farm("after restart")
    herd = Herd.create(stack.api_url, farm_id, key, "ar", devices=8, steps=30, seed=4)
    kafka_writer.write_reports(stack.kafka_bootstrap, herd.reports, progress=False)
    result = herd.reconcile(timeout=180)
    assert result["lost"] == 0 and result["events"] > 0
    api_ids = set(herd.observed()["event_id"])
    consumer = Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": f"t-{time.time()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("fence.events", p, 0) for p in range(4)])
    seen: set[str] = set()
    farms: dict[str, str] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not api_ids <= seen:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            event = json.loads(msg.value())
            seen.add(event["event_id"])
            farms[event["event_id"]] = event.get("farm_id")
    consumer.close()
    assert api_ids <= seen, f"{len(api_ids - seen)} of {len(api_ids)} events never reached fence.events"
    # a consumer serving several farms routes each event by its farm_id (issue 20.5)
    assert {farms[i] for i in api_ids} == {farm_id}


def test_retried_batch_does_not_count_twice(stack):
    from tests.farmkit import Farm, square
    farm = Farm(stack, "retry")
    fence_id = farm.fence(square(8.50, 47.00))
    farm.device("retry-cow")
    t = farm.base_ts
    inside, outside = (8.505, 47.005), (8.505, 47.05)

    def post(*points):
        body = {"reports": [{"device_id": "retry-cow", "ts": ts, "lon": p[0], "lat": p[1]} for ts, p in points]}
        assert farm.api.post("/v1/reports", json=body).status_code == 202
    first = ((t, inside), (t + 10_000, inside), (t + 20_000, outside))
    post(*first)
    post(*first)                     # the client's retry: its first answer was lost
    post((t + 30_000, outside), (t + 40_000, outside))
    farm.wait_seen("retry-cow", t + 40_000)
    from fencing.model.timeutil import iso
    got = [(e["type"], e["ts"]) for e in farm.events(device_id="retry-cow")]
    assert got == [("enter", iso(t + 10_000)), ("exit", iso(t + 30_000))], got
    assert fence_id


def test_a_replica_away_at_the_take_over_gets_the_new_writer_as_soon_as_it_answers(ha_stack):
    """Job users are per node (fencing.model.job_user): a replica frozen while a new epoch is admitted
    still knows the old epoch's user, and a failover could make it a master. The new job keeps
    admitting its epoch until that replica answers: then the old user is gone there too."""
    from fencing.model.job_user import admit_everywhere, admit_missed, epoch_counter, job_user
    from tests.redis_kit import drop_scope, take_over
    stack = ha_stack
    redis = stack.redis
    scope = f"chaos{time.time_ns()}"
    redis.nodes_manager.initialize()
    replica = redis.get_replicas()[0]
    pid = read_pid(stack.env["HERDFENCE_HOME"], f"redis_{replica.port}")
    try:
        take_over(redis, tuple(stack.settings.redis_node), 1, scope)
        os.kill(pid, signal.SIGSTOP)
        try:
            redis.set(epoch_counter(scope), 2)
            missed = admit_everywhere(redis, 2, scope)
            assert missed == [replica.name], missed
            admitting = threading.Thread(target=admit_missed, args=(redis, 2, scope, 0.2), daemon=True)
            admitting.start()
            admitting.join(1.0)
            assert admitting.is_alive()                      # still waiting for the frozen replica
        finally:
            os.kill(pid, signal.SIGCONT)
        admitting.join(30)
        assert not admitting.is_alive()
        users = replica.redis_connection.execute_command("ACL", "USERS")
        assert job_user(2, scope) in users and job_user(1, scope) not in users
    finally:
        drop_scope(redis, scope)
