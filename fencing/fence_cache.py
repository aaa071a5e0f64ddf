"""Per-process cache of the fences of the cell groups a task has seen, refreshed by group version.

Each group's fences are read only from the Redis node that owns the group's slot (one HGETALL per
changed group); unchanged groups cost one GET of their version per batch, pipelined per node.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import orjson
import shapely

from fencing import keys
from fencing.fence_store import FenceRules
from fencing.membership import FenceIndex


@dataclass
class _Loaded:
    version: int
    records: dict[str, dict]          # uid → group record (that group's cells only)


@dataclass
class FenceCache:
    groups: dict[str, _Loaded] = field(default_factory=dict)
    index: FenceIndex = field(default_factory=FenceIndex)
    rules: dict[str, FenceRules] = field(default_factory=dict)
    fence_farm: dict[str, str] = field(default_factory=dict)
    _cells: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)  # uid → group → cells
    _geoms: dict[str, tuple[int, shapely.Geometry]] = field(default_factory=dict)

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
            for (group, version), raw in zip(stale, pipe.execute()):
                self._replace_group(group, version, {uid: orjson.loads(rec) for uid, rec in raw.items()})
        return len(groups) + len(stale)

    def invalidate(self, groups: list[str]) -> None:
        """Forget groups (the elastic controller moved them): the next batch reloads them."""
        for group in groups:
            loaded = self.groups.pop(group, None)
            if loaded:
                self._replace_group(group, -1, {})
                self.groups.pop(group, None)

    def _replace_group(self, group: str, version: int, records: dict[str, dict]) -> None:
        before = self.groups.get(group)
        touched = set(records) | (set(before.records) if before else set())
        self.groups[group] = _Loaded(version, records)
        for uid in touched:
            per_group = self._cells.setdefault(uid, {})
            record = records.get(uid)
            if record is None:
                per_group.pop(group, None)
            else:
                per_group[group] = (np.asarray(record["interior"], dtype=np.uint64),
                                    np.asarray(record["boundary"], dtype=np.uint64))
            if not per_group:
                self._cells.pop(uid, None)
                self._geoms.pop(uid, None)
                self.rules.pop(uid, None)
                self.fence_farm.pop(uid, None)
                self.index.remove(uid)
                continue
            if record is not None:
                self._remember(uid, record)
            geom = self._geoms[uid][1]
            interior = np.concatenate([c[0] for c in per_group.values()])
            boundary = np.concatenate([c[1] for c in per_group.values()])
            self.index.upsert(uid, geom, interior, boundary)

    def _remember(self, uid: str, record: dict) -> None:
        known = self._geoms.get(uid)
        if known is None or known[0] != record["ver"]:
            self._geoms[uid] = (record["ver"], shapely.from_wkb(record["wkb"]))
        self.rules[uid] = FenceRules(int(record["debounce_reports"]), float(record["debounce_seconds"]),
                                     record.get("dwell_seconds"))
        self.fence_farm[uid] = record["farm"]


_CACHE = FenceCache()


def process_cache() -> FenceCache:
    """The cache lives as long as the Spark Python worker (spark.python.worker.reuse)."""
    return _CACHE
