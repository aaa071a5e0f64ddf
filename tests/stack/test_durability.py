"""Durability of the embedded default, black-box through the CLI and the HTTP API (issue 17): a farm
survives `down`/`up`, a kill -9 of every process of the stack, a killed Redis master, broker or API;
every acknowledged report is processed exactly once; `backup` + `restore` give the same farm;
`reset --yes` is the only delete.

It runs on the suite's disposable stack (tests/conftest.py), which it may kill."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from deploy import procs
from loadgen import http_writer
from tests.chaoskit import Herd, alive, kill9, read_pid, wait_until
from tests.conftest import HERDFENCE, ROOT, Stack, disposable_env
from tests.farmkit import Farm, square

pytestmark = pytest.mark.stack



@pytest.fixture(scope="module")
def dstack(disposable) -> Stack:
    return disposable


def _snapshot(farm: Farm, device_id: str) -> dict:
    """What a farmer sees of the farm (fences, one device, its events), as JSON."""
    fences = farm.api.get("/v1/fences")
    device = farm.api.get(f"/v1/devices/{device_id}")
    events = farm.api.get("/v1/events", params={"device_id": device_id})
    assert (fences.status_code, device.status_code, events.status_code) == (200, 200, 200), \
        (fences.text, device.text, events.text)
    return {"fences": sorted(f["id"] for f in fences.json()["features"]), "device": device.json(),
            "events": [(e["event_id"], e["type"]) for e in events.json()["events"]]}


def _group_pids(home: str) -> dict[str, int]:
    run = Path(home) / "run"
    return {p.stem: int(p.read_text()) for p in run.glob("*.pid")}


def _farm_with_events(stack: Stack, name: str, device_id: str) -> tuple[Farm, str]:
    farm = Farm(stack, name)
    fence_id = farm.fence(square(8.50, 47.00))
    farm.device(device_id)
    t = farm.base_ts
    body = {"reports": [{"device_id": device_id, "ts": t + i * 10_000, "lon": 8.505, "lat": lat}
                        for i, lat in enumerate((47.05, 47.005, 47.005, 47.05, 47.05))]}
    assert farm.api.post("/v1/reports", json=body).status_code == 202
    farm.wait_seen(device_id, t + 40_000)
    wait_until(lambda: len(farm.events(device_id=device_id)) == 2, 30, what="enter + exit")
    return farm, fence_id


def test_down_then_up_keeps_the_farm(dstack):
    farm, fence_id = _farm_with_events(dstack, "down-up", "du-cow")
    before = _snapshot(farm, "du-cow")
    assert before["fences"] == [fence_id] and [t for _, t in before["events"]] == ["enter", "exit"]
    status = json.loads(dstack.cli("status", "--json"))
    nodes = status["components"]["redis"]["nodes"]
    assert all(n["used_memory"] > 0 and n["maxmemory"] == 4 * 1024 ** 3 for n in nodes.values()), nodes
    assert status["components"]["supervisor"]["ok"] and status["components"]["broker"]["storage"] == "disk"
    dstack.cli("down")
    dstack.cli("up", "--detach", timeout=600)
    assert _snapshot(farm, "du-cow") == before
    # the device's token and the farm key still work, and the job goes on from where it was
    t = farm.base_ts + 60_000
    assert farm.api.post("/v1/reports", json={"reports": [
        {"device_id": "du-cow", "ts": t, "lon": 8.505, "lat": 47.005},
        {"device_id": "du-cow", "ts": t + 10_000, "lon": 8.505, "lat": 47.005}]}).status_code == 202
    farm.wait_seen("du-cow", t + 10_000)
    wait_until(lambda: [e["type"] for e in farm.events(device_id="du-cow")] == ["enter", "exit", "enter"], 30,
               what="the third event after down/up")


def test_kill9_of_every_process_while_reports_are_accepted(dstack):
    farm_id, key = dstack.new_farm("kill all")
    herd = Herd.create(dstack.api_url, farm_id, key, "ka", devices=20, steps=40, seed=5)
    home = dstack.env["HERDFENCE_HOME"]
    stats_box = {}
    writer = threading.Thread(target=lambda: stats_box.update(s=http_writer.write_reports(
        dstack.api_url, herd.reports, key=key, rate=150, batch_size=20, retries=30, progress=False)))
    writer.start()
    time.sleep(2.0)
    groups = _group_pids(home)
    assert {"broker", "broker_store", "job", "api", "supervisor"} <= set(groups), groups
    for pgid in groups.values():                      # every process, children included
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_until(lambda: not any(procs.group_members(g) for g in groups.values()), 20, what="everything to die")
    dstack.cli("up", "--detach", timeout=600)
    writer.join(timeout=600)
    stats = stats_box["s"]
    assert stats.failed == 0 and stats.sent == len(herd.reports), stats.as_dict()
    result = herd.reconcile(timeout=240)
    print(f"kill -9 of everything: {result}")
    assert result["events"] >= 10
    assert (result["lost"], result["duplicated"], result["unexpected"], result["duplicate_event_ids"]) == (0, 0, 0, 0), result


def test_supervisor_restarts_a_killed_redis_master_and_broker(dstack):
    farm, fence_id = _farm_with_events(dstack, "one shard", "os-cow")
    before = _snapshot(farm, "os-cow")
    home = dstack.env["HERDFENCE_HOME"]
    port = int(dstack.redis.get_node_from_key(f"fences:{{{farm.farm_id}}}").port)
    old = read_pid(home, f"redis_{port}")
    kill9(old)
    new = wait_until(lambda: (lambda p: p if p and p != old and alive(p) else None)(read_pid(home, f"redis_{port}")),
                     60, what="the supervisor to restart the Redis master")
    wait_until(lambda: farm.api.get("/v1/fences", headers={"Cache-Control": "no-cache"}).status_code == 200, 60,
               what="the farm to answer again")
    assert _snapshot(farm, "os-cow") == before, "the restarted master lost data"
    assert new != old
    # the broker and its store, killed while reports of a herd are acknowledged and not yet processed
    farm_id, key = dstack.new_farm("broker kill")
    herd = Herd.create(dstack.api_url, farm_id, key, "bk", devices=10, steps=30, seed=9)
    half = len(herd.reports) // 2
    stats = http_writer.write_reports(dstack.api_url, herd.reports.iloc[:half], key=key, batch_size=50,
                                      progress=False)
    assert stats.failed == 0, stats.as_dict()
    brokers = (read_pid(home, "broker"), read_pid(home, "broker_store"))
    for pid in brokers:
        kill9(pid)
    wait_until(lambda: all(alive(read_pid(home, n)) and read_pid(home, n) not in brokers
                           for n in ("broker", "broker_store")), 60, what="the supervisor to restart the broker")
    stats = http_writer.write_reports(dstack.api_url, herd.reports.iloc[half:], key=key, batch_size=50,
                                      retries=20, progress=False)
    assert stats.failed == 0, stats.as_dict()
    result = herd.reconcile(timeout=240)
    print(f"broker kill -9: {result}")
    assert result["events"] >= 5
    assert (result["lost"], result["duplicated"], result["unexpected"], result["duplicate_event_ids"]) == (0, 0, 0, 0), result


def test_a_killed_api_master_takes_its_workers(dstack):
    home = dstack.env["HERDFENCE_HOME"]
    pgid = read_pid(home, "api")
    workers = [p for p in procs.group_members(pgid) if p != pgid]
    assert workers, "the API runs uvicorn workers"
    supervisor = read_pid(home, "supervisor")
    os.kill(supervisor, signal.SIGSTOP)            # nobody cleans up for the workers
    try:
        kill9(pgid)
        wait_until(lambda: not any(alive(p) for p in workers), 30, what="the orphaned workers to exit")
    finally:
        os.kill(supervisor, signal.SIGCONT)
    dstack.cli("up", "--detach", timeout=300)
    assert dstack.client(None).get("/healthz").json() == {"status": "ok"}


def test_503_with_retry_after_while_redis_is_down(dstack):
    farm, _ = _farm_with_events(dstack, "store down", "sd-cow")
    home = dstack.env["HERDFENCE_HOME"]
    supervisor = read_pid(home, "supervisor")
    nodes = [n for n in _group_pids(home) if n.startswith("redis_")]
    os.kill(supervisor, signal.SIGSTOP)
    try:
        for n in nodes:
            kill9(read_pid(home, n))
        fresh = {"Cache-Control": "no-cache"}
        for resp in (farm.api.get("/v1/fences", headers=fresh), farm.api.get("/v1/devices/sd-cow", headers=fresh),
                     farm.api.get("/v1/events", headers=fresh),
                     farm.api.post("/v1/fences", json={"type": "Feature", "properties": {"name": "x"},
                                                       "geometry": square(8.6, 47.1)})):
            assert resp.status_code == 503, (resp.status_code, resp.text)
            assert int(resp.headers["retry-after"]) > 0 and "unavailable" in resp.json()["detail"]
    finally:
        os.kill(supervisor, signal.SIGCONT)
    wait_until(lambda: farm.api.get("/v1/fences", headers={"Cache-Control": "no-cache"}).status_code == 200, 90,
               what="the supervisor to bring Redis back")
    # back means writable on every node too (a fence is written across nodes), on both API workers
    wait_until(lambda: all(farm.api.post("/v1/fences", json={"type": "Feature", "properties": {"name": "back"},
                                                              "geometry": square(8.6 + i / 100, 47.1)}).status_code == 201
                           for i in range(4)), 90, interval=1.0, what="writes to succeed again")
    assert [e["type"] for e in farm.events(device_id="sd-cow")] == ["enter", "exit"]


def test_507_when_redis_is_full_and_nothing_is_evicted(dstack):
    farm, fence_id = _farm_with_events(dstack, "full store", "fs-cow")
    node = dstack.redis.get_node_from_key(f"fences:{{{farm.farm_id}}}")
    direct = dstack.redis.get_redis_connection(node)
    limit = direct.config_get("maxmemory")["maxmemory"]
    direct.config_set("maxmemory", "1mb")                   # far below what the node already holds
    try:
        resp = farm.api.post("/v1/fences", json={"type": "Feature", "properties": {"name": "more"},
                                                 "geometry": square(8.7, 47.3)})
        assert resp.status_code == 507 and int(resp.headers["retry-after"]) > 0, resp.text
        assert "full" in resp.json()["detail"]
        assert farm.api.get(f"/v1/fences/{fence_id}", headers={"Cache-Control": "no-cache"}).status_code == 200
    finally:
        direct.config_set("maxmemory", limit)
    assert _snapshot(farm, "fs-cow")["fences"] == [fence_id]        # nothing was evicted


def test_backup_restore_and_reset(dstack, tmp_path):
    farm, fence_id = _farm_with_events(dstack, "backed up", "bu-cow")
    before = _snapshot(farm, "bu-cow")
    backup_dir = tmp_path / "backup"
    dstack.cli("backup", str(backup_dir), timeout=300)          # while it runs
    assert (backup_dir / "herdfence-backup.json").exists()
    dstack.cli("down")
    fresh = tmp_path / "fresh-home"
    other = Stack(env=disposable_env(fresh), api_url=dstack.api_url)
    dstack.env["_OTHER_HOMES"] = str(fresh)
    other.cli("restore", str(backup_dir))
    other.cli("up", "--detach", timeout=600)
    restored = Farm.attach(other, farm.farm_id, farm.key)
    assert _snapshot(restored, "bu-cow") == before
    # reset: refuses without --yes, then deletes everything of that home
    out = subprocess.run([HERDFENCE, "reset"], env=other.env, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and "--yes" in out.stderr and str(fresh / "redis") in out.stderr, out.stderr
    other.cli("reset", "--yes")
    assert not any((fresh / d).exists() for d in ("redis", "broker", "checkpoint", "history"))
    other.cli("up", "--detach", timeout=600)
    assert restored.api.get("/v1/fences").status_code == 401     # the farm is gone, as asked
    other.cli("down")
    dstack.cli("up", "--detach", timeout=600)                    # the original home is untouched
    assert _snapshot(farm, "bu-cow") == before


def _raise_high_watermarks(home: Path) -> dict[int, int]:
    """Make a hole at the tail of every gps.reports partition of a stopped broker, as a crash between
    Tansu's watermark write and its record write leaves one: the high watermark one past the last
    record. Returns partition → the offset no record holds."""
    from deploy.objectstore import DiskStore
    store = DiskStore(home / "broker")          # the broker's log, opened as its store does
    holes = {}
    for meta in store.list("tansu", "clusters/"):
        parts = meta.key.split("/")             # clusters/<c>/topics/<topic>/partitions/<p>/watermark.json
        if parts[3:4] != ["gps.reports"] or parts[-1] != "watermark.json":
            continue
        data = json.loads(store.read("tansu", meta.key)[1])
        if data.get("high") is None:
            continue
        holes[int(parts[5])] = data["high"]
        data["high"] += 1
        store.put("tansu", meta.key, json.dumps(data).encode(), meta.etag, None)
    store.close()
    return holes


def _plan_next_batch(checkpoint: Path, ends: dict[int, int]) -> None:
    """Log batch N+1 in the Spark checkpoint with these end offsets, not committed (as a crash after
    planning leaves it)."""
    offsets = checkpoint / "offsets"
    last = max(int(f.name) for f in offsets.iterdir() if f.name.isdigit())
    version, metadata, _ = (offsets / str(last)).read_text().splitlines()
    planned = json.dumps({str(p): o for p, o in sorted(ends.items())})
    (offsets / str(last + 1)).write_text("\n".join([version, metadata, planned]))


def test_a_hole_in_the_broker_log_is_skipped_reported_and_processing_goes_on(dstack):
    farm = Farm(dstack, "log hole")
    farm.fence(square(8.50, 47.00))
    cows = [f"hole-{i}" for i in range(16)]
    for cow in cows:
        farm.device(cow)
    last = {cow: farm.report(cow, (8.505, 47.05))[-1] for cow in cows}        # outside: every partition gets records
    for cow, ts in last.items():
        farm.wait_seen(cow, ts)
    dstack.cli("down")
    home = Path(dstack.env["HERDFENCE_HOME"])
    holes = _raise_high_watermarks(home)
    assert len(holes) == 4, holes
    # the crash's state: the job had planned its next batch up to the raised watermarks (Spark logs
    # offsets/N before batch N runs) and replays exactly that range, whose tail no record holds
    _plan_next_batch(home / "checkpoint", {p: h + 1 for p, h in holes.items()})
    dstack.cli("up", "--detach", "--timeout", "120", timeout=300)
    status = json.loads(dstack.cli("status", "--json"))
    gaps = {(g["partition"], g["start"], g["end"]) for g in status["components"]["broker"]["log_gaps"]}
    assert gaps == {(p, h, h + 1) for p, h in holes.items()}, (gaps, holes)
    metrics = dstack.client(None).get("/metrics").text
    assert f"herdfence_broker_log_gaps_total {len(holes)}" in metrics
    # what follows the holes is processed: every cow walks in
    for cow in cows:
        farm.report(cow, (8.505, 47.005), (8.505, 47.005))
    wait_until(lambda: sum(e["type"] == "enter" for e in farm.events()) == len(cows), 60,
               what="an enter per cow after the holes")
    assert "herdfence_broker_log_gaps_total 4" in dstack.client(None).get("/metrics").text   # counted once
