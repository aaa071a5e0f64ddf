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
