"""Live slot migration (fencing.elastic.slots) on a Redis Cluster of its own (ports 13201-13203): back-to-back
whole-slot moves under a concurrent writer never orphan a slot or lose a write, and a move that fails
half-way is rolled back to a consistent slot."""
from __future__ import annotations

import functools
import os
import random
import threading
import time

import pytest
import redis
from redis.cluster import RedisCluster

from deploy import redis_cluster
from fencing.elastic import slots

from tests.redis_kit import own_cluster

PORT = 13201 + int(os.environ.get("HERDFENCE_TEST_PORT_OFFSET", "0"))   # bus ports 23201-23203
GROUPS = [f"{{slots-test:{i}}}" for i in range(200)]                     # one hash tag → one slot each


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with own_cluster(tmp_path_factory.mktemp("slots-home"), PORT) as rc:
        yield rc


class Writer(threading.Thread):
    """Writes (single commands and pipelines) into the groups' slots while they move; remembers the last
    acknowledged value of every key, every client error and every read that missed its own write."""

    def __init__(self, port: int, groups: list[str]):
        super().__init__(daemon=True)
        self.rc = RedisCluster(host="127.0.0.1", port=port, decode_responses=True, socket_timeout=5)
        self.groups, self.written, self.errors, self.stale_reads = groups, {}, [], []
        self.stop, self.lock = threading.Event(), threading.Lock()

    def run(self):
        n = 0
        while not self.stop.is_set():
            n += 1
            g = random.choice(self.groups)
            batch = {f"{g}:k{random.randrange(8)}": f"v{n}.{i}" for i in range(1 if n % 3 else 4)}
            try:
                if len(batch) == 1:
                    (key, value), = batch.items()
                    self.rc.set(key, value)
                    if self.rc.get(key) != value:
                        self.stale_reads.append(key)
                else:
                    pipe = self.rc.pipeline()
                    for key, value in batch.items():
                        pipe.set(key, value)
                    pipe.execute()
                with self.lock:
                    self.written.update(batch)
            except redis.RedisError as exc:    # e.g. "TTL exhausted": a slot nobody serves
                self.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)

    def finish(self) -> dict[str, str]:
        self.stop.set()
        self.join(10)
        self.rc.close()
        return self.written


@functools.cache
def _node(port: int) -> redis.Redis:
    return redis.Redis(port=port, decode_responses=True)


def _owners(slot: int) -> dict[int, str | None]:
    """master port → the owner id of `slot` as that master sees it."""
    return {p: slots._owner_seen_by(_node(p), slot) for p in (PORT, PORT + 1, PORT + 2)}


def test_back_to_back_moves_keep_every_slot_owned_and_every_write(cluster):
    rc = cluster
    pipe = rc.pipeline()
    for g in GROUPS:
        for k in range(5):
            pipe.set(f"{g}:k{k}", "initial")     # k5..k7 appear only during the moves
    pipe.execute()
    written = {f"{g}:k{k}": "initial" for g in GROUPS for k in range(5)}
    nodes = slots.masters(rc)
    by_id = {m.node_id: a for a, m in nodes.items()}
    group_slot = {g: rc.keyslot(g) for g in GROUPS}
    writer = Writer(PORT, GROUPS)
    writer.start()
    rng, moved = random.Random(7), 0
    try:
        for rnd in range(70):                  # 70 rounds of 7 sorted moves, as the elastic step makes them
            moves = {}
            for g in rng.sample(GROUPS, 7):
                here = by_id[slots._owner_seen_by(_node(PORT), group_slot[g])]
                moves[group_slot[g]] = rng.choice([a for a in nodes if a != here])
            done = slots.migrate_slots(rc, moves)
            moved += len(done)
            time.sleep(0.1)                    # gossip that would contest a move has time to arrive
            for slot, target in moves.items():
                owners = _owners(slot)
                assert set(owners.values()) == {nodes[target].node_id}, (rnd, slot, target, owners)
    finally:
        written.update(writer.finish())
    assert moved == 490 and not writer.errors and not writer.stale_reads, (writer.errors[:5], writer.stale_reads[:5])
    assert len(writer.written) > 100           # the writer did write while slots moved
    wrong = {k: (rc.get(k), v) for k, v in written.items() if rc.get(k) != v}
    assert not wrong, f"{len(wrong)} keys lost or stale, e.g. {list(wrong.items())[:3]}"
    for port in (PORT, PORT + 1, PORT + 2):
        info = redis_cluster.cluster_info(port)
        assert info["cluster_state"] == "ok" and int(info["cluster_slots_assigned"]) == 16384, (port, info)


