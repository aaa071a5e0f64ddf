"""Helpers for the chaos tests and the soak: a simulated herd bound to a real farm on a running stack,
the reference oracle (loadgen.truth) for its ENTER/EXIT events, and process handles by recorded PID.

Only processes recorded in the stack's HERDFENCE_HOME/run/*.pid are ever signalled."""
from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import httpx
import pandas as pd

from fencing.model.heartbeat import Heartbeat, read_heartbeat
from loadgen.herd import SimConfig, simulate
from loadgen.reference import expected_events  # inferred and late events too
from loadgen.truth import reconcile


def read_pid(home: Path | str, name: str) -> int | None:
    try:
        return int((Path(home) / "run" / f"{name}.pid").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (FileNotFoundError, IndexError):
        return False


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def archive_resident_kb(pid: int, archive: Path) -> int:
    """kB of the class archive resident in a JVM (/proc/<pid>/smaps). A JVM that rejects the archive
    (another classpath, changed jars) may still map the file, but reads none of it."""
    resident_kb, mapping = 0, ""
    for line in open(f"/proc/{pid}/smaps"):
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:         # a mapping's header: range, perms, ..., path
            mapping = fields[5] if len(fields) > 5 else ""
        elif fields[0] == "Rss:" and mapping == str(archive):
            resident_kb += int(fields[1])
    return resident_kb


def kill9(pid: int, group: bool = False) -> None:
    try:
        os.killpg(pid, signal.SIGKILL) if group else os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_until(predicate, timeout: float, interval: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except (httpx.HTTPError, ValueError, OSError) as exc:   # a component is down for a moment
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}"[:2000])


@dataclasses.dataclass
class Herd:
    """A simulated herd of one farm on a running stack (fences + devices created through the API)."""
    api_url: str
    key: str
    farm_id: str
    reports: pd.DataFrame          # device ids prefixed; sorted by ts
    fences: list                   # loadgen Fence with the API's fence ids and the real farm id
    device_farm: dict

    @classmethod
    def create(cls, api_url: str, farm_id: str, key: str, prefix: str, devices: int = 30, steps: int = 60,
               seed: int = 11, fences: int = 8, register: bool = True) -> "Herd":
        sim = simulate(SimConfig(seed=seed, farms=1, fences_per_farm=fences, devices=devices, steps=steps,
                                 silent_fraction=0.0))
        reports = sim.reports.copy()
        reports["device_id"] = prefix + "-" + reports["device_id"].astype(str)
        client = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        real = []
        for fence in sim.fences:
            feature = {"type": "Feature", "properties": dict(fence.geojson["properties"]),
                       "geometry": fence.geojson["geometry"]}
            resp = client.post("/v1/fences", json=feature)
            assert resp.status_code == 201, resp.text
            real.append(dataclasses.replace(fence, fence_id=resp.json()["id"], farm_id=farm_id))
        ids = sorted(reports["device_id"].unique())
        if register:
            for device_id in ids:
                resp = client.post("/v1/devices", json={"device_id": device_id, "herd": "north"})
                assert resp.status_code == 201, resp.text
        client.close()
        return cls(api_url, key, farm_id, reports.reset_index(drop=True), real, {d: farm_id for d in ids})

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.api_url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30)

    def expected(self, reports: pd.DataFrame | None = None) -> pd.DataFrame:
        return expected_events(self.reports if reports is None else reports, self.fences, self.device_farm)

    def observed(self) -> pd.DataFrame:
        with self.client() as c:
            resp = c.get("/v1/events", params={"limit": 10000})
        resp.raise_for_status()
        return pd.DataFrame(resp.json()["events"], columns=["event_id", "type", "device_id", "fence_id", "ts"])

    def caught_up(self, reports: pd.DataFrame | None = None) -> bool:
        """Every device's latest processed report is its last one in ``reports``."""
        from fencing.model.timeutil import iso
        df = self.reports if reports is None else reports
        want = {d: iso(int(t)) for d, t in df.groupby("device_id")["ts"].max().items()}
        with self.client() as c:
            resp = c.get("/v1/positions")
        if resp.status_code != 200:
            return False
        seen = {f["id"]: f["properties"]["ts"] for f in resp.json()["features"]}
        return all(seen.get(d) == t for d, t in want.items())

    def reconcile(self, timeout: float = 120, reports: pd.DataFrame | None = None) -> dict:
        """Wait for the job to catch up and the events to settle; the reconciliation + event-id check."""
        wait_until(lambda: self.caught_up(reports), timeout, what="the job to process every report")
        expected = self.expected(reports)
        result: dict = {}

        def settled() -> bool:
            observed = self.observed()
            result.update(reconcile(expected, observed))
            result["duplicate_event_ids"] = int(observed["event_id"].duplicated().sum())
            return result["lost"] == 0 and result["unexpected"] == 0
        try:
            wait_until(settled, 30, interval=1, what="events to settle")
        except AssertionError:
            pass          # the caller asserts on the numbers, which say more
        return result


def heartbeat(redis) -> Heartbeat | None:
    return read_heartbeat(redis)
