"""A worker's fence cache that preloaded before more fences were saved catches up on all of them at
once when a batch meets a group it has never seen (fencing/stream/fence_cache.py, `refresh`)."""
from __future__ import annotations

import numpy as np

from fencing.model.geometry import group_names
from fencing.model.h3util import cells_for_points
from fencing.model.keys import FENCE_RES
from fencing.stream.fence_cache import FenceCache
from tests.farmkit import Farm, square


def _group_at(lon: float, lat: float) -> str:
    names, code = group_names(cells_for_points(np.array([lat]), np.array([lon]), FENCE_RES))
    return str(names[code][0])


def test_a_preloaded_cache_takes_every_fence_saved_since_when_it_meets_a_new_group(stack):
    farm = Farm(stack, "catch-up farm")
    first = farm.fence(square(-57.30, -38.20), name="home paddock")
    cache = FenceCache(preload=True)
    cache.refresh(stack.redis, [_group_at(-57.295, -38.195)])
    assert f"{farm.farm_id}/{first}" in cache.fence_farm

    later = farm.fence(square(-57.60, -38.50), name="paddock saved after the preload")   # another group
    uid = f"{farm.farm_id}/{later}"
    cache.refresh(stack.redis, [_group_at(-57.295, -38.195)])   # only known groups: no catch-up needed
    assert uid not in cache.fence_farm

    cache.refresh(stack.redis, [_group_at(-57.90, -38.80)])     # a group it never met (no fences there)
    assert uid in cache.fence_farm, "the fence saved after the preload was not loaded"
    table = cache.farm_fences()
    assert uid in set(table.uids.tolist())


def test_a_warm_run_takes_a_fence_saved_into_a_group_the_cache_already_holds(stack):
    """Keep-warm (cache.warm) brings changed groups up to date too, not only new ones: a strip drawn
    inside a paddock while the herd is quiet is in every worker before the next report."""
    farm = Farm(stack, "warm farm")
    first = farm.fence(square(-58.30, -39.20), name="first paddock")
    cache = FenceCache(preload=True)
    cache.warm(stack.redis)
    assert f"{farm.farm_id}/{first}" in cache.fence_farm
    beside = farm.fence(square(-58.297, -39.197, 0.004), name="a strip inside it")   # the same cell group
    cache.warm(stack.redis)
    assert f"{farm.farm_id}/{beside}" in cache.fence_farm, "a warm run left a changed group stale"
