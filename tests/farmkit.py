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


def dead_letters_matching(stack: Stack, marker: str, count: int, timeout: float = 60) -> list[dict]:
    """The dead letters on `gps.reports.dlq` whose original record contains `marker` (as text or in
    its base64 form), once there are `count` of them; read from the start of the topic."""
    import base64
    import json

    from confluent_kafka import Consumer, TopicPartition

    def text(letter: dict) -> str:
        raw = letter.get("raw", "")
        try:
            return raw + base64.b64decode(raw, validate=True).decode("latin-1")
        except ValueError:
            return raw

    consumer = Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": f"dlq-{marker}-{time.time_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("gps.reports.dlq", 0, 0)])
    letters: list[dict] = []

    def enough() -> list[dict] | None:
        msg = consumer.poll(0.5)
        while msg is not None:
            if not msg.error():
                letter = json.loads(msg.value())
                if marker in text(letter):
                    letters.append(letter)
            msg = consumer.poll(0.1)
        return letters if len(letters) >= count else None
    try:
        return wait_for(enough, timeout=timeout, interval=0.1, what=f"{count} dead letters with {marker}")
    finally:
        consumer.close()