def test_a_move_that_fails_half_way_is_rolled_back(cluster, monkeypatch):
    rc = cluster
    g = GROUPS[0]
    slot = rc.keyslot(g)
    for k in range(30):
        rc.set(f"{g}:r{k}", f"r{k}")
    source = slots.owner(rc, slot)
    target = next(m for a, m in sorted(slots.masters(rc).items()) if m.node_id != source.node_id)
    real_conn = slots._conn

    class FailingSource:                       # the 3rd MIGRATE batch fails: some keys are on the target
        calls = 0

        def __init__(self, conn):
            self.conn = conn

        def execute_command(self, *args):
            if args[0] == "MIGRATE":
                FailingSource.calls += 1
                if FailingSource.calls == 3:
                    raise redis.ConnectionError("injected: connection lost")
            return self.conn.execute_command(*args)

        def __getattr__(self, name):
            return getattr(self.conn, name)

    monkeypatch.setattr(slots, "MIGRATE_BATCH", 5)
    monkeypatch.setattr(slots, "_conn", lambda host, port: FailingSource(real_conn(host, port))
                        if (host, port) == (source.host, source.port) else real_conn(host, port))
    writer = Writer(PORT, [g])
    writer.start()
    time.sleep(0.1)
    with pytest.raises(slots.SlotMigrationError, match=f"slot {slot} .*rolled back"):
        slots.migrate_slot(rc, slot, target.address)
    written = writer.finish()
    monkeypatch.undo()
    # (reads may miss keys for the few ms they take to go back: see slots._roll_back; no write is lost)
    assert FailingSource.calls == 3 and not writer.errors, writer.errors[:5]
    assert set(_owners(slot).values()) == {source.node_id}
    for port in (PORT, PORT + 1, PORT + 2):    # no "[slot->-id]" / "[slot-<-id]" marker left anywhere
        assert f"[{slot}-" not in _node(port).execute_command("CLUSTER", "NODES")
    assert _node(target.port).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert all(rc.get(f"{g}:r{k}") == f"r{k}" for k in range(30))
    assert all(rc.get(k) == v for k, v in written.items())
    done = slots.migrate_slot(rc, slot, target.address)      # and the slot still moves afterwards
    assert done["keys"] >= 30 and set(_owners(slot).values()) == {target.node_id}


def test_a_move_with_a_master_down_is_refused_before_it_starts(cluster):
    slot = cluster.keyslot(GROUPS[1])
    before = slots.owner(cluster, slot)
    with pytest.raises(slots.SlotMigrationError, match="not a live master"):
        slots.migrate_slot(cluster, slot, "127.0.0.1:1")
    target = next(a for a, m in slots.masters(cluster).items() if m != before)
    down = {**slots.masters(cluster), "127.0.0.1:1": slots.Master("0" * 40, "127.0.0.1", 1)}
    with pytest.raises(slots.SlotMigrationError, match="master 127.0.0.1:1 does not answer"):
        slots.migrate_slot(cluster, slot, target, down)
    assert set(_owners(slot).values()) == {before.node_id}
    assert "[" not in _node(before.port).execute_command("CLUSTER", "NODES")
