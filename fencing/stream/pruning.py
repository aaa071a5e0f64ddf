"""The job driver's sweeps of what would otherwise grow with time: entries of the deleted-fence set that
no device state can name any more, with stray members hashes of those fences
(fencing.model.deleted_fences), and the position history's small files (fencing.model.history_compact).
Both run on timers of the active job and touch only what no batch can still (re)write."""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from fencing.model import deleted_fences, history_compact
from fencing.stream.periodic import Periodic

log = logging.getLogger("herdfence.pruning")
SWEEP_EVERY_S = 3600.0
GRACE_S = 3600.0          # far longer than any micro-batch that could have begun before a deletion
COMPACT_EVERY_S = 600.0   # at 4 batches/s and 3 partitions: ~7,000 small files merged per pass


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


class HistoryCompactor(Periodic):
    def __init__(self, root: str, checkpoint: str, run_id: Callable[[], str], every_s: float = COMPACT_EVERY_S) -> None:
        super().__init__("history-compactor", every_s)
        self.root, self.checkpoint, self.run_id = root, checkpoint, run_id

    def tick(self) -> None:
        done = history_compact.compact(self.root, self.run_id(), first_replayable_batch(self.checkpoint))
        if done.merged_files or done.recovered:
            log.info("history: %d small files merged into %d, %d leftovers of an interrupted pass removed",
                     done.merged_files, done.written, done.recovered)
