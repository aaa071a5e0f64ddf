"""Live Redis Cluster slot migration: move whole hash slots to another master while clients keep running.

The standard resharding protocol (what `redis-cli --cluster reshard` does), one slot at a time:
  target: CLUSTER SETSLOT s IMPORTING <source id>
  source: CLUSTER SETSLOT s MIGRATING <target id>
  source: CLUSTER GETKEYSINSLOT s N  →  MIGRATE host port "" 0 timeout REPLACE KEYS k1 .. kN   (until empty)
  target: its config epoch made the strict maximum of the masters'          (1)
  target, then source: CLUSTER SETSLOT s NODE <target id>
  wait until every node (masters and replicas) sees the target as the owner  (2)
Clients following ASK/MOVED (redis-py does) never lose an acknowledged write; single-key commands
never see TRYAGAIN because every group's keys share one slot and the whole slot moves.

Why (1). Gossip settles conflicting claims of a slot by config epoch. A node that still claims the slot
(the source until its SETSLOT NODE, or its pings still in flight) wins over the target if its epoch is
higher, and the target then *deletes* the slot's keys (it lost a slot it had keys in): the slot is left
owned by nobody (clients loop on MOVED, "TTL exhausted") and its keys are gone. Redis 7.0 bumps the
target's epoch on SETSLOT NODE only if the target believes it is not already the highest
(clusterBumpConfigEpochWithoutConsensus), a belief from gossip that lags behind back-to-back moves: seen
in 19 of 20 reproduction runs, within 1-36 rounds of 7 moves. So each master is asked for its own epoch: they
must be distinct (Redis resolves equal epochs by bumping one, possibly above the target) and the target's
the highest (CLUSTER BUMPEPOCH until it is). Then no other claim of the slot can win.
Why (2), and why the other masters are not sent SETSLOT NODE: a node told so directly may still hold an
old, lower epoch for the target, and take a late ping of the source for the newer claim; learning the
owner from the target's own gossip brings its epoch along. A move ends only when every node agrees, so
the next move's epoch bump cannot meet a stale view.

A failure before the target claims the slot rolls the move back (both sides STABLE, keys back to the
source); after it, the move completes. Either way SlotMigrationError says what happened and no slot is
left half-migrated.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import redis

MIGRATE_BATCH = 100
MIGRATE_TIMEOUT_MS = 5000
AGREE_TIMEOUT_S = 10.0


class SlotMigrationError(RuntimeError):
    """A slot move failed; the message says which slot and who serves it now."""


@dataclass(frozen=True)
class Master:
    node_id: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def masters(client) -> dict[str, Master]:
    """address → live master, from CLUSTER NODES of any node (a RedisCluster or a plain client)."""
    return {f"{n['host']}:{n['port']}": Master(n["id"], n["host"], n["port"])
            for n in _cluster_nodes(_node_client(client)) if "master" in n["flags"] and n["live"]}


def _cluster_nodes(conn: redis.Redis) -> list[dict]:
    """CLUSTER NODES of one node: id, host, port, flags, owned slots (that node's view), live."""
    raw = conn.execute_command("CLUSTER", "NODES")
    out = []
    for line in (raw.decode() if isinstance(raw, bytes) else raw).strip().splitlines():
        f = line.split()
        host, _, port = f[1].partition("@")[0].rpartition(":")
        flags = f[2].split(",")
        slots = []
        for part in f[8:]:
            if not part.startswith("["):       # "[s->-id]" / "[s-<-id]": migrating markers, not ownership
                low, _, high = part.partition("-")
                slots.append((int(low), int(high or low)))
        out.append({"id": f[0], "host": host, "port": int(port), "flags": flags, "slots": slots,
                    "live": not {"fail", "fail?", "handshake", "noaddr"} & set(flags)})
    return out


def _node_client(client) -> redis.Redis:
    if isinstance(client, redis.Redis):
        return client
    node = client.get_default_node()
    return _conn(node.host, node.port)


_plain: dict[str, redis.Redis] = {}


def _conn(host: str, port: int) -> redis.Redis:
    client = _plain.get(f"{host}:{port}")
    if client is None:
        client = _plain[f"{host}:{port}"] = redis.Redis(host=host, port=port, decode_responses=True,
                                                        socket_timeout=10)
    return client


def _owner_seen_by(conn: redis.Redis, slot: int) -> str | None:
    """The node id that one node believes serves `slot`."""
    for n in _cluster_nodes(conn):
        if "master" in n["flags"] and any(low <= slot <= high for low, high in n["slots"]):
            return n["id"]
    return None


def owner(client, slot: int, nodes: dict[str, Master] | None = None) -> Master:
    """The live master serving `slot` now (asked of the cluster, not of a client cache)."""
    nodes = nodes or masters(client)
    node_id = _owner_seen_by(_node_client(client), slot)
    found = next((m for m in nodes.values() if m.node_id == node_id), None)
    if found is None:
        raise SlotMigrationError(f"slot {slot} is served by no live master (owner id {node_id})")
    return found


def migrate_slot(client, slot: int, target_address: str, nodes: dict[str, Master] | None = None) -> dict:
    """Move one whole slot to the master at `target_address`; returns {"slot", "keys", "ms", "from", "to"}."""
    started = time.perf_counter()
    nodes = nodes or masters(client)
    target = nodes.get(target_address)
    if target is None:
        raise SlotMigrationError(f"slot {slot}: {target_address} is not a live master ({sorted(nodes)})")
    # every master must answer: one that is down could be neither outbid (epoch) nor checked (settle)
    for n in _cluster_nodes(_node_client(client)):
        if "master" in n["flags"] and n["slots"] and not n["live"]:
            raise SlotMigrationError(f"slot {slot} not moved: master {n['host']}:{n['port']} is failing")
    for m in nodes.values():
        try:
            _conn(m.host, m.port).ping()
        except redis.RedisError as exc:
            raise SlotMigrationError(f"slot {slot} not moved: master {m.address} does not answer ({exc})") from exc
    source = owner(client, slot, nodes)
    if source.node_id == target.node_id:
        return {"slot": slot, "keys": 0, "ms": 0.0, "from": source.address, "to": target.address}
    src, dst = _conn(source.host, source.port), _conn(target.host, target.port)
    try:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        moved = 0
        while batch := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, MIGRATE_BATCH):
            # REPLACE: while a key is on the source, the source's copy is the live one; a copy on the target
            # can only be left over by an interrupted MIGRATE
            src.execute_command("MIGRATE", target.host, target.port, "", 0, MIGRATE_TIMEOUT_MS,
                                "REPLACE", "KEYS", *batch)
            moved += len(batch)
        _make_epoch_max(target, nodes)
        # the target first: from here on it serves the slot (and its epoch makes that claim win)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
    except Exception as exc:
        notes = _roll_back(slot, source, target)
        raise SlotMigrationError(f"slot {slot} {source.address} → {target.address} failed ({exc}); rolled back, "
                                 f"{source.address} serves it{'; ' if notes else ''}{'; '.join(notes)}") from exc
    try:   # the source stops serving it (and its MIGRATING state ends)
        src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
    except redis.RedisError as exc:   # the target's claim wins anyway: its epoch is higher
        _settle(slot, target)
        raise SlotMigrationError(f"slot {slot} moved to {target.address}, but {source.address} "
                                 f"was not told: {exc}") from exc
    # The other nodes learn the owner from the target's gossip, together with its epoch. Not told directly
    # (redis-cli does): with a stale record of the target's epoch, a node told so can still take the
    # source's last pings for the newer claim.
    _settle(slot, target)
    return {"slot": slot, "keys": moved, "ms": round(1000 * (time.perf_counter() - started), 2),
            "from": source.address, "to": target.address}


