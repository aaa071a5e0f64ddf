"""The job driver's sweep of what would otherwise grow with time in Redis: entries of the deleted-fence
set that no device state can name any more (fencing.model.deleted_fences), with stray members hashes of
those fences. Runs every `every_s` on the active job."""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from fencing.model import deleted_fences
from fencing.stream.periodic import Periodic

log = logging.getLogger("herdfence.pruning")
SWEEP_EVERY_S = 3600.0
GRACE_S = 3600.0          # far longer than any micro-batch that could have begun before a deletion


def first_replayable_batch(checkpoint: str) -> int:
    """The first batch Spark may still (re)run: one past the newest in the checkpoint's commit log
    (a committed batch is never replayed)."""
    commits = Path(checkpoint) / "commits"
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(ids) + 1 if ids else 0


class DeletedFencePruner(Periodic):
    def __init__(self, redis, checkpoint: str, run_id: Callable[[], str], every_s: float = SWEEP_EVERY_S,
                 grace_s: float = GRACE_S) -> None:
        super().__init__("deleted-fence-pruner", every_s)
        self.redis, self.checkpoint, self.run_id, self.grace_s = redis, checkpoint, run_id, grace_s

    def tick(self) -> None:
        dropped = deleted_fences.prune(self.redis, self.grace_s, self.run_id(),
                                       first_replayable_batch(self.checkpoint))
        if dropped:
            log.info("pruned %d deleted fences no device state names", len(dropped))
