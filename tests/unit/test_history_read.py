"""Reading the Parquet position history (fencing.model.history.read) with a limit: the answer is the
first `limit` rows of the whole filtered read, row for row (ties included), and the day folders after
the one that fills the limit are not read."""
from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fencing.model import history

DAY_MS = 86_400_000
T0 = 1_732_492_800_000          # 2024-11-25T00:00Z


def _write_days(root: Path, days: int = 4, batches: int = 3, parts: int = 2) -> None:
    rnd = random.Random(1)
    for day in range(days):
        for batch in range(batches):
            for part in range(parts):
                n = 40
                ts = [T0 + day * DAY_MS + rnd.randrange(20) * 1000 for _ in range(n)]   # many ties
                table = pa.table({"farm_id": [rnd.choice(["farm-a", "farm-a", "farm-b"]) for _ in range(n)],
                                  "device_id": [f"cow-{rnd.randrange(5)}" for _ in range(n)], "ts": ts,
                                  "lat": [rnd.random() for _ in range(n)], "lon": [rnd.random() for _ in range(n)],
                                  "battery": [float(rnd.randrange(100)) for _ in range(n)]})
                history.write_batch(str(root), f"run:{day * 10 + batch}", part, table)


def _rows(table: pa.Table) -> list[dict]:
    return table.to_pylist()


@pytest.mark.parametrize("filters", [
    {}, {"device_id": "cow-2"}, {"device_ids": ["cow-1", "cow-4"]}, {"device_id": "nobody"},
    {"from_ms": T0 + DAY_MS + 5000}, {"to_ms": T0 + 2 * DAY_MS + 3000},
    {"from_ms": T0 + DAY_MS, "to_ms": T0 + 3 * DAY_MS - 1, "device_id": "cow-0"}])
def test_a_limited_read_is_the_start_of_the_whole_read(tmp_path, filters):
    _write_days(tmp_path)
    whole = history.read(str(tmp_path), "farm-a", **filters)
    for limit in (1, 7, 39, 40, 41, 150, 333, 10_000):
        assert _rows(history.read(str(tmp_path), "farm-a", limit=limit, **filters)) == \
            _rows(whole.slice(0, limit)), limit


def test_days_after_the_limit_are_not_read(tmp_path):
    _write_days(tmp_path)
    last = max(tmp_path.glob("day=*"))
    # a file whose columns cannot be read as the history's: reading that day fails
    pq.write_table(pa.table({"farm_id": ["farm-a"], "device_id": ["cow-1"], "ts": ["not a time"],
                             "lat": ["x"], "lon": ["y"], "battery": ["z"]}), last / "batch-run-99-part-0000.parquet")
    with pytest.raises(pa.ArrowInvalid):
        history.read(str(tmp_path), "farm-a")
    first_day = history.read(str(tmp_path), "farm-a", to_ms=T0 + DAY_MS - 1)
    assert first_day.num_rows > 50
    assert _rows(history.read(str(tmp_path), "farm-a", limit=50)) == _rows(first_day.slice(0, 50))
