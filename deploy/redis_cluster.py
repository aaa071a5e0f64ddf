"""The embedded Redis Cluster: 3 masters (+ optional replicas) on 127.0.0.1, and a client helper.

Node data dirs live in HERDFENCE_HOME/redis/<port>: redis.conf, nodes.conf, the append-only file
(appendfsync everysec, RDB preamble) and RDB snapshots. Everything a node acknowledged survives a
kill -9 of the process (only a kernel crash can lose up to a second). `up` never wipes: nodes that are
down restart from their own files and the cluster re-forms from each node's nodes.conf; only a node
without any cluster state gets slots or a MEET. `herdfence reset --yes` is the only delete.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from deploy import procs
from fencing.config import Settings
from fencing.model.redis_conn import connect  # noqa: F401 - the launchers' client

SLOTS = 16384
FOREIGN_PORT = 6379          # somebody else's Redis on this machine: never start or stop anything there
BUS_OFFSET = 10000           # Redis Cluster bus port = port + 10000


@dataclass(frozen=True)
class Node:
    port: int
    master_port: int | None  # None: a master; else the master this node replicates

    @property
    def name(self) -> str:
        return f"redis_{self.port}"


def nodes(settings: Settings, replicas: int = 0) -> list[Node]:
    masters = settings.embedded_redis_ports
    out = [Node(p, None) for p in masters]
    nxt = masters[-1] + 1
    for r in range(replicas):
        for m in masters:
            out.append(Node(nxt, m))
            nxt += 1
    return out


def recorded_nodes(settings: Settings) -> list[Node]:
    """The nodes a previous `up` started (so `down` and `status` see replicas too)."""
    out = []
    for name in procs.recorded_names(settings):
        if name.startswith("redis_"):
            rec = procs.read_record(settings, name)
            if rec is not None:
                master_of = rec.spec.env.get("HERDFENCE_REDIS_MASTER_OF")
                out.append(Node(int(name.split("_", 1)[1]), int(master_of) if master_of else None))
    return out


def _node_dir(settings: Settings, port: int) -> Path:
    return settings.home / "redis" / str(port)


def _write_conf(settings: Settings, port: int) -> Path:
    d = _node_dir(settings, port)
    d.mkdir(parents=True, exist_ok=True)
    conf = d / "redis.conf"
    conf.write_text("\n".join([
        f"port {port}", "bind 127.0.0.1", f"dir {d}", "daemonize no", 'logfile ""',
        "cluster-enabled yes", "cluster-config-file nodes.conf", "cluster-node-timeout 2000",
        # Losing one master must not take the other shards down (no replicas by default).
        "cluster-require-full-coverage no",
        # A replica may always take over (with replicas, the lag is milliseconds).
        "cluster-replica-validity-factor 0",
        # A system of record: every write in the AOF, fsynced each second; compact rewrites start
        # with an RDB image. An hourly snapshot as well, so a broken AOF still leaves a recent copy.
        # Both fork and write the whole data set: on 2 cores a snapshot every minute or a rewrite
        # every 64 MB of AOF took a core from the job under load (docs/operations.md).
        f"appendonly {'yes' if settings.redis_appendfsync != 'off' else 'no'}",
        f"appendfsync {settings.redis_appendfsync if settings.redis_appendfsync != 'off' else 'everysec'}",
        "aof-use-rdb-preamble yes", "auto-aof-rewrite-percentage 200", "auto-aof-rewrite-min-size 1gb",
        f'save "{settings.redis_save}"',
        # Bounded memory: writers get an OOM error (the API answers 507), nothing is evicted.
        f"maxmemory {settings.redis_maxmemory}", "maxmemory-policy noeviction",
    ]) + "\n")
    return conf


def _spec(settings: Settings, node: Node) -> procs.ProcSpec:
    redis_bin = shutil.which("redis-server")
    if redis_bin is None:
        raise procs.DeployError("redis-server is required: run make setup")
    # Redis rewrites its cmdline to "redis-server 127.0.0.1:<port> [cluster]" once running; before
    # that it is ".../<port>/redis.conf": the bare port matches both.
    env = {} if node.master_port is None else {"HERDFENCE_REDIS_MASTER_OF": str(node.master_port)}
    return procs.ProcSpec(name=node.name, argv=[redis_bin, str(_write_conf(settings, node.port))],
                          markers=["redis-server", str(node.port)], port=node.port,
                          port_env="HERDFENCE_EMBEDDED_REDIS_PORT", env=env)


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True, socket_timeout=5)


def cluster_info(port: int) -> dict:
    return _client(port).cluster("INFO")


# --- forming the cluster -------------------------------------------------------------------------
def _slot_ranges(n: int) -> list[tuple[int, int]]:
    """Even split of the 16384 slots, as redis-cli --cluster create does."""
    bounds = [round(i * SLOTS / n) for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(n)]


def _node_id(port: int) -> str:
    return _client(port).execute_command("CLUSTER", "MYID")


def _owns_slots(port: int) -> bool:
    me = next(l for l in _client(port).execute_command("CLUSTER", "NODES").splitlines() if "myself" in l)
    return len(me.split()) > 8        # fields after the 8th are slot ranges


def _known(port: int) -> int:
    return int(cluster_info(port)["cluster_known_nodes"])


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise procs.DeployError(f"Redis Cluster: timed out waiting for {what}")
        time.sleep(0.1)


def _form(all_nodes: list[Node]) -> None:
    """Assign slots to the masters that own none, MEET everyone, attach replicas."""
    masters = [n for n in all_nodes if n.master_port is None]
    if not any(int(cluster_info(m.port)["cluster_slots_assigned"]) for m in masters):
        for m, (lo, hi) in zip(masters, _slot_ranges(len(masters))):
            _client(m.port).execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
    first = all_nodes[0].port
    for n in all_nodes[1:]:
        _client(first).execute_command("CLUSTER", "MEET", "127.0.0.1", n.port)
    _wait(lambda: all(_known(n.port) >= len(all_nodes) for n in all_nodes), 20, "nodes to meet")
    for n in all_nodes:
        if n.master_port is None:
            continue
        r = _client(n.port)
        # Only a fresh node: a replica that took over its master's slots keeps them.
        if r.execute_command("ROLE")[0] == "master" and not _owns_slots(n.port):
            master_id = _node_id(n.master_port)
            # A replica can only follow a master it already knows as such: retry briefly.
            _wait(lambda: _try_replicate(r, master_id), 20, f"{n.port} to replicate {n.master_port}")


def _try_replicate(r: redis.Redis, master_id: str) -> bool:
    try:
        r.execute_command("CLUSTER", "REPLICATE", master_id)
        return True
    except redis.ResponseError:
        return False


def wait_ok(port: int, timeout: float = 30.0) -> None:
    _wait(lambda: cluster_info(port)["cluster_state"] == "ok", timeout, "cluster_state:ok")


def _check_ports(all_nodes: list[Node]) -> None:
    for n in all_nodes:
        if FOREIGN_PORT in (n.port, n.port + BUS_OFFSET):
            raise procs.DeployError(f"refusing to use port {FOREIGN_PORT} (a Redis that is not ours); "
                                    "set HERDFENCE_EMBEDDED_REDIS_PORT")


PORT_ENV = "HERDFENCE_EMBEDDED_REDIS_PORT"


def ports_to_take(settings: Settings, replicas: int = 0) -> list[int]:
    """The ports the embedded nodes that are not running will listen on, their cluster-bus ports
    included (a taken bus port would make redis exit right after start)."""
    if settings.redis is not None:
        return []
    return [port for n in nodes(settings, replicas) if procs.alive_record(settings, n.name) is None
            for port in (n.port, n.port + BUS_OFFSET)]


def up(settings: Settings, replicas: int = 0) -> None:
    """Start the nodes that are down and make sure the cluster is formed and ok (embedded only)."""
    if settings.redis is not None:
        connect(settings).ping()      # external: only check it answers
        return
    all_nodes = nodes(settings, replicas)
    _check_ports(all_nodes)
    dead = [n for n in all_nodes if procs.alive_record(settings, n.name) is None]
    for port in ports_to_take(settings, replicas):
        procs.ensure_port_free(port, PORT_ENV)
    recs = {n.port: procs.start(settings, _spec(settings, n)) for n in dead}
    for n in dead:
        procs.wait_for_port(n.port, 15, recs[n.port], settings)
    _form(all_nodes)
    for n in all_nodes:          # a restarted node says "fail" until it has caught up: ask each
        wait_ok(n.port)


def down(settings: Settings) -> list[str]:
    return procs.stop_many(settings, [n.name for n in recorded_nodes(settings)])


def status(settings: Settings) -> dict:
    if settings.redis is not None:
        try:
            ok = connect(settings, socket_timeout=3).ping()
        except Exception:  # noqa: BLE001 - any error: not reachable
            ok = False
        return {"pid": None, "external": settings.redis, "ok": bool(ok)}
    known = recorded_nodes(settings) or nodes(settings)
    node_status = {}
    for n in known:
        rec = procs.alive_record(settings, n.name)
        node_status[n.port] = {"pid": rec.pid if rec else None,
                               "started_as": "master" if n.master_port is None else "replica"}
        if rec is not None:
            try:
                mem = _client(n.port).info("memory")
                node_status[n.port].update(used_memory=int(mem["used_memory"]), maxmemory=int(mem["maxmemory"]))
            except redis.RedisError:
                pass
    state = None
    for port, st in node_status.items():
        if st["pid"]:
            try:
                state = cluster_info(port)["cluster_state"]
                break
            except redis.RedisError:
                continue
    # Every node must run: after a failover the cluster is ok, but `up` should restart the dead one.
    all_alive = all(st["pid"] for st in node_status.values())
    first = settings.embedded_redis_port
    return {"pid": node_status.get(first, {}).get("pid"), "port": first, "cluster_state": state,
            "nodes": {str(p): st for p, st in node_status.items()},
            "ok": state == "ok" and all_alive}
