"""The broker's object store (deploy/objectstore.py) as its real process, over HTTP: the S3 calls
Tansu makes, conditional writes honoured, and nothing acknowledged lost to a kill -9."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from xml.etree import ElementTree

import httpx
import pytest

from deploy.procs import port_open
from tests.conftest import OFFSET, ROOT

PORT = 26093 + OFFSET
NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def _start(root) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "deploy.objectstore", "--root", str(root), "--port", str(PORT)],
                            cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 20
    while not port_open(PORT):
        assert proc.poll() is None and time.monotonic() < deadline, "the object store did not start"
        time.sleep(0.05)
    return proc


@pytest.fixture()
def store(tmp_path):
    if port_open(PORT):
        pytest.skip(f"port {PORT} busy")
    root = tmp_path / "objects"
    box = {"proc": _start(root)}

    def restart_after_kill9():
        os.killpg(box["proc"].pid, signal.SIGKILL)
        box["proc"].wait()
        box["proc"] = _start(root)
    client = httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=10)
    yield client, restart_after_kill9
    client.close()
    os.killpg(box["proc"].pid, signal.SIGKILL)
    box["proc"].wait()


def test_conditional_put_create_and_replace(store):
    s3, _ = store
    url = "/tansu/clusters/c/topics/t/partitions/0/watermark.json"
    first = s3.put(url, content=b'{"high":0}', headers={"If-None-Match": "*"})
    assert first.status_code == 200 and first.headers["etag"]
    again = s3.put(url, content=b'{"high":9}', headers={"If-None-Match": "*"})
    assert again.status_code == 412, "a second create must be refused"
    stale = s3.put(url, content=b'{"high":5}', headers={"If-Match": '"not-the-etag"'})
    assert stale.status_code == 412, "a write against an old version must be refused"
    ok = s3.put(url, content=b'{"high":5}', headers={"If-Match": first.headers["etag"]})
    assert ok.status_code == 200 and ok.headers["etag"] != first.headers["etag"]
    late = s3.put(url, content=b'{"high":6}', headers={"If-Match": first.headers["etag"]})
    assert late.status_code == 412, "the first etag is stale after the replace"
    got = s3.get(url)
    assert got.content == b'{"high":5}' and got.headers["etag"] == ok.headers["etag"]
    assert s3.put("/tansu/missing.json", content=b"x", headers={"If-Match": ok.headers["etag"]}).status_code == 412


def test_get_head_range_delete_and_list(store):
    s3, _ = store
    for key in ("a/0/x.batch", "a/0/y.batch", "a/1/z.batch", "b/w.json"):
        assert s3.put(f"/tansu/{key}", content=key.encode()).status_code == 200
    assert s3.get("/tansu/a/0/x.batch", headers={"Range": "bytes=2-4"}).content == b"0/x"
    assert s3.head("/tansu/a/1/z.batch").headers["content-length"] == str(len("a/1/z.batch"))
    assert s3.get("/tansu/nope").status_code == 404

    def keys(**params):
        root = ElementTree.fromstring(s3.get("/tansu", params={"list-type": "2", **params}).content)
        return ([e.findtext(f"{NS}Key") for e in root.iter(f"{NS}Contents")],
                [e.findtext(f"{NS}Prefix") for e in root.iter(f"{NS}CommonPrefixes")],
                root.findtext(f"{NS}NextContinuationToken"))
    assert keys(prefix="a/")[0] == ["a/0/x.batch", "a/0/y.batch", "a/1/z.batch"]
    assert keys(prefix="a/", delimiter="/")[1] == ["a/0/", "a/1/"]
    page, _, token = keys(prefix="a/", **{"max-keys": "2"})
    assert page == ["a/0/x.batch", "a/0/y.batch"] and token
    assert keys(prefix="a/", **{"continuation-token": token})[0] == ["a/1/z.batch"]
    assert s3.delete("/tansu/a/1/z.batch").status_code == 204
    assert keys(prefix="a/1")[0] == []
    assert s3.get("/tansu/../../etc/passwd").status_code in (400, 404)


def test_acknowledged_objects_survive_kill9(store):
    s3, restart_after_kill9 = store
    etags = {}
    for i in range(200):
        resp = s3.put(f"/tansu/t/records/{i:020d}.batch", content=os.urandom(64) + str(i).encode(),
                      headers={"If-None-Match": "*"})
        assert resp.status_code == 200
        etags[i] = resp.headers["etag"]
    restart_after_kill9()
    for i in range(200):
        got = s3.get(f"/tansu/t/records/{i:020d}.batch")
        assert got.status_code == 200 and got.content.endswith(str(i).encode())
        assert got.headers["etag"] == etags[i]
    assert s3.put("/tansu/t/records/00000000000000000007.batch", content=b"again",
                  headers={"If-None-Match": "*"}).status_code == 412


def _keys(s3, **params) -> tuple[list[str], str | None]:
    listed = s3.get("/tansu", params={"list-type": "2", **params})
    assert listed.status_code == 200
    doc = ElementTree.fromstring(listed.content)
    token = doc.find(f"{NS}NextContinuationToken")
    return [k.text for k in doc.iter(f"{NS}Key")], token.text if token is not None else None


def test_listings_page_and_follow_writes_and_deletes_across_a_restart(store):
    """The listing index (kept in memory, read from disk at start) pages by max-keys and
    continuation token, honours start-after, and follows puts and deletes."""
    s3, restart_after_kill9 = store
    folder = "clusters/c/topics/t/partitions/0/records/"
    names = [f"{folder}{i:020d}.batch" for i in range(0, 2500, 10)]       # 250 objects
    for name in names[::-1]:                                              # written out of order
        assert s3.put(f"/tansu/{name}", content=b"x").status_code == 200
    s3.put("/tansu/clusters/c/topics/t/partitions/1/records/00000000000000000000.batch", content=b"y")
    restart_after_kill9()                        # the index is rebuilt from the files
    seen, token = [], None
    while True:
        page, token = _keys(s3, prefix=folder, **({"max-keys": "100"} | ({"continuation-token": token} if token else {})))
        seen += page
        if token is None:
            break
    assert seen == names, "every object of the folder once, in key order, and no other folder's"
    assert _keys(s3, prefix=folder, **{"start-after": names[247]})[0] == names[248:]
    s3.delete(f"/tansu/{names[0]}")
    s3.put(f"/tansu/{folder}{5:020d}.batch", content=b"z")
    assert _keys(s3, prefix=folder, **{"max-keys": "2"})[0] == [f"{folder}{5:020d}.batch", names[1]]


def test_retention_deletes_only_consumed_objects_older_than_the_window(tmp_path):
    """deploy/broker_retention.py against a real DiskStore and a Spark-style checkpoint: an object goes
    only when every record in it is below the committed end of its partition and it is older than
    the window; the newest object of a partition, other topics and uncommitted batches stay."""
    from deploy.broker_retention import Retention, committed_ends
    from deploy.objectstore import DiskStore
    store = DiskStore(tmp_path / "objects")
    old, now = time.time() - 3600, time.time()

    def put(topic: str, partition: int, base: int, mtime: float) -> str:
        key = f"clusters/c/topics/{topic}/partitions/{partition:010d}/records/{base:020d}.batch"
        store.put("tansu", key, b"x", None, None)
        path = tmp_path / "objects" / "tansu" / key
        os.utime(path, (mtime, mtime))
        store._indexed("tansu", key, store.meta("tansu", key))       # the index follows the file's age
        return key
    p0 = [put("gps.reports", 0, base, old) for base in (0, 100, 200, 300)]
    p1 = [put("gps.reports", 1, 0, old), put("gps.reports", 1, 50, now), put("gps.reports", 1, 90, now)]
    events = [put("fence.events", 0, 0, old), put("fence.events", 0, 10, old)]
    checkpoint = tmp_path / "checkpoint"
    for sub in ("offsets", "commits"):
        (checkpoint / sub).mkdir(parents=True)
    retention = Retention(store, checkpoint, keep_s=600)
    assert retention.run_once() is None, "no committed batch yet: nothing may go"
    meta = '{"batchWatermarkMs":0}'
    (checkpoint / "offsets" / "4").write_text(f'v1\n{meta}\n{{"0": 250, "1": 95}}')
    (checkpoint / "commits" / "4").write_text("v1\n{}")
    (checkpoint / "offsets" / "5").write_text(f'v1\n{meta}\n{{"0": 400, "1": 120}}')   # planned, not committed
    assert committed_ends(checkpoint) == {0: 250, 1: 95}
    swept = retention.run_once()
    left = {m.key for m in store.list("tansu", "clusters/")}
    # p0: [0,100) and [100,200) are below 250; [200,300) is not wholly consumed; the newest stays
    assert left == {p0[2], p0[3], p1[1], p1[2], *events}
    assert p0[0] not in left and p0[1] not in left and {p0[2], p0[3]} <= left
    # p1: [0,50) is consumed (50 <= 95) and old: gone; [50,90) is consumed but new: kept (the window)
    assert p1[0] not in left and {p1[1], p1[2]} <= left
    assert set(events) <= left, "only gps.reports, whose consumer is the job, is swept"
    assert swept.deleted == 3


def test_a_backup_holds_retention_and_a_forgotten_hold_lapses(tmp_path):
    """While `herdfence backup` copies (checkpoint first, broker log last) no consumed object may go;
    a hold left behind by a killed backup stops holding after an hour."""
    from deploy.broker_retention import HOLD_MAX_S, Retention, hold_path
    from deploy.objectstore import DiskStore
    store = DiskStore(tmp_path / "objects")
    old = time.time() - 3600
    keys = []
    for base in (0, 100, 200):
        key = f"clusters/c/topics/gps.reports/partitions/{0:010d}/records/{base:020d}.batch"
        store.put("tansu", key, b"x", None, None)
        os.utime(tmp_path / "objects" / "tansu" / key, (old, old))
        store._indexed("tansu", key, store.meta("tansu", key))
        keys.append(key)
    checkpoint = tmp_path / "home" / "checkpoint"
    for sub in ("offsets", "commits"):
        (checkpoint / sub).mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text('v1\n{}\n{"0": 300}')
    (checkpoint / "commits" / "0").write_text("v1\n{}")
    hold = hold_path(checkpoint)
    assert hold.parent == tmp_path / "home" / "run"
    hold.parent.mkdir(parents=True)
    hold.write_text("1\n")
    retention = Retention(store, checkpoint, keep_s=0)
    assert retention.run_once() is None
    assert len(store.list("tansu", "clusters/")) == 3
    stale = time.time() - HOLD_MAX_S - 1
    os.utime(hold, (stale, stale))
    assert retention.run_once().deleted == 2          # the newest object of a partition always stays
    assert [m.key for m in store.list("tansu", "clusters/")] == [keys[2]]
