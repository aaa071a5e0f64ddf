"""Drives the job's computing core (fencing.stream.batch_core: the real fence cache, membership,
segments, state machine) over batches of reports without Redis or Spark, keeping device state
between batches the way the process stage does (through its stored dict form)."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pandas as pd
import shapely
from shapely.geometry import mapping

from fencing.model import fence_store
from fencing.model.geometry import group_names
from fencing.model.h3util import cells_for_points
from fencing.model.transitions import DeviceState, Event
from fencing.stream.batch_core import BatchReports, advance_batch, match_batch
from fencing.stream.fence_cache import FenceCache
from loadgen.reference import RefFence, RefReport

LON0, LAT0 = 8.5, 47.0
KX = 111_320.0 * math.cos(math.radians(LAT0))
KY = 110_574.0


def lonlat(x_m, y_m):
    return LON0 + np.asarray(x_m) / KX, LAT0 + np.asarray(y_m) / KY


def feature(geom: shapely.Geometry, **props) -> dict:
    return {"type": "Feature", "geometry": mapping(geom), "properties": {"name": "f", **props}}


def ref_fence(uid: str, geom: shapely.Geometry, **props) -> RefFence:
    rules = fence_store.FenceRules.from_properties(props)
    return RefFence(uid, geom, rules.debounce_reports, rules.debounce_seconds, rules.dwell_seconds, rules.warn_m,
                    rules.active_from, rules.active_to)


class Job:
    """The fence cache loaded with fences (uid → Feature), device states kept between batches."""

    def __init__(self, features: dict[str, dict]):
        self.cache = FenceCache()
        loaded: dict[str, dict[str, dict]] = {}
        for uid, feat in features.items():
            farm_id, _, fence_id = uid.partition("/")
            valid = fence_store.validate_feature(feat)
            for group, record in fence_store.group_records(farm_id, fence_id, 1, valid).items():
                loaded.setdefault(group, {})[uid] = record
        self.cache.install([(g, 1, recs) for g, recs in loaded.items()])
        self.stored: dict[str, dict] = {}
        self.events: list[Event] = []
        self.dropped: list[tuple[str, str, int]] = []

    def batch(self, reports: list[RefReport]) -> list[Event]:
        if not reports:
            return []
        dkeys = [r.device for r in reports]
        lat = np.array([r.lat for r in reports])
        lon = np.array([r.lon for r in reports])
        cells = cells_for_points(lat, lon, 9)
        names, code = group_names(cells)
        table = pa.table({"farm_id": [k.partition("/")[0] for k in dkeys],
                          "ts": np.array([r.ts for r in reports], np.int64), "lat": lat, "lon": lon,
                          "battery": np.full(len(reports), np.nan), "cell": cells.view(np.int64),
                          "grp": names[code].tolist(),
                          "accuracy_m": pa.array([r.accuracy for r in reports], pa.float64())})
        device_code, device_keys = pd.factorize(pd.Series(dkeys))
        order = np.argsort(device_code, kind="stable")          # grouped by device, arrival order kept
        frame = BatchReports.from_arrow(table, order)
        codes = device_code[order]
        bounds = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        ends = np.r_[bounds[1:], len(frame)]
        keys = [device_keys[c] for c in codes[bounds]]
        states = [DeviceState.from_dict(self.stored.get(k)) for k in keys]
        found = match_batch(self.cache, frame)
        outcome = advance_batch(self.cache, frame, found, bounds, ends, keys, states, set())
        for k, s in zip(keys, states):
            self.stored[k] = s.to_dict()
        self.events += outcome.events
        self.dropped += outcome.dropped
        return outcome.events
