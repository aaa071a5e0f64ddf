"""The broker's object store (deploy/objectstore.py) as its real process, over HTTP: the S3 calls
Tansu makes, conditional writes honoured, and nothing acknowledged lost to a kill -9; its log
(deploy/objectlog.py) opened again after cut-off writes, compacted, and moved from files."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from xml.etree import ElementTree

import httpx
import pytest

from deploy.procs import port_open
from tests.conftest import OFFSET, ROOT, wait_for

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


def _store(path: Path, **kw):
    """A DiskStore whose clock the test sets (ns): objects written 'an hour ago' without touching files."""
    from deploy.objectstore import DiskStore
    clock = {"now": time.time_ns()}
    return DiskStore(path, clock=lambda: clock["now"], **kw), clock


def test_retention_deletes_only_consumed_objects_older_than_the_window(tmp_path):
    """deploy/broker_retention.py against a real DiskStore and a Spark-style checkpoint: an object goes
    only when every record in it is below the committed end of its partition and it is older than
    the window; the newest object of a partition, other topics and uncommitted batches stay."""
    from deploy.broker_retention import Retention, committed_ends
    store, clock = _store(tmp_path / "objects")
    now_ns = clock["now"]
    old, now = now_ns - 3600 * 10**9, now_ns

    def put(topic: str, partition: int, base: int, mtime_ns: int) -> str:
        key = f"clusters/c/topics/{topic}/partitions/{partition:010d}/records/{base:020d}.batch"
        clock["now"] = mtime_ns
        store.put("tansu", key, b"x", None, None)
        clock["now"] = now_ns
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
    # p1: [0,50) is consumed (50 <= 95) and old: gone; [50,90) is consumed but new: kept (the window)
    assert p1[0] not in left and {p1[1], p1[2]} <= left
    assert set(events) <= left, "only gps.reports, whose consumer is the job, is swept"
    assert swept.deleted == 3
    store.close()
    from deploy.objectstore import DiskStore
    again = DiskStore(tmp_path / "objects")
    assert {m.key for m in again.list("tansu", "clusters/")} == left, "the deletes hold across a restart"


def test_a_backup_holds_retention_and_compaction_and_a_forgotten_hold_lapses(tmp_path):
    """While `herdfence backup` copies (checkpoint first, broker log last) no consumed object may go and
    no segment may move; a hold left behind by a killed backup stops holding after an hour."""
    from deploy.broker_retention import HOLD_MAX_S, Retention, hold_path
    from deploy.objectstore import Compactor
    store, clock = _store(tmp_path / "objects", segment_bytes=256)
    now_ns = clock["now"]
    clock["now"] = now_ns - 3600 * 10**9
    keys = []
    for base in (0, 100, 200):
        key = f"clusters/c/topics/gps.reports/partitions/{0:010d}/records/{base:020d}.batch"
        store.put("tansu", key, b"x" * 300, None, None)          # a segment each
        keys.append(key)
    clock["now"] = now_ns
    checkpoint = tmp_path / "home" / "checkpoint"
    for sub in ("offsets", "commits"):
        (checkpoint / sub).mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text('v1\n{}\n{"0": 300}')
    (checkpoint / "commits" / "0").write_text("v1\n{}")
    hold = hold_path(checkpoint)
    assert hold.parent == tmp_path / "home" / "run"
    hold.parent.mkdir(parents=True)
    hold.write_text("1\n")
    retention, compactor = Retention(store, checkpoint, keep_s=0), Compactor(store, checkpoint)
    assert retention.run_once() is None
    assert len(store.list("tansu", "clusters/")) == 3
    store.delete("tansu", keys[0])                                   # a segment of dead records
    segments = set(store.segment_sizes())
    assert store.compactable() and asyncio.run(compactor.run_once()) == 0
    assert set(store.segment_sizes()) == segments, "no segment may go while a backup copies"
    stale = time.time() - HOLD_MAX_S - 1
    os.utime(hold, (stale, stale))
    assert retention.run_once().deleted == 1          # the newest object of a partition always stays
    assert [m.key for m in store.list("tansu", "clusters/")] == [keys[2]]
    assert asyncio.run(compactor.run_once()) >= 2 and not store.compactable()


def test_conditional_writes_hold_across_a_kill9(store):
    """A version's ETag is the same after the store restarts, a stale one stays stale, and no ETag is
    ever issued twice (a deleted and recreated object gets a new one)."""
    s3, restart_after_kill9 = store
    url = "/tansu/clusters/c/topics/t/partitions/0/watermark.json"
    e1 = s3.put(url, content=b'{"high":1}', headers={"If-None-Match": "*"}).headers["etag"]
    e2 = s3.put(url, content=b'{"high":2}', headers={"If-Match": e1}).headers["etag"]
    restart_after_kill9()
    got = s3.get(url)
    assert (got.content, got.headers["etag"]) == (b'{"high":2}', e2)
    assert s3.put(url, content=b'{"high":9}', headers={"If-Match": e1}).status_code == 412
    assert s3.put(url, content=b'{"high":9}', headers={"If-None-Match": "*"}).status_code == 412
    e3 = s3.put(url, content=b'{"high":3}', headers={"If-Match": e2}).headers["etag"]
    assert s3.put(url, content=b'{"high":9}', headers={"If-Match": e2}).status_code == 412
    assert s3.delete(url).status_code == 204
    restart_after_kill9()
    assert s3.get(url).status_code == 404
    assert s3.put(url, content=b'{"high":3}', headers={"If-Match": e3}).status_code == 412, "deleted"
    e4 = s3.put(url, content=b'{"high":3}', headers={"If-None-Match": "*"}).headers["etag"]
    assert e4 not in (e1, e2, e3)


def test_a_kill9_mid_flood_loses_nothing_acknowledged(store):
    """Writers create batches and replace a watermark as fast as they can while the store is killed:
    every acknowledged object reads back with its ETag, and each watermark holds at least the last
    acknowledged value."""
    s3, restart_after_kill9 = store
    acked: dict[str, tuple[bytes, str]] = {}
    marks: dict[int, int] = {}
    lock = threading.Lock()

    def writer(w: int) -> None:
        client = httpx.Client(base_url=str(s3.base_url), timeout=5)
        wm = f"/tansu/w{w}/watermark.json"
        try:
            etag = client.put(wm, content=b"0", headers={"If-None-Match": "*"}).headers["etag"]
            for i in range(1, 100_000):
                body = os.urandom(200) + str(i).encode()
                url = f"/tansu/w{w}/records/{i:020d}.batch"
                r = client.put(url, content=body, headers={"If-None-Match": "*"})
                assert r.status_code == 200
                with lock:
                    acked[url] = (body, r.headers["etag"])
                r = client.put(wm, content=str(i).encode(), headers={"If-Match": etag})
                assert r.status_code == 200
                etag = r.headers["etag"]
                with lock:
                    marks[w] = i
        except httpx.TransportError:
            return                        # the store is gone: what was acknowledged is counted
        finally:
            client.close()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(acked) >= 400, 30, 0.01, what="400 acknowledged writes")
    restart_after_kill9()
    for t in threads:
        t.join(10)
    assert len(acked) >= 400 and len(marks) == 4
    for url, (body, etag) in acked.items():
        got = s3.get(url)
        assert got.status_code == 200 and got.content == body and got.headers["etag"] == etag, url
    for w, i in marks.items():
        assert int(s3.get(f"/tansu/w{w}/watermark.json").content) >= i


def test_a_write_cut_off_before_its_acknowledgement_is_dropped(tmp_path):
    """A record cut short (kill -9 inside write(2)) or corrupt at the end of the log is dropped when the
    log is opened again, and what follows is appended after the last whole record."""
    from deploy.objectlog import SEGMENTS
    from deploy.objectstore import DiskStore
    store = DiskStore(tmp_path)
    metas = {f"t/{i}.batch": store.put("tansu", f"t/{i}.batch", os.urandom(500), None, "*") for i in range(20)}
    store.close()
    segment = max((tmp_path / SEGMENTS).iterdir())
    whole = segment.read_bytes()
    store = DiskStore(tmp_path)
    store.put("tansu", "t/cut.batch", b"y" * 1000, None, "*")
    store.close()
    record = segment.read_bytes()[len(whole):]
    for tail in (record[:len(record) // 2],                                     # cut short
                 record[:-1] + bytes([record[-1] ^ 1])):                        # its last byte wrong
        segment.write_bytes(whole + tail)
        store = DiskStore(tmp_path)
        assert store.meta("tansu", "t/cut.batch") is None
        assert {k: store.meta("tansu", k) for k in metas} == metas
        assert segment.stat().st_size == len(whole), "cut back to the last whole record"
        store.put("tansu", "t/next.batch", b"z", None, None)
        store.close()
        store = DiskStore(tmp_path)
        assert store.read("tansu", "t/next.batch")[1] == b"z"
        store.delete("tansu", "t/next.batch")
        store.close()
        whole = segment.read_bytes()


def test_compaction_keeps_every_current_version_and_no_deleted_object_comes_back(tmp_path):
    """Segments of mostly replaced or deleted objects are compacted away; the objects, their ETags and
    times are the same before, after and after reopening; a tombstone outlives the older segment that
    still holds the put it deletes; no ETag is issued twice, even once compaction dropped its record."""
    store, clock = _store(tmp_path, segment_bytes=4096)
    expected: dict[str, tuple[bytes, object]] = {}
    issued = set()

    def put(key: str, body: bytes) -> None:
        meta = store.put("tansu", key, body, None, None)
        issued.add(meta.etag)
        expected[key] = (body, meta)

    def delete(key: str) -> None:
        store.delete("tansu", key)
        expected.pop(key)
    put("keep/big.json", os.urandom(3000))         # keeps the first segment mostly live
    put("gone/k.batch", b"k" * 100)                 # its put stays in that first segment
    for i in range(60):
        clock["now"] += 10**9
        put(f"r/{i:04d}.batch", os.urandom(400))
        put("r/watermark.json", str(i).encode())
    delete("gone/k.batch")                          # the tombstone lands in a later segment
    for i in range(55):
        delete(f"r/{i:04d}.batch")

    def state(s) -> dict:
        return {m.key: (s.read("tansu", m.key)[1], m) for m in s.list("tansu", "")}
    assert state(store) == expected
    first = min(store.segment_sizes())
    before = len(store.segment_sizes())
    removed = store.compact()
    assert removed >= before // 2 and first in store.segment_sizes(), (removed, before)
    assert state(store) == expected
    for _ in range(2):
        store.close()
        store, clock = _store(tmp_path, segment_bytes=4096)
        assert state(store) == expected, "the same objects after reopening"
        assert store.meta("tansu", "gone/k.batch") is None, "a deleted object came back"
        store.compact()
    delete("keep/big.json")             # now the first segment goes too, and every tombstone with it
    store.compact()
    assert first not in store.segment_sizes()
    store.close()
    store, clock = _store(tmp_path, segment_bytes=4096)
    assert state(store) == expected
    for i in range(5):
        meta = store.put("tansu", f"gone/{i}", b"again", None, None)
        assert meta.etag not in issued, "an ETag issued twice"


def test_no_etag_is_issued_twice_when_compaction_dropped_every_record_that_held_it(tmp_path):
    from deploy.objectstore import DiskStore
    store = DiskStore(tmp_path, segment_bytes=1000)
    first = store.put("tansu", "a", b"x" * 900, None, None)
    store.delete("tansu", "a")                      # its tombstone fills the segment: the log rolls
    assert store.compact() == 1                     # the put and its tombstone are gone
    store.close()
    store = DiskStore(tmp_path, segment_bytes=1000)
    assert store.put("tansu", "a", b"y", None, None).etag != first.etag


def test_objects_stored_as_files_move_into_the_log(tmp_path):
    """A broker folder of the earlier layout (an object per file) is read into the log when the store
    opens it: the same objects and modification times, the files gone."""
    from deploy.objectstore import DiskStore
    files = {"clusters/c/topics/t/partitions/0/watermark.json": b'{"high":7}',
             "clusters/c/topics/t/partitions/0/records/00000000000000000000.batch": b"batch",
             "clusters/c/meta.json": b"{}"}
    old = time.time() - 3600
    for key, body in files.items():
        path = tmp_path / "tansu" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        os.utime(path, (old, old))
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "cut-off-write").write_bytes(b"half")
    store = DiskStore(tmp_path)
    assert {m.key: store.read("tansu", m.key)[1] for m in store.list("tansu", "")} == files
    assert all(abs(m.mtime - old) < 1 for m in store.list("tansu", ""))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["segments"]
    store.close()
    assert {m.key for m in DiskStore(tmp_path).list("tansu", "")} == set(files)


def test_a_full_disk_answers_507_and_keeps_the_log_whole(tmp_path):
    """A write the disk cannot take (here: a file size limit) is refused with 507 and leaves no torn
    record behind: the writes before and after it are read back after reopening."""
    script = f"""
