"""Keep full garbage collections short in long-lived processes that hold many objects.

CPython's full (oldest-generation) collection walks every tracked object: ~100k for the imported
modules alone (20-30 ms), far more with fence caches or thousands of open streams, and the process
does nothing else meanwhile. gc.freeze() moves what is alive out of the collector's sight; frozen
objects are still freed by reference counting, and young garbage is still collected as usual. Only
cyclic garbage among frozen objects waits: once every `full_every_s` a step unfreezes instead, so
that the next full collection walks everything once and takes it.
"""
from __future__ import annotations

import gc
import time


class FreezePolicy:
    def __init__(self, full_every_s: float) -> None:
        self.full_every_s = full_every_s
        self._last_full = time.monotonic()

    def step(self) -> None:
        """Freeze what is alive now, or, once per period, let the next full collection see it all."""
        now = time.monotonic()
        if now - self._last_full >= self.full_every_s:
            self._last_full = now
            gc.unfreeze()
        else:
            gc.freeze()
