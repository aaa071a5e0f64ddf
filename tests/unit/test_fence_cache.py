"""The job's fence cache keeps its by-farm segment table across loads that change no fence."""
from shapely.geometry import box

from fencing.model import fence_store
from fencing.stream.fence_cache import FenceCache
from tests.unit.sparse_harness import feature, lonlat


def _records(farm_id: str, fence_id: str, version: int, geom) -> dict[str, dict[str, dict]]:
    valid = fence_store.validate_feature(feature(geom))
    return {group: {f"{farm_id}/{fence_id}": record}
            for group, record in fence_store.group_records(farm_id, fence_id, version, valid).items()}


def _square(x0_m: float, size_m: float = 200.0):
    (lon0, lon1), (lat0, lat1) = lonlat([x0_m, x0_m + size_m], [0.0, size_m])
    return box(lon0, lat0, lon1, lat1)


def test_an_empty_group_keeps_the_segment_table_a_changed_fence_renews_it():
    cache = FenceCache()
    cache.install([(g, 1, recs) for g, recs in _records("farm-a", "f1", 1, _square(0)).items()])
    table = cache.farm_fences()
    assert list(table.uids) == ["farm-a/f1"]

    cache.install([("86000000fffffff", 3, {})])         # a cell group with no fences, met by a batch
    assert cache.farm_fences() is table

    both = _records("farm-a", "f1", 1, _square(0))       # a group is installed whole: f2 joins f1's
    for group, recs in _records("farm-a", "f2", 1, _square(300)).items():
        both.setdefault(group, {}).update(recs)
    cache.install([(g, 2, recs) for g, recs in both.items()])
    renewed = cache.farm_fences()
    assert renewed is not table
    assert sorted(renewed.uids) == ["farm-a/f1", "farm-a/f2"]

    cache.invalidate(list(cache.groups))                # moved away by the elastic controller
    assert list(cache.farm_fences().uids) == []
