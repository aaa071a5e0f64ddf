"""Routing table: H3 cell group → Spark partition, aligned with the Redis node that owns the group's slot.

Partition p is aligned with Redis master p % n_nodes (masters sorted by address). A group without an
explicit route goes to one of the partitions aligned with its slot's node (Amoeba alignment); the
elastic controller adds explicit routes (and moves slots) in later versions. The table is published in
Redis (`routing`) and read by the job at every micro-batch.
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field

import numpy as np
import orjson
from redis.crc import key_slot

from fencing.model import keys

DEFAULT_PARTITIONS = 6
# A split (hot) group is routed by device bucket: crc32(farm/device) % SPLIT_BUCKETS. Buckets, not the
# group's H3 children, because herds are tight blobs that cross child boundaries as they walk: with res-7
# children one child can hold a whole gathered herd (max/mean stuck at 1.7-2.0), with res-8 children a
# herd crossing a boundary swings a partition by +-30% between two windows. A device's bucket never
# changes, so a bucket's load follows the devices, not the ground. Fence and state keys stay at group
# level (one slot per group), so any partition can serve any bucket.
SPLIT_BUCKETS = 36


@dataclass(frozen=True)
class RoutingTable:
    version: int
    partitions: int
    slot_node: np.ndarray                      # uint8[16384]: slot → index of its master
    nodes: tuple[str, ...]                     # master addresses, sorted; index = node index
    routes: dict[str, int] = field(default_factory=dict)   # explicit group → partition
    aligned: bool = True
    # hot groups split by device bucket: group → {bucket ("#k"): partition}; a bucket not listed is spread
    # by its hash. Fence and state keys stay at group level (one slot per group).
    splits: dict[str, dict[str, int]] = field(default_factory=dict)
    # groups whose partition changed in this version: the tasks drop exactly these from their caches
    moved: tuple[str, ...] = ()
    shed: bool = False                         # load shedding on (set by the elastic controller)

    def partition_of_child(self, group: str, child: str | None) -> int:
        """Partition of a device whose batch ends in `group` and whose split bucket is `child`
        (`bucket_of(device key)`)."""
        split = self.splits.get(group)
        if split is not None and child is not None:
            explicit = split.get(child)
            if explicit is not None:
                return explicit
            # a bucket the controller has not placed (no load when it planned): spread by its hash, so
            # unplaced buckets of a hot group do not all pile onto the group's partition
            return zlib.crc32(child.encode()) % self.partitions
        return self.partition_of(group)

    def partition_of(self, group: str) -> int:
        explicit = self.routes.get(group)
        if explicit is not None:
            return explicit
        spread = zlib.crc32(group.encode())
        if not self.aligned:
            return spread % self.partitions
        node = int(self.slot_node[group_slot(group)])
        mine = [p for p in range(self.partitions) if p % len(self.nodes) == node] or list(range(self.partitions))
        return mine[spread % len(mine)]

    def node_of_partition(self, partition: int) -> int:
        return partition % len(self.nodes)

    def to_json(self) -> bytes:
        return orjson.dumps({"version": self.version, "partitions": self.partitions, "routes": self.routes,
                             "aligned": self.aligned, "splits": self.splits, "moved": list(self.moved),
                             "shed": self.shed})

    def spec(self) -> dict:
        return orjson.loads(self.to_json())

    def evolve(self, **changes) -> "RoutingTable":
        """The next version with `changes` (routes, splits, moved, aligned, shed, partitions)."""
        fields = {"version": self.version + 1, "partitions": self.partitions, "slot_node": self.slot_node,
                  "nodes": self.nodes, "routes": dict(self.routes), "aligned": self.aligned,
                  "splits": {g: dict(c) for g, c in self.splits.items()}, "moved": (), "shed": self.shed}
        fields.update(changes)
        fields["moved"] = tuple(fields["moved"])
        return RoutingTable(**fields)


@dataclass(frozen=True)
class DeviceRuns:
    """The devices of a batch of reports, in order of first appearance: each row's device code, the
    devices' keys ("farm_id/device_id"), and per device its last row (arrival order) and row count."""
    codes: np.ndarray
    keys: list[str]
    last: np.ndarray
    count: np.ndarray


