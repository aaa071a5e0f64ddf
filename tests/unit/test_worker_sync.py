"""The secrets stamp that API workers share: a change made in one process is seen by the next read in
another, so a replaced token fails at once whichever worker answers."""
from __future__ import annotations

import multiprocessing

from api import metrics_dir
from api.worker_sync import SharedStamp


def _renew_in_child(directory: str, name: str, out) -> None:
    import os
    os.environ[metrics_dir.ENV] = directory
    out.put(SharedStamp(name).renew())


def test_a_stamp_renewed_by_another_process_is_read_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv(metrics_dir.ENV, str(tmp_path))
    mine = SharedStamp("secrets")
    before = mine.read()
    queue = multiprocessing.get_context("spawn").Queue()
    child = multiprocessing.get_context("spawn").Process(target=_renew_in_child,
                                                         args=(str(tmp_path), "secrets", queue))
    child.start()
    written = queue.get(timeout=60)
    child.join(60)
    assert mine.read() == written != before


def test_without_a_shared_directory_the_stamp_is_local(monkeypatch):
    monkeypatch.delenv(metrics_dir.ENV, raising=False)
    stamp = SharedStamp("secrets")
    assert stamp.read() == bytes(8)
    assert stamp.renew() == stamp.read() != bytes(8)