import resource, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from deploy.objectstore import DiskStore, S3Error
store = DiskStore({str(tmp_path)!r})
store.put("tansu", "a.batch", b"a" * 100, None, None)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (store.segment_sizes()[1][0] + 2000, resource.RLIM_INFINITY))
try:
    store.put("tansu", "big.batch", b"b" * 10_000, None, None)
    sys.exit("a write past the limit was acknowledged")
except S3Error as e:
    assert e.status == 507, e.status
store.put("tansu", "c.batch", b"c" * 100, None, None)
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    from deploy.objectstore import DiskStore
    store = DiskStore(tmp_path)
    assert [m.key for m in store.list("tansu", "")] == ["a.batch", "c.batch"]
    assert store.read("tansu", "c.batch")[1] == b"c" * 100


def test_hostile_requests_get_a_4xx(store):
    s3, _ = store
    assert s3.put("/tansu/" + "k" * 2000, content=b"x").status_code == 400
    assert s3.put("/tansu/a//b", content=b"x").status_code == 400
    assert s3.post("/tansu/a", content=b"x").status_code == 405
    assert s3.get("/tansu/a?uploads").status_code == 501
    assert s3.get("/tansu/a.batch", headers={"Range": "bytes=x-y"}).status_code in (400, 404)
    s3.put("/tansu/r.batch", content=b"0123456789")
    assert s3.get("/tansu/r.batch", headers={"Range": "bytes=x-y"}).status_code == 400
    assert s3.get("/tansu/r.batch", headers={"Range": "bytes=20-30"}).status_code == 416
    with socket.create_connection(("127.0.0.1", PORT), timeout=5) as raw:
        raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.1 400 ")
    assert s3.get("/tansu/r.batch").content == b"0123456789", "the store still serves"


def test_a_body_over_the_limit_gets_413(tmp_path):
    """The server in this process with a small body limit: a larger PUT is refused, nothing stored."""
    from deploy.objectstore import DiskStore, serve
    port = PORT + 1
    store = DiskStore(tmp_path)
    loop = asyncio.new_event_loop()
    task = loop.create_task(serve(store, port, max_body=1000))

    def run() -> None:
        try:
            loop.run_until_complete(task)
        except asyncio.CancelledError:
            pass
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: port_open(port), 10, 0.05, what="the in-process store")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as s3:
            assert s3.put("/tansu/small", content=b"x" * 1000).status_code == 200
            assert s3.put("/tansu/big", content=b"x" * 1001).status_code == 413
            assert s3.get("/tansu/big").status_code == 404
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(10)
