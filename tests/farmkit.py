"""Small helpers for tests that act as a farm through the HTTP API only."""
from __future__ import annotations

import itertools
import time

from tests.conftest import Stack, wait_for

_clock = itertools.count()


def square(lon: float, lat: float, size: float = 0.01) -> dict:
    return {"type": "Polygon", "coordinates": [[[lon, lat], [lon + size, lat], [lon + size, lat + size],
                                                [lon, lat + size], [lon, lat]]]}


class Farm:
    def __init__(self, stack: Stack, name: str = "farm"):
        self.stack = stack
        self.farm_id, self.key = stack.new_farm(name)
        self.api = stack.client(self.key)
        self.base_ts = int(time.time() * 1000) - 3_600_000

    @classmethod
    def attach(cls, stack: Stack, farm_id: str, key: str) -> "Farm":
        """A farm that exists already (e.g. restored from a backup)."""
        farm = cls.__new__(cls)
        farm.stack, farm.farm_id, farm.key = stack, farm_id, key
        farm.api = stack.client(key)
        farm.base_ts = int(time.time() * 1000) - 3_600_000
        return farm

    def fence(self, geometry: dict, name: str = "paddock", **props) -> str:
        resp = self.api.post("/v1/fences", json={"type": "Feature", "properties": {"name": name, **props},
                                                  "geometry": geometry})
        assert resp.status_code == 201, resp.text
        return resp.json()["id"]

    def device(self, device_id: str, herd: str = "north") -> str:
        resp = self.api.post("/v1/devices", json={"device_id": device_id, "herd": herd})
        assert resp.status_code == 201, resp.text
        return resp.json()["token"]

    def report(self, device_id: str, *points: tuple[float, float], token: str | None = None,
               step_ms: int = 10_000) -> list[int]:
        """Post reports (lon, lat) with increasing timestamps; returns their ts."""
        stamps = [self.base_ts + next(_clock) * step_ms for _ in points]
        body = {"reports": [{"device_id": device_id, "ts": t, "lon": lon, "lat": lat, "battery": 80}
                            for t, (lon, lat) in zip(stamps, points)]}
        client = self.stack.client(token) if token else self.api
        resp = client.post("/v1/reports", json=body)
        assert resp.status_code == 202, resp.text
        assert resp.json()["accepted"] == len(points), resp.text
        return stamps

    def events(self, **params) -> list[dict]:
        resp = self.api.get("/v1/events", params={"limit": 10000, **params})
        assert resp.status_code == 200, resp.text
        return resp.json()["events"]

    def wait_events(self, count: int, timeout: float = 120, **params) -> list[dict]:
        return wait_for(lambda: (lambda e: e if len(e) >= count else None)(self.events(**params)),
                        timeout=timeout, what=f"{count} events {params}")

    def wait_seen(self, device_id: str, ts: int, timeout: float = 120) -> dict:
        """Until the device's latest processed report is the one at ts (the job caught up)."""
        from fencing.model.timeutil import iso
        return wait_for(lambda: (lambda d: d if d.get("ts") == iso(ts) else None)(
            self.api.get(f"/v1/devices/{device_id}").json()), timeout=timeout, what=f"{device_id} at {ts}")
