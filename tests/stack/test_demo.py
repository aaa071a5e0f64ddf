"""`herdfence demo`: a demo farm whose herd walks across its fences on the stack, until `demo --stop`."""
from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from deploy.procs import is_alive
from tests.conftest import wait_for

pytestmark = pytest.mark.stack

FENCES = ["East paddock", "Grazing strip", "North paddock", "South paddock"]


def _ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def _herd_ts(client) -> dict[str, str]:
    r = client.get("/v1/positions", params={"herd": "demo"})
    assert r.status_code == 200, r.text
    return {f["properties"]["device_id"]: f["properties"]["ts"] for f in r.json()["features"]}


def _job_has_processed_a_probe(client, n: int) -> None:
    """Post a report for a device outside the herd and wait until the job has processed it: every
    report acknowledged before it is then in this job batch or an earlier one."""
    ts = int(time.time() * 1000) + n
    body = {"reports": [{"device_id": "demo-probe", "ts": ts, "lat": 47.0, "lon": 8.5}]}
    assert client.post("/v1/reports", json=body).status_code == 202
    def seen() -> bool:
        r = client.get("/v1/devices/demo-probe")
        return r.status_code == 200 and r.json().get("ts") is not None and _ms(r.json()["ts"]) == ts
    wait_for(seen, timeout=30, what=f"the job to process probe {n}")


def test_demo_walks_a_herd_across_the_fences_until_stopped(stack):
    started = time.monotonic()
    info = json.loads(stack.cli("demo", "--json"))
    try:
        assert set(info) == {"farm_id", "api_key", "url", "walker_pid"}
        assert info["url"] == stack.api_url + "/"
        assert is_alive(info["walker_pid"], ["loadgen.demo", "--walk"])
        with stack.client(info["api_key"]) as c:
            fences = c.get("/v1/fences").json()["features"]
            by_name = {f["properties"]["name"]: f for f in fences}
            assert sorted(by_name) == FENCES
            assert len(by_name["South paddock"]["geometry"]["coordinates"]) == 2     # the pond is a hole
            strip = by_name["Grazing strip"]["properties"]
            assert _ms(strip["active_from"]) < time.time() * 1000 < _ms(strip["active_to"])

            def events(*types: str) -> list[dict]:
                return [e for e in c.get("/v1/events").json()["events"] if e["type"] in types]
            wait_for(lambda: events("enter", "exit"), timeout=90, interval=0.5,
                     what="an enter or exit event of the demo herd")
            print(f"demo -> first enter/exit event: {time.monotonic() - started:.1f} s")
            # an EXIT needs a cow that was inside to cross a boundary: the herd really walks
            exits = wait_for(lambda: events("exit"), timeout=90, interval=0.5, what="a cow crossing out of a fence")
            print(f"demo -> first exit event: {time.monotonic() - started:.1f} s")
            assert {e["fence_id"] for e in exits} <= {f["id"] for f in fences}
            positions = wait_for(lambda: len(p := _herd_ts(c)) == 12 and p,
                                 timeout=30, what="the twelve cows' positions")
            assert all(abs(_ms(ts) - time.time() * 1000) < 60_000 for ts in positions.values())  # reported now

        # a second `demo` reuses the farm and its fences, and replaces the walker
        again = json.loads(stack.cli("demo", "--json"))
        assert (again["farm_id"], again["api_key"]) == (info["farm_id"], info["api_key"])
        assert not is_alive(info["walker_pid"]) and is_alive(again["walker_pid"])
        with stack.client(info["api_key"]) as c:
            assert sorted(f["properties"]["name"] for f in c.get("/v1/fences").json()["features"]) == FENCES
        info = again
    finally:
        stopped = json.loads(stack.cli("demo", "--stop", "--json"))

    assert stopped == {"stopped": True, "walker_pid": info["walker_pid"]}
    assert not is_alive(info["walker_pid"])
    assert not (stack.settings.run_dir / "demo.pid").exists()
    with stack.client(info["api_key"]) as c:
        # The walker's last report and probe 1 can share a job batch, whose tasks write their partitions
        # one by one; probe 2 is in a later batch, and Spark starts a batch only after the last one ended.
        for n in (1, 2):
            _job_has_processed_a_probe(c, n)
        frozen = _herd_ts(c)
        _job_has_processed_a_probe(c, 3)
        assert _herd_ts(c) == frozen
        assert sorted(f["properties"]["name"] for f in c.get("/v1/fences").json()["features"]) == FENCES
    assert json.loads(stack.cli("demo", "--stop", "--json")) == {"stopped": False, "walker_pid": None}
