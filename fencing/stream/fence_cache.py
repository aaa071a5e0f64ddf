"""Per-process cache of the fences of the cell groups a task has seen, refreshed by group version.

Each group's fences are read only from the Redis node that owns the group's slot (one HGETALL per
changed group); unchanged groups cost one GET of their version per batch, pipelined per node.

The groups are indexed in `SHARDS` FenceIndexes (a group's shard: a hash of its name). Loading or
changing a group rebuilds only its shard's pair table (1/SHARDS of the worker's fences), and a batch
costs at most SHARDS index calls however many groups it touches: one index per worker made every new
group rebuild the whole table (seconds at 100k fences), one index per group cost ~60 µs per call,
which at 1M fences (6,500 groups of ~26 points per partition) was 2 µs per point. A fence spanning
groups of several shards is in each with those groups' cells only (one geometry, shared).
"""
from __future__ import annotations

import functools
import gc
import zlib
from dataclasses import dataclass, field

import numpy as np
import orjson
import pandas as pd
import shapely

from fencing.model import keys
from fencing.model.crossings import convex_polygons
from fencing.model.fence_store import FenceRules
from fencing.model.geometry import group_names
from fencing.model.sparse_batch import FarmFences
from fencing.model.membership import FenceIndex
from fencing.model.node_pipe import NodePipeline
from fencing.config import TUNING

# Few enough that each shard's index call amortizes its fixed numpy cost over thousands of points
# (64 shards cost ~150 ns per point at 1M fences), enough that one fence edit rebuilds 1/16 of them.
SHARDS = 16
# HERDFENCE_FENCE_PRELOAD=0: a worker loads only the groups its batches meet (less memory per worker
# when one executor never sees most of the map, e.g. many executors and few fences each)
PRELOAD = TUNING.fence_preload


def all_groups(redis) -> list[str]:
    """Every cell group that holds or held fences: the registry set, or (data saved before it
    existed) a scan of the group fence hashes on every master."""
    groups = redis.smembers(keys.FENCE_GROUPS)
    if not groups:
        groups = {key[3:key.index("}")] for key in
                  redis.scan_iter(match="{g:*}:fences", count=10_000, target_nodes=redis.PRIMARIES)}
    return sorted(groups)


@functools.lru_cache(maxsize=1 << 16)
def shard_of(group: str) -> int:
    return zlib.crc32(group.encode()) % SHARDS


@dataclass
class _Group:
    version: int
    cells: dict[str, tuple[np.ndarray, np.ndarray]]    # uid → (interior, boundary) cells in this group


