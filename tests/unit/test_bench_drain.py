"""The backlog drain's count of handled reports, across a job that restarts in the middle."""
from __future__ import annotations

from loadgen.bench_drain import _Handled


def test_handled_counts_from_its_start_and_across_a_restarted_job():
    counter = _Handled(1000)             # the flood's reports, all handled before the drain
    assert counter.add(1000) == 0
    assert counter.add(1500) == 500
    assert counter.add(300) == 800       # a new job process counts from zero: its total is new work
    assert counter.add(400) == 900