def _epochs(nodes: dict[str, Master]) -> dict[str, int]:
    """node id → config epoch, as each master reports its own (not a possibly stale gossip view)."""
    return {m.node_id: int(_conn(m.host, m.port).cluster("INFO")["cluster_my_epoch"]) for m in nodes.values()}


def _make_epoch_max(target: Master, nodes: dict[str, Master], timeout_s: float = AGREE_TIMEOUT_S) -> None:
    """Until the masters' epochs are distinct and the target's is the highest (module doc: why)."""
    deadline = time.monotonic() + timeout_s
    while True:
        epochs = _epochs(nodes)
        mine = epochs.pop(target.node_id)
        others = max(epochs.values(), default=-1)
        if mine > others and len(set(epochs.values())) == len(epochs):
            return
        if time.monotonic() > deadline:
            raise SlotMigrationError(f"{target.address} could not get the highest config epoch "
                                     f"(its {mine}, others {sorted(epochs.values())})")
        if mine <= others:
            # bumps only if the target *knows* a higher epoch: else wait for gossip and try again
            _conn(target.host, target.port).execute_command("CLUSTER", "BUMPEPOCH")
        time.sleep(0.01)


def _roll_back(slot: int, source: Master, target: Master) -> list[str]:
    """Undo a move the target has not claimed yet: both sides STABLE and the keys already on the target back
    to the source. Keys can only go back once the source has stopped redirecting to the target, so for
    the few ms that takes they are not visible; a write to one of them meanwhile is newer and is kept.
    Best effort (a dead node's keys are gone with it); returns what could not be done."""
    src, dst = _conn(source.host, source.port), _conn(target.host, target.port)
    notes = []
    try:
        src.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")    # the source serves the slot alone again
        for _ in range(10):
            _keys_back(dst, source, slot)
            dst.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
            if not dst.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot):
                break
            # a client sent on by the source before its STABLE wrote here after the last batch: again
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
    except redis.RedisError as exc:
        notes.append(f"moving keys back: {exc}")
    for name, conn in ((source.address, src), (target.address, dst)):
        try:
            conn.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
            if conn is dst and (left := dst.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)):
                notes.append(f"{left} keys of slot {slot} stranded on {name}")
        except redis.RedisError as exc:
            notes.append(f"{name}: {exc}")
    return notes


