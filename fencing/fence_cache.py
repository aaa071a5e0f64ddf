"""Per-process cache of the fences of the cell groups a task has seen, refreshed by group version.

Each group's fences are read only from the Redis node that owns the group's slot (one HGETALL per
changed group); unchanged groups cost one GET of their version per batch, pipelined per node.

One FenceIndex per group (the shard of the Amoeba design): loading or changing a group rebuilds only
that group's pair table, and a point is matched only against its own group's fences, so neither the
cost of a batch nor the per-point cost grows with the number of fences the worker has cached. A fence
that spans several groups is in each of them with that group's cells only (one geometry, shared).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import orjson
import pandas as pd
import shapely

from fencing import keys
from fencing.fence_store import FenceRules
from fencing.h3util import cells_to_strs, parent
from fencing.membership import FenceIndex


@dataclass
class _Group:
    version: int
    index: FenceIndex
    cells: dict[str, tuple[np.ndarray, np.ndarray]]    # uid → (interior, boundary) cells in this group


@dataclass
class FenceCache:
    groups: dict[str, _Group] = field(default_factory=dict)
    rules: dict[str, FenceRules] = field(default_factory=dict)
    fence_farm: dict[str, str] = field(default_factory=dict)
    _geoms: dict[str, tuple[int, shapely.Geometry]] = field(default_factory=dict)
    _holders: dict[str, set[str]] = field(default_factory=dict)    # uid → groups that hold it

    def __len__(self) -> int:
        """Fences cached."""
        return len(self._geoms)

    def refresh(self, redis, groups: list[str]) -> int:
        """Bring the given groups up to date; returns the number of Redis commands sent."""
        if not groups:
            return 0
        pipe = redis.pipeline()
        for group in groups:
            pipe.get(keys.group_version(group))
        versions = [int(v or 0) for v in pipe.execute()]
        stale = [(g, v) for g, v in zip(groups, versions)
                 if g not in self.groups or self.groups[g].version != v]
        if stale:
            pipe = redis.pipeline()
            for group, _ in stale:
                pipe.hgetall(keys.group_fences(group))
            loaded = [(group, version, {uid: orjson.loads(rec) for uid, rec in raw.items()})
                      for (group, version), raw in zip(stale, pipe.execute())]
            self._parse_geometries([rec for _, _, records in loaded for rec in records.values()])
            for group, version, records in loaded:
                self._replace_group(group, version, records)
        return len(groups) + len(stale)

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
        for group in groups:
            if group in self.groups:
                self._replace_group(group, -1, {})
                del self.groups[group]

    def cells_of(self, group: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """uid → (interior, boundary) cells of the group's fences (empty when not cached)."""
        loaded = self.groups.get(group)
        return loaded.cells if loaded else {}

    def match(self, lon: np.ndarray, lat: np.ndarray, cells: np.ndarray,
              groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """All (point, fence uid) pairs with the point inside the fence, in point order (as
        FenceIndex.match), each point tested against its own group's index only. `groups`: the group
        name of each point when the caller has it (else derived from the cells)."""
        cells = np.asarray(cells, dtype=np.uint64)
        lon, lat = np.asarray(lon, np.float64), np.asarray(lat, np.float64)
        if groups is None:
            groups = np.array(cells_to_strs(parent(cells, keys.GROUP_RES)), dtype=object)
        codes, names = pd.factorize(np.asarray(groups, dtype=object))
        order = np.argsort(codes, kind="stable")
        starts = np.searchsorted(codes[order], np.arange(len(names) + 1))
        points, uids = [np.empty(0, np.int64)], [np.empty(0, object)]
        for k, name in enumerate(names):
            loaded = self.groups.get(name)
            if loaded is None or not len(loaded.index):
                continue
            idx = order[starts[k]:starts[k + 1]]
            p, u = loaded.index.match(lon[idx], lat[idx], cells[idx])
            points.append(idx[p])
            uids.append(u)
        point, uid = np.concatenate(points), np.concatenate(uids)
        by_point = np.argsort(point, kind="stable")
        return point[by_point], uid[by_point]

    def _replace_group(self, group: str, version: int, records: dict[str, dict]) -> None:
        before = self.groups.get(group)
        index, cells = FenceIndex(), {}
        for uid, record in records.items():
            self._remember(uid, record)
            interior = np.asarray(record["interior"], dtype=np.uint64)
            boundary = np.asarray(record["boundary"], dtype=np.uint64)
            index.upsert(uid, self._geoms[uid][1], interior, boundary)
            cells[uid] = (interior, boundary)
            self._holders.setdefault(uid, set()).add(group)
        self.groups[group] = _Group(version, index, cells)
        for uid in set(before.cells) - set(records) if before else ():
            holders = self._holders.get(uid, set())
            holders.discard(group)
            if not holders:          # no cached group holds the fence any more
                for known in (self._holders, self._geoms, self.rules, self.fence_farm):
                    known.pop(uid, None)

    def _remember(self, uid: str, record: dict) -> None:
        self.rules[uid] = FenceRules(int(record["debounce_reports"]), float(record["debounce_seconds"]),
                                     record.get("dwell_seconds"))
        self.fence_farm[uid] = record["farm"]


_CACHE = FenceCache()


def process_cache() -> FenceCache:
    """The cache lives as long as the Spark Python worker (spark.python.worker.reuse)."""
    return _CACHE
