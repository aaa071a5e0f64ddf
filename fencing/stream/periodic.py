"""A timer thread of the job driver: `tick()` every `every_s` seconds until stopped (never, for a period
of 0 or less). A failed tick (a Redis failover, say) is logged and tried again at the next one: a timer
never dies."""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("herdfence.periodic")


class Periodic(threading.Thread):
    def __init__(self, name: str, every_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self.every_s = every_s
        self.stopped = threading.Event()

    def tick(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        while self.every_s > 0 and not self.stopped.wait(self.every_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - retried at the next tick
                log.exception("%s failed; retrying at the next tick", self.name)
