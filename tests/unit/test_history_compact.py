"""History compaction (fencing/model/history_compact.py) on real Parquet files: the small per-batch files
of committed batches become one merged file per day, rows unchanged; a batch that may be replayed
keeps its own file (and a replay of it adds no row twice); an interrupted pass loses and doubles
nothing; a day that is over ends as one file."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from fencing.model import history
from fencing.model.history_compact import compact

DAY_MS = 86_400_000
T0 = 1_732_492_800_000          # 2024-11-25T00:00Z
TODAY = datetime(2024, 11, 25, 12, tzinfo=timezone.utc)


def _reports(batch: int, part: int, day: int = 0) -> pa.Table:
    n = 5
    return pa.table({"farm_id": ["farm-a"] * n, "device_id": [f"cow-{batch}-{part}-{i}" for i in range(n)],
                     "ts": [T0 + day * DAY_MS + batch * 1000 + i for i in range(n)],
                     "lat": [47.0 + i / 100 for i in range(n)], "lon": [8.5] * n, "battery": [80.0] * n})


def _write(root: Path, run: str, batches: range, parts: int = 3, day: int = 0) -> None:
    for b in batches:
        for p in range(parts):
            history.write_batch(str(root), f"{run}:{b}", p, _reports(b, p, day))


def _rows(root: Path) -> list[tuple]:
    t = history.read(str(root), "farm-a")
    return sorted(zip(t.column("device_id").to_pylist(), t.column("ts").to_pylist()))


def _files(root: Path, day: str = "2024-11-25") -> list[str]:
    return sorted(p.name for p in (root / f"day={day}").iterdir())


def test_committed_batch_files_merge_and_rows_stay_the_same(tmp_path):
    _write(tmp_path, "r1", range(10))
    before = _rows(tmp_path)
    assert len(_files(tmp_path)) == 30
    done = compact(str(tmp_path), "r1", first_replayable=8, today=TODAY)
    assert done.merged_files == 24 and done.written == 1
    files = _files(tmp_path)
    assert len(files) == 1 + 6                       # the merged file + batches 8 and 9, 3 partitions each
    assert all(f.startswith("batch-r1-8-") or f.startswith("batch-r1-9-") for f in files if f.startswith("batch"))
    assert _rows(tmp_path) == before
    # batch 9 replayed (it was not committed): it rewrites its own files, no row twice
    _write(tmp_path, "r1", range(9, 10))
    assert _rows(tmp_path) == before
    # next pass: every batch committed, another run's files are never replayed by this one
    _write(tmp_path, "r0", range(3))
    assert compact(str(tmp_path), "r1", first_replayable=10, today=TODAY).merged_files == 6 + 9
    assert len(_files(tmp_path)) == 2
    assert len(_rows(tmp_path)) == len(before) + 3 * 3 * 5


def test_an_interrupted_pass_is_finished_and_a_closed_day_ends_as_one_file(tmp_path):
    _write(tmp_path, "r1", range(4), day=-3)
    day = "2024-11-22"
    before = _rows(tmp_path)
    sources = {f: (tmp_path / f"day={day}" / f).read_bytes() for f in _files(tmp_path, day)}
    compact(str(tmp_path), "r1", first_replayable=4, today=TODAY)
    assert len(_files(tmp_path, day)) == 1
    # a crash after the merged file was renamed into place, before its sources were removed
    for name, data in sources.items():
        (tmp_path / f"day={day}" / name).write_bytes(data)
    (tmp_path / f"day={day}" / ".compact-half.parquet.tmp").write_bytes(b"PAR1 half")
    done = compact(str(tmp_path), "r1", first_replayable=4, today=TODAY)
    assert done.recovered == len(sources)
    assert _rows(tmp_path) == before
    assert len(_files(tmp_path, day)) == 1
    # later, a late report for that day, merged in again: the day is over, so one file holds it all
    _write(tmp_path, "r1", range(4, 5), day=-3)
    compact(str(tmp_path), "r1", first_replayable=5, today=TODAY)
    assert len(_files(tmp_path, day)) == 1 and len(_rows(tmp_path)) == len(before) + 15


def test_a_pass_never_drops_the_half_written_merge_of_a_pass_still_running(tmp_path):
    """Two passes side by side (the job's timer and a manual one): the second waits for the first's
    lock instead of taking its scratch file for a crashed pass's leftover."""
    import threading

    from fencing.model import history_compact
    day = tmp_path / "day=2026-01-01"
    day.mkdir()
    scratch = day / ".compact-live.parquet.tmp"
    with history_compact._one_pass_at_a_time(str(tmp_path)):       # the running pass
        scratch.write_bytes(b"half written")
        second = threading.Thread(target=history_compact.finish_interrupted, args=(str(tmp_path),))
        second.start()
        second.join(1.0)
        assert second.is_alive() and scratch.exists()                # it waits; the scratch stays
    second.join(10)
    assert not second.is_alive() and not scratch.exists()           # alone now: a leftover, dropped