def device_runs(farm, device) -> DeviceRuns:  # noqa: ANN001 - Arrow arrays (or sequences) of strings
    """Arrow's hash encoding of the joined keys: ~2.5x faster than pandas string concat + factorize."""
    import pyarrow as pa
    import pyarrow.compute as pc
    farm = farm if isinstance(farm, (pa.Array, pa.ChunkedArray)) else pa.array(farm, pa.string())
    device = device if isinstance(device, (pa.Array, pa.ChunkedArray)) else pa.array(device, pa.string())
    encoded = pc.dictionary_encode(pc.binary_join_element_wise(farm, device, "/"))
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.unify_dictionaries().combine_chunks() if encoded.num_chunks != 1 else encoded.chunk(0)
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    n = len(encoded.dictionary)
    last = np.zeros(n, dtype=np.int64)
    np.maximum.at(last, codes, np.arange(len(codes), dtype=np.int64))
    return DeviceRuns(codes, encoded.dictionary.to_pylist(), last, np.bincount(codes, minlength=n))


def bucket_of(device_key: str) -> str:
    """The split bucket of a device ("farm_id/device_id"): fixed for the device's lifetime."""
    return f"#{zlib.crc32(device_key.encode()) % SPLIT_BUCKETS}"


def buckets_of(device_keys) -> list[str]:
    return [f"#{zlib.crc32(d.encode()) % SPLIT_BUCKETS}" for d in device_keys]


def group_slot(group: str) -> int:
    return key_slot(f"g:{group}".encode())


def slot_map(redis) -> tuple[np.ndarray, tuple[str, ...]]:
    """Current slot → master index, from CLUSTER SLOTS (refreshed each batch: slots move)."""
    ranges = redis.cluster_slots() if hasattr(redis, "cluster_slots") else redis.execute_command("CLUSTER SLOTS")
    masters: dict[str, list[tuple[int, int]]] = {}
    if isinstance(ranges, dict):   # redis-py cluster answers {(start, end): {"primary": (host, port), ...}}
        for (start, end), info in ranges.items():
            host, port = info["primary"][:2]
            masters.setdefault(f"{host}:{port}", []).append((start, end))
    else:
        for start, end, primary, *_ in ranges:
            masters.setdefault(f"{primary[0]}:{primary[1]}", []).append((start, end))
    nodes = tuple(sorted(masters))
    table = np.zeros(16384, dtype=np.uint8)
    for index, node in enumerate(nodes):
        for start, end in masters[node]:
            table[start:end + 1] = index
    return table, nodes


def load(redis, default_partitions: int = DEFAULT_PARTITIONS) -> RoutingTable:
    raw = redis.get(keys.ROUTING)
    spec = orjson.loads(raw) if raw else {"version": 0, "partitions": default_partitions, "routes": {}}
    table, nodes = slot_map(redis)
    return from_spec(spec, table, nodes)


def from_spec(spec: dict, slot_node: np.ndarray, nodes: tuple[str, ...]) -> RoutingTable:
    return RoutingTable(version=spec["version"], partitions=spec["partitions"], slot_node=slot_node, nodes=nodes,
                        routes={g: int(p) for g, p in spec.get("routes", {}).items()},
                        aligned=spec.get("aligned", True),
                        splits={g: {c: int(p) for c, p in ch.items()} for g, ch in spec.get("splits", {}).items()},
                        moved=tuple(spec.get("moved", ())), shed=bool(spec.get("shed", False)))


def publish(redis, table: RoutingTable) -> None:
    redis.set(keys.ROUTING, table.to_json())


# --- Spark's hash partitioner, in Python --------------------------------------------------------
# repartition(n, "route") sends a row to pmod(murmur3_x86_32(route, seed 42), n). The readers of the
# source compute routes on the executors, so they need, for each partition p, a long value that
# lands on p ("salt"); computing it here needs no Spark job (tests check it against Spark's hash()).
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    return (_rotl((k1 * 0xCC9E2D51) & _M32, 15) * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M32


def spark_hash_long(value: int, seed: int = 42) -> int:
    """Spark SQL's hash() of a long (Murmur3_x86_32.hashLong), as a signed 32-bit int."""
    value &= 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(_mix_h1(seed, _mix_k1(value & _M32)), _mix_k1(value >> 32))
    h1 ^= 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


@functools.lru_cache(maxsize=64)
def partition_salts(n: int) -> tuple[int, ...]:
    """salts[p]: the smallest non-negative long that Spark's hash partitioner sends to partition p of n."""
    first: dict[int, int] = {}
    value = 0
    while len(first) < n:
        first.setdefault(spark_hash_long(value) % n, value)
        value += 1
    return tuple(first[p] for p in range(n))
