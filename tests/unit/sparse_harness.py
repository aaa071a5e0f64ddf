"""Drives the job's computing core (fencing.stream.batch_core: the real fence cache, membership,
segments, state machine) over batches of reports without Redis or Spark, keeping device state
between batches the way the process stage does (through its stored dict form)."""
from __future__ import annotations

import math

import numpy as np
import shapely
from shapely.geometry import mapping

from fencing.model import fence_store
from fencing.model.transitions import DeviceState, Event
from fencing.stream.batch_core import advance_batch, match_batch
from loadgen.bench_core import device_frame, fence_cache, reports_table
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
        self.cache = fence_cache(features)
        self.stored: dict[str, dict] = {}
        self.events: list[Event] = []
        self.dropped: list[tuple[str, str, int]] = []

    def batch(self, reports: list[RefReport]) -> list[Event]:
        if not reports:
            return []
        dkeys = [r.device for r in reports]
        table = reports_table(dkeys, [r.ts for r in reports], [r.lat for r in reports], [r.lon for r in reports],
                              np.full(len(reports), np.nan), [r.accuracy for r in reports])
        frame, bounds, ends, keys = device_frame(table, dkeys)
        states = [DeviceState.from_dict(self.stored.get(k)) for k in keys]
        found = match_batch(self.cache, frame)
        outcome = advance_batch(self.cache, frame, found, bounds, ends, keys, states, set())
        for k, s in zip(keys, states):
            self.stored[k] = s.to_dict()
        self.events += outcome.events
        self.dropped += outcome.dropped
        return outcome.events
