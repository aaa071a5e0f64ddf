"""fencing/stream/worker_gc.py: a task freezes what is alive; once a period a task lets a full pass through."""
from __future__ import annotations

import gc
import time

from fencing.stream import worker_gc


def test_tasks_freeze_the_heap_and_a_full_collection_comes_once_a_period(monkeypatch):
    try:
        monkeypatch.setattr(worker_gc._policy, "_last_full", time.monotonic())
        worker_gc.task_started()
        frozen = gc.get_freeze_count()
        assert frozen > 10_000                       # the modules' objects at least
        garbage = [[] for _ in range(1000)]
        for a, b in zip(garbage, garbage[1:]):      # cycles made during a task stay collectable
            a.append(b), b.append(a)
        del garbage, a, b
        assert gc.collect() >= 1000
        monkeypatch.setattr(worker_gc._policy, "_last_full", time.monotonic() - worker_gc.FULL_EVERY_S - 1)
        worker_gc.task_started()
        assert gc.get_freeze_count() == 0            # the next collection walks everything
        worker_gc.task_started()
        assert gc.get_freeze_count() >= frozen - 1000
    finally:
        gc.unfreeze()


def test_full_collections_are_timed_and_young_ones_ignored():
    from api.metrics import GcPauses
    pauses = GcPauses()
    pauses.callback("start", {"generation": 0})
    pauses.callback("stop", {"generation": 0})
    assert pauses.count == 0
    gc.callbacks.append(pauses.callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(pauses.callback)
    assert pauses.count == 1 and 0 < pauses.max_s == pauses.seconds


def test_the_collector_is_paused_inside_a_task_and_back_after_it_even_on_an_error():
    assert gc.isenabled()
    with worker_gc.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        with worker_gc.collector_paused():
            raise KeyError("a task failed")
    except KeyError:
        pass
    assert gc.isenabled()
    gc.disable()
    try:
        with worker_gc.collector_paused():      # a process that had it off keeps it off
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
