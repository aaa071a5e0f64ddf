"""A stamp that the API workers of one API master share through an mmap'd file.

A change notice (api/invalidation.py) reaches the other workers a moment after the change, through
Redis: a request that lands on another worker in that moment would still be answered from its cache.
A replaced secret must fail on the very next request, so the worker that changes secrets also writes a
new random stamp here, and every worker compares the stamp (one memory read) before it trusts its
cache. A torn or concurrent write only yields another stamp, and an unexpected stamp only clears a
cache, so no lock is needed. Without a shared directory (a single process, a unit test) the stamp is
process-local, which is all such a process needs.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

from api import metrics_dir

_SIZE = 8


class SharedStamp:
    def __init__(self, name: str):
        self._name = name
        self._map: mmap.mmap | bytearray | None = None

    def _area(self) -> mmap.mmap | bytearray:
        if self._map is None:
            directory = os.environ.get(metrics_dir.ENV)
            if directory is None:
                self._map = bytearray(_SIZE)
            else:
                path = Path(directory) / f"{self._name}.stamp"
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    if os.fstat(fd).st_size < _SIZE:
                        os.ftruncate(fd, _SIZE)
                    self._map = mmap.mmap(fd, _SIZE)
                finally:
                    os.close(fd)
        return self._map

    def read(self) -> bytes:
        return bytes(self._area()[:_SIZE])

    def renew(self) -> bytes:
        stamp = os.urandom(_SIZE)
        self._area()[:_SIZE] = stamp
        return stamp
