"""The driver produces a batch's events from Arrow (issue 23): by (ts, event id), a chunk at a time,
each as its fence id and its public JSON, exactly as the tasks made it."""
import pyarrow as pa

from fencing.stream.rows import EVENT, OUTPUT
from fencing.stream.sinks import event_records


def _events(rows: list[tuple[int, str, str]]) -> pa.Table:
    return pa.Table.from_batches([pa.RecordBatch.from_arrays([
        pa.array([EVENT] * len(rows), pa.int8()),
        pa.array([f'{{"event_id":"{e}","ts":{t}}}' for t, e, _ in rows], pa.string()),
        pa.array([k for _, _, k in rows], pa.string()),
        pa.array([t for t, _, _ in rows], pa.int64()),
        pa.array([e for _, e, _ in rows], pa.string())], schema=OUTPUT)])


def test_records_by_time_then_id_in_any_chunk_size():
    rows = [(30, "b", "f1"), (10, "z", "f2"), (30, "a", "f3"), (20, "c", "f1"), (10, "y", "f9")]
    want = [("f9", '{"event_id":"y","ts":10}'), ("f2", '{"event_id":"z","ts":10}'),
            ("f1", '{"event_id":"c","ts":20}'), ("f3", '{"event_id":"a","ts":30}'),
            ("f1", '{"event_id":"b","ts":30}')]
    for chunk in (1, 2, 5, 100):
        assert list(event_records(_events(rows), chunk)) == want


def test_no_events_no_records():
    assert list(event_records(_events([]))) == []
