"""Live Redis Cluster slot migration: move whole hash slots to another master while clients keep running.

The standard resharding protocol (what `redis-cli --cluster reshard` does), one slot at a time:
  target: CLUSTER SETSLOT s IMPORTING <source id>
  source: CLUSTER SETSLOT s MIGRATING <target id>
  source: CLUSTER GETKEYSINSLOT s N  →  MIGRATE host port "" 0 timeout KEYS k1 .. kN   (until empty)
  target, source, then every other master: CLUSTER SETSLOT s NODE <target id>
Clients following ASK/MOVED (redis-py does) never lose an acknowledged write; single-key commands
never see TRYAGAIN because every group's keys share one slot and the whole slot moves.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import redis

MIGRATE_BATCH = 100
MIGRATE_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class Master:
    node_id: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def masters(client) -> dict[str, Master]:
    """address → master, from CLUSTER NODES of any node (a RedisCluster or a plain client)."""
    raw = _node_client(client).execute_command("CLUSTER NODES")
    text = raw.decode() if isinstance(raw, bytes) else raw
    if isinstance(text, dict):      # redis-py may parse it already
        out = {}
        for addr, info in text.items():
            if "master" in info.get("flags", "") and "fail" not in info.get("flags", ""):
                host, _, port = addr.partition("@")[0].rpartition(":")
                out[f"{host}:{port}"] = Master(info["node_id"], host, int(port))
        return out
    out: dict[str, Master] = {}
    for line in text.strip().splitlines():
        parts = line.split()
        node_id, addr, flags = parts[0], parts[1], parts[2]
        if "master" not in flags or "fail" in flags:
            continue
        host, _, port = addr.partition("@")[0].rpartition(":")
        out[f"{host}:{port}"] = Master(node_id, host, int(port))
    return out


def _node_client(client) -> redis.Redis:
    if isinstance(client, redis.Redis):
        return client
    node = client.get_default_node()
    return redis.Redis(host=node.host, port=node.port, decode_responses=True, socket_timeout=10)


_plain: dict[str, redis.Redis] = {}


def _conn(master: Master) -> redis.Redis:
    client = _plain.get(master.address)
    if client is None:
        client = _plain[master.address] = redis.Redis(host=master.host, port=master.port,
                                                      decode_responses=True, socket_timeout=10)
    return client


def owner(client, slot: int, nodes: dict[str, Master] | None = None) -> Master:
    """The master serving `slot` now (asked of the cluster, not of a client cache)."""
    from fencing.routing import slot_map
    nodes = nodes or masters(client)
    table, addresses = slot_map(_node_client(client))
    return nodes[addresses[int(table[slot])]]


def migrate_slot(client, slot: int, target_address: str, nodes: dict[str, Master] | None = None) -> dict:
    """Move one whole slot to the master at `target_address`; returns {"slot", "keys", "ms", "from", "to"}."""
    started = time.perf_counter()
    nodes = nodes or masters(client)
    target = nodes[target_address]
    source = owner(client, slot, nodes)
    if source.node_id == target.node_id:
        return {"slot": slot, "keys": 0, "ms": 0.0, "from": source.address, "to": target.address}
    src, dst = _conn(source), _conn(target)
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
    moved = 0
    while True:
        batch = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, MIGRATE_BATCH)
        if not batch:
            break
        src.execute_command("MIGRATE", target.host, target.port, "", 0, MIGRATE_TIMEOUT_MS, "KEYS", *batch)
        moved += len(batch)
    # the target first (it starts serving), then the source (it stops), then everyone else
    dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
    for m in nodes.values():
        if m.node_id not in (source.node_id, target.node_id):
            _conn(m).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
    _settle(slot, target, nodes)
    return {"slot": slot, "keys": moved, "ms": round(1000 * (time.perf_counter() - started), 2),
            "from": source.address, "to": target.address}


def _owner_seen_by(conn: redis.Redis, slot: int) -> str | None:
    """The node id that one master believes serves `slot` (from its own CLUSTER NODES)."""
    for line in conn.execute_command("CLUSTER", "NODES").splitlines():
        fields = line.split()
        if len(fields) < 8 or "master" not in fields[2]:
            continue
        for part in fields[8:]:
            if part.startswith("["):
                continue          # a migrating/importing marker, not ownership
            low, _, high = part.partition("-")
            if int(low) <= slot <= int(high or low):
                return fields[0]
    return None


def _settle(slot: int, target: Master, nodes: dict[str, Master], timeout_s: float = 10.0) -> None:
    """Until every master agrees that `target` serves the slot. Gossip from a node with a higher config
    epoch can override a fresh SETSLOT NODE (two nodes then redirect to each other: "TTL exhausted"
    in clients); bumping the target's epoch and re-asserting the owner makes the move win."""
    deadline = time.monotonic() + timeout_s
    while True:
        disagree = [m for m in nodes.values() if _owner_seen_by(_conn(m), slot) != target.node_id]
        if not disagree:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"slot {slot}: masters {[m.address for m in disagree]} do not agree that "
                               f"{target.address} serves it")
        _conn(target).execute_command("CLUSTER", "BUMPEPOCH")
        for m in [target] + disagree:
            _conn(m).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        time.sleep(0.05)


def migrate_slots(client, moves: dict[int, str]) -> list[dict]:
    """Move several slots (slot → target address), then refresh the cluster client's slot cache."""
    if not moves:
        return []
    nodes = masters(client)
    done = [migrate_slot(client, slot, target, nodes) for slot, target in sorted(moves.items())]
    refresh(client)
    return done


def refresh(client) -> None:
    """redis-py's slot → node cache goes stale after a move (it would follow MOVED anyway)."""
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:
        manager.initialize()