@dataclass
class FenceCache:
    groups: dict[str, _Group] = field(default_factory=dict)
    rules: dict[str, FenceRules] = field(default_factory=dict)
    fence_farm: dict[str, str] = field(default_factory=dict)
    shards: dict[int, FenceIndex] = field(default_factory=dict)
    _geoms: dict[str, tuple[int, shapely.Geometry]] = field(default_factory=dict)
    _holders: dict[str, set[str]] = field(default_factory=dict)    # uid → groups that hold it
    preload: bool = False          # the first refresh loads every group (see `refresh`)
    _tree: "FarmFences | None" = None   # every cached fence by farm, for segments; None = to build
    # uid → (its geometry, convex?): a rebuild of `_tree` after a group load tests only new geometries
    # (a convex hull of every cached fence per rebuild was a quarter of a flood's process stage at 100k)
    _convex: dict[str, tuple[shapely.Geometry, bool]] = field(default_factory=dict)
    _preloaded: bool = False

    def __len__(self) -> int:
        """Fences cached."""
        return len(self._geoms)

    def refresh(self, redis, groups: list[str]) -> int:
        """Bring the given groups up to date; returns the number of Redis commands sent. The first
        call of a preloading cache (the job's, `PRELOAD`) loads every group, and so does any later call that
        names a group the cache never held: Spark hands any routed partition to any idle Python worker,
        so each worker meets nearly every group anyway, and one bulk load builds each shard once instead
        of rebuilding shards batch after batch as new groups trickle in."""
        if not groups:
            return 0
        sent = 0
        if self.preload and (not self._preloaded or not self.groups.keys() >= set(groups)):
            # A group this worker never met: the map may have grown since its preload (a bulk import;
            # keep-warm preloads every worker right after `up`, before any fence is saved). Every
            # group it lacks comes in one build, not the batch's few now and the rest batch by batch
            # with a shard rebuild each time (measured after a 100k-fence import: workers at 57k of
            # 100k, each task 0.1-0.65 s reloading and 0.3-0.5 s rebuilding)
            sent = self.warm(redis)
        return sent + self._load_current(redis, groups)

    def warm(self, redis) -> int:
        """Bring every group up to date: those not cached yet and those changed since they were
        loaded (a preloading cache only); returns the number of Redis commands sent. Run by the
        first refresh, and by the job's keep-warm tasks while the stream is idle: fences saved since
        (a farm's new paddocks, in a new group or one already cached, a bulk import) then arrive in
        one build instead of one shard rebuild per batch that meets them."""
        if not self.preload:
            return 0
        self._preloaded = True
        groups = sorted(all_groups(redis))
        sent = self._load_current(redis, groups) if groups else 0
        self.build_indexes()
        return sent

    def build_indexes(self) -> None:
        """Build what a batch would otherwise build on first use after a load: each shard's pair
        table with its ring arrays (point matching) and the by-farm table (segments of sparse fixes).
        Run while idle, so a paddock import costs the next batch nothing (at 100k fences ~0.1 s of
        CPU per shard and per worker, up to ~0.5 s a task)."""
        for index in self.shards.values():
            index.build()
        if self._geoms:
            self.farm_fences()

    def _load_current(self, redis, groups: list[str]) -> int:
        """Reload those of `groups` whose version changed (versions read first: a fence saved in
        between leaves the older version here, so the next refresh loads it again)."""
        if not groups:
            return 0
        pipe = NodePipeline(redis)
        for group in groups:
            key = keys.group_version(group)
            pipe.command(key, "GET", key)
        versions = [int(v or 0) for v in pipe.execute()]
        stale = [(g, v) for g, v in zip(groups, versions)
                 if g not in self.groups or self.groups[g].version != v]
        if stale:
            for group, _ in stale:
                key = keys.group_fences(group)
                pipe.command(key, "HGETALL", key)
            loaded = [(group, version, {uid: orjson.loads(rec) for uid, rec in raw.items()})
                      for (group, version), raw in zip(stale, pipe.execute())]
            self.install(loaded)
            if sum(len(records) for _, _, records in loaded) >= FREEZE_AFTER:
                _freeze()
        return len(groups) + len(stale)

    def install(self, loaded: list[tuple[str, int, dict[str, dict]]]) -> None:
        """Install (group, version, {uid: record}) as read from Redis (the records `save_fence` writes)."""
        self._parse_geometries([rec for _, _, records in loaded for rec in records.values()])
        self._replace_groups(loaded)

    def _parse_geometries(self, records: list[dict]) -> None:
        """New or changed fences' WKB parsed and prepared in two vectorized calls, not one per fence
        (a worker meeting 100k fences for the first time spent most of its load here)."""
        todo = {}
        for record in records:
            known = self._geoms.get(record["uid"])
            if known is None or known[0] != record["ver"]:
                todo[record["uid"]] = record
        if not todo:
            return
        geoms = shapely.from_wkb([r["wkb"] for r in todo.values()])
        shapely.prepare(geoms)
        for (uid, record), geom in zip(todo.items(), geoms):
            self._geoms[uid] = (record["ver"], geom)

    def invalidate(self, groups: list[str]) -> None:
        """Forget groups (the elastic controller moved them): the next batch reloads them."""
        held = [g for g in groups if g in self.groups]
        self._replace_groups([(g, -1, {}) for g in held])
        for group in held:
            del self.groups[group]

    def geometry(self, uid: str) -> shapely.Geometry:
        return self._geoms[uid][1]

    def cells_of(self, group: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """uid → (interior, boundary) cells of the group's fences (empty when not cached)."""
        loaded = self.groups.get(group)
        return loaded.cells if loaded else {}

    def match(self, lon: np.ndarray, lat: np.ndarray, cells: np.ndarray,
              groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """All (point, fence uid) pairs with the point inside the fence, in point order (as
        FenceIndex.match), each point tested against its group's shard only. `groups`: the group
        name of each point when the caller has it (else derived from the cells)."""
        cells = np.asarray(cells, dtype=np.uint64)
        lon, lat = np.asarray(lon, np.float64), np.asarray(lat, np.float64)
        if groups is None:
            distinct, code = group_names(cells)
            groups = distinct[code]
        codes, names = pd.factorize(np.asarray(groups, dtype=object))
        shard_of_code = np.array([shard_of(g) for g in names] + [-1], dtype=np.int64)
        shard = shard_of_code[codes]                     # code -1 (no group) → the last entry, -1
        order = np.argsort(shard, kind="stable")
        starts = np.searchsorted(shard[order], np.arange(SHARDS + 1))
        points, uids = [np.empty(0, np.int64)], [np.empty(0, object)]
        for k in range(SHARDS):
            index = self.shards.get(k)
            if index is None or not len(index) or starts[k] == starts[k + 1]:
                continue
            idx = order[starts[k]:starts[k + 1]]
            p, u = index.match(lon[idx], lat[idx], cells[idx])
            points.append(idx[p])
            uids.append(u)
        point, uid = np.concatenate(points), np.concatenate(uids)
        by_point = np.argsort(point, kind="stable")
        return point[by_point], uid[by_point]

    def farm_fences(self) -> FarmFences:
        """Every cached fence grouped by farm (for segments), built on first use after a change."""
        if self._tree is None:
            uids, geoms = list(self._geoms), [g for _, g in self._geoms.values()]
            known = self._convex
            new = [i for i, (u, g) in enumerate(zip(uids, geoms)) if known.get(u, (None,))[0] is not g]
            if new:
                flags = convex_polygons(np.array([geoms[i] for i in new], dtype=object))
                known.update((uids[i], (geoms[i], bool(f))) for i, f in zip(new, flags.tolist()))
            if len(known) > 2 * len(uids) + 1000:          # forget fences no longer cached
                self._convex = {u: known[u] for u in uids}
            self._tree = FarmFences.build(uids, geoms, self.fence_farm,
                                          convex=[self._convex[u][1] for u in uids])
        return self._tree

    def _replace_groups(self, loaded: list[tuple[str, int, dict[str, dict]]]) -> None:
        """Install (group, version, {uid: record}) and reindex the touched fences, shard by shard."""
        touched: dict[int, set[str]] = {}
        for group, version, records in loaded:
            before = self.groups.get(group)
            cells = {}
            for uid, record in records.items():
                self._remember(uid, record)
                cells[uid] = (np.asarray(record["interior"], dtype=np.uint64),
                              np.asarray(record["boundary"], dtype=np.uint64))
                self._holders.setdefault(uid, set()).add(group)
            self.groups[group] = _Group(version, cells)
            gone = set(before.cells) - set(records) if before else set()
            for uid in gone:
                self._holders.get(uid, set()).discard(group)
            touched.setdefault(shard_of(group), set()).update(set(cells) | gone)
            if cells or gone:
                # the by-farm table is rebuilt for a change of fences only: a batch meeting a cell
                # group without fences installs it empty, and rebuilding for that (~0.35 s per
                # worker at 100k fences) was ~3% of a sparse flood's process stage
                self._tree = None
        for shard, uids in touched.items():
            self._reindex(shard, sorted(uids))
        for uid in set().union(*touched.values()) if touched else ():
            if not self._holders.get(uid):       # no cached group holds the fence any more
                for known in (self._holders, self._geoms, self.rules, self.fence_farm):
                    known.pop(uid, None)

    def _reindex(self, shard: int, uids: list[str]) -> None:
        """Each fence in `shard` with the cells of all its groups that fall in that shard (or out of
        the shard when none does)."""
        index = self.shards.setdefault(shard, FenceIndex())
        put: list[tuple[str, list]] = []
        for uid in uids:
            parts = [self.groups[g].cells[uid] for g in self._holders.get(uid, ())
                     if shard_of(g) == shard and uid in self.groups[g].cells]
            if parts:
                put.append((uid, parts))
            else:
                index.remove(uid)
        index.upsert_many([u for u, _ in put], [self._geoms[u][1] for u, _ in put],
                          [p[0][0] if len(p) == 1 else np.concatenate([x[0] for x in p]) for _, p in put],
                          [p[0][1] if len(p) == 1 else np.concatenate([x[1] for x in p]) for _, p in put])

    def _remember(self, uid: str, record: dict) -> None:
        self.rules[uid] = _rules(record["debounce_reports"], record["debounce_seconds"], record.get("dwell_seconds"),
                                 record.get("warn_m") or 0.0, record.get("active_from"), record.get("active_to"))
        self.fence_farm[uid] = record["farm"]


FREEZE_AFTER = 1_000     # fences loaded at once (a preload, a big import) after which the heap is frozen


def _freeze() -> None:
    """Move everything alive now (the cache: ~5 objects per fence) out of the cyclic GC's sight.
    Otherwise every full collection walks the whole cache: at 100k fences that was 0.3–0.45 s of
    each 250k-point batch, 11–17% of the process stage. Garbage first, so none of it is kept."""
    gc.collect()
    gc.freeze()


@functools.lru_cache(maxsize=4096)
def _rules(debounce_reports, debounce_seconds, dwell_seconds, warn_m=0.0, active_from=None, active_to=None
           ) -> FenceRules:
    """One shared (frozen) FenceRules per distinct setting: most fences use the defaults."""
    return FenceRules(int(debounce_reports), float(debounce_seconds), dwell_seconds, float(warn_m),
                      active_from, active_to)


_CACHE = FenceCache(preload=PRELOAD)


def process_cache() -> FenceCache:
    """The cache lives as long as the Spark Python worker (spark.python.worker.reuse)."""
    return _CACHE