def _keys_back(dst: redis.Redis, source: Master, slot: int) -> None:
    """MIGRATE the slot's keys from the (still importing) target back to the (stable) source."""
    while batch := dst.execute_command("CLUSTER", "GETKEYSINSLOT", slot, MIGRATE_BATCH):
        for key in batch:
            try:
                dst.execute_command("MIGRATE", source.host, source.port, key, 0, MIGRATE_TIMEOUT_MS)
            except redis.ResponseError as exc:
                if "BUSYKEY" not in str(exc):
                    raise
                # written on the source since it took the slot back: newer than this copy
                dst.pipeline(transaction=False).execute_command("ASKING").delete(key).execute()


def _settle(slot: int, target: Master, timeout_s: float = AGREE_TIMEOUT_S) -> None:
    """Until every live node, replicas too, sees the target as the owner: a node with a stale view could
    otherwise contest the claim once a later move raises the old owner's epoch."""
    deadline = time.monotonic() + timeout_s
    while True:
        pending = []
        for n in _cluster_nodes(_conn(target.host, target.port)):
            if n["live"]:
                try:
                    seen = _owner_seen_by(_conn(n["host"], n["port"]), slot)
                except redis.RedisError:
                    continue              # went down meanwhile: nothing to wait for
                if seen != target.node_id:
                    pending.append(f"{n['host']}:{n['port']}")
        if not pending:
            return
        if time.monotonic() > deadline:
            raise SlotMigrationError(f"slot {slot}: nodes {pending} do not agree that {target.address} serves it")
        time.sleep(0.02)


def migrate_slots(client, moves: dict[int, str]) -> list[dict]:
    """Move several slots (slot → target address), then refresh the cluster client's slot cache. Stops
    at the first failure (SlotMigrationError); the slots moved before it stay moved."""
    if not moves:
        return []
    nodes = masters(client)
    try:
        return [migrate_slot(client, slot, target, nodes) for slot, target in sorted(moves.items())]
    finally:
        refresh(client)


def refresh(client) -> None:
    """redis-py's slot → node cache goes stale after a move (it would follow MOVED anyway)."""
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:
        manager.initialize()
