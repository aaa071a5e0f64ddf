"""deploy/: real broker + Redis Cluster processes on ports of their own (no Spark, no job)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy import broker, procs, redis_cluster, stack
from fencing.config import REPORT_PARTITIONS, load_settings
from deploy.supervisor import RestartPolicy, Supervisor

HERDFENCE = str(Path(sys.executable).parent / "herdfence")
PORTS = {"HERDFENCE_EMBEDDED_KAFKA_PORT": "15092", "HERDFENCE_EMBEDDED_REDIS_PORT": "15101",
         "HERDFENCE_API_PORT": "15800"}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("HERDFENCE_")}
    e.update(PORTS, HERDFENCE_HOME=str(tmp_path_factory.mktemp("deploy-home")), HERDFENCE_OWNER_PID=str(os.getpid()))
    return e


@pytest.fixture(scope="module")
def infra(env):
    """Broker + 3-master Redis Cluster, started once for this module, stopped at the end."""
    settings = load_settings(env)
    t0 = time.monotonic()
    try:                                          # whatever fails to start, stop what did start
        # a broker started on its durable log: nobody has to clear a checkpoint
        assert broker.up(settings) is False
        assert procs.alive_record(settings, broker.NAME) and procs.alive_record(settings, broker.STORE)
        redis_cluster.up(settings)
        print(f"broker + redis up in {time.monotonic() - t0:.1f} s")
        yield settings
    finally:
        stack.down(settings)


def test_topics_exist_with_partitions(infra):
    parts = broker.topic_partitions(infra)
    assert parts["gps.reports"] == REPORT_PARTITIONS
    assert parts["gps.reports.dlq"] == 1
    assert parts["fence.events"] == REPORT_PARTITIONS
    assert broker.ensure_topics(infra)["gps.reports"] == REPORT_PARTITIONS   # idempotent


def test_redis_cluster_three_masters_cover_all_slots(infra):
    info = redis_cluster.cluster_info(infra.embedded_redis_port)
    assert info["cluster_state"] == "ok"
    assert int(info["cluster_slots_assigned"]) == 16384
    assert int(info["cluster_size"]) == 3
    rc = redis_cluster.connect(infra)
    assert len(rc.get_primaries()) == 3
    for i in range(30):                      # keys land on every shard
        rc.set(f"k{i}", i)
    assert rc.get("k7") == "7"


def test_up_again_leaves_running_components_alone(infra):
    pids = {n: procs.read_record(infra, n).pid for n in ("broker", "redis_15101")}
    t0 = time.monotonic()
    assert broker.up(infra) is False
    redis_cluster.up(infra)
    assert time.monotonic() - t0 < 2
    assert {n: procs.read_record(infra, n).pid for n in pids} == pids


def test_restarted_node_rejoins_without_recreate(infra):
    procs.stop(infra, "redis_15102")
    redis_cluster.up(infra)                   # starts only 15102, with its nodes.conf
    info = redis_cluster.cluster_info(15102)
    assert info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == 3


def test_status_json_via_cli(infra, env):
    done = subprocess.run([HERDFENCE, "status", "--json"], env=env, capture_output=True, text=True, timeout=60)
    st = json.loads(done.stdout)
    comps = st["components"]
    assert {k: comps["broker"][k] for k in ("pid", "port", "ok", "storage")} == \
        {"pid": procs.read_record(infra, "broker").pid, "port": 15092, "ok": True, "storage": "disk"}
    assert comps["broker"]["store"]["pid"] == procs.read_record(infra, "broker_store").pid
    assert comps["redis"]["ok"] is True and comps["redis"]["cluster_state"] == "ok"
    assert comps["job"]["ok"] is False and comps["api"]["ok"] is False     # not started here
    assert st["ok"] is False and done.returncode == 1


def test_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        settings = load_settings({"HERDFENCE_HOME": str(tmp_path), "HERDFENCE_EMBEDDED_KAFKA_PORT": str(port)})
        with pytest.raises(procs.DeployError, match=f"port {port} is in use by another process; "
                                                    "set HERDFENCE_EMBEDDED_KAFKA_PORT or stop it"):
            broker.up(settings)


def test_a_taken_port_stops_up_before_anything_starts(tmp_path):
    """A taken Redis cluster-bus port is found before the broker starts: `up` leaves nothing running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDFENCE_")}
    env.update(HERDFENCE_HOME=str(tmp_path), HERDFENCE_EMBEDDED_KAFKA_PORT="15192",
               HERDFENCE_EMBEDDED_REDIS_PORT="15201", HERDFENCE_API_PORT="15900", HERDFENCE_OWNER_PID=str(os.getpid()))
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 15201 + redis_cluster.BUS_OFFSET + 1))     # the second master's bus port
        s.listen()
        done = subprocess.run([HERDFENCE, "up", "--detach"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"port {15202 + redis_cluster.BUS_OFFSET} is in use by another process" in done.stderr, done.stderr
    settings = load_settings(env)
    assert [name for name in ("broker", "broker_store", "redis_15201", "api", "job")
            if procs.read_record(settings, name) is not None] == []
    assert not procs.port_open(15192)


def test_never_uses_port_6379(tmp_path):
    settings = load_settings({"HERDFENCE_HOME": str(tmp_path), "HERDFENCE_EMBEDDED_REDIS_PORT": "6378"})
    with pytest.raises(procs.DeployError, match="6379"):
        redis_cluster.up(settings)


def test_is_alive_checks_cmdline():
    assert procs.is_alive(os.getpid(), [])
    assert not procs.is_alive(os.getpid(), ["no-such-marker-xyz"])   # a reused pid is not ours
    assert not procs.is_alive(None)


def test_supervisor_restarts_with_backoff_then_gives_up(tmp_path):
    settings = load_settings({"HERDFENCE_HOME": str(tmp_path)})
    spec = procs.ProcSpec(name="crasher", argv=[sys.executable, "-c", "import sys; sys.exit(3)", "crasher-marker"],
                          markers=["crasher-marker"])
    procs.start(settings, spec)
    sup = Supervisor(settings, names=("crasher",), policy=RestartPolicy(max_attempts=2, base_delay_s=0.05),
                     log=lambda _msg: None)
    deadline = time.monotonic() + 10
    while not procs.read_record(settings, "crasher").gave_up and time.monotonic() < deadline:
        sup.step()
        time.sleep(0.05)
    rec = procs.read_record(settings, "crasher")
    assert rec.gave_up and rec.restarts == 2
    assert json.loads((tmp_path / "run" / "crasher.json").read_text())["restarts"] == 2


def test_down_stops_everything_by_pid(infra, env):
    pids = [procs.read_record(infra, n).pid for n in procs.recorded_names(infra)]
    assert len(pids) == 5                      # broker, its object store, 3 redis nodes
    t0 = time.monotonic()
    done = subprocess.run([HERDFENCE, "down"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    print(f"down in {time.monotonic() - t0:.1f} s")
    assert not any(procs.is_alive(p) for p in pids)
    assert not list(infra.run_dir.glob("*.pid")) and not list(infra.run_dir.glob("*.json"))
    assert stack.status(infra)["ok"] is False
