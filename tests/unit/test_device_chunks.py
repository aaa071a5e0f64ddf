"""A process task works on bounded chunks of devices (issue 23): every device's rows stay together
and in order, and a batch with few devices is not split at all."""
import pyarrow as pa

from fencing.stream.process import device_chunks


def _reports(devices: list[str]) -> pa.Table:
    return pa.table({"farm_id": ["f"] * len(devices), "device_id": devices,
                     "ts": list(range(len(devices)))})


def test_few_devices_are_one_chunk_the_same_table():
    t = _reports(["a", "b", "a", "c", "b"] * 10)
    assert device_chunks(t, 3) == [t]
    assert device_chunks(t, 100)[0] is t


def test_many_devices_split_keeping_each_device_whole_and_in_order():
    ids = [f"cow-{i % 23}" for i in range(200)]
    t = _reports(ids)
    chunks = device_chunks(t, 5)
    assert len(chunks) == 5                                  # 23 devices, at most 5 a chunk
    assert sum(c.num_rows for c in chunks) == t.num_rows
    seen: set[str] = set()
    for c in chunks:
        devices = set(c.column("device_id").to_pylist())
        assert len(devices) <= 5 and not devices & seen      # a device in one chunk only
        seen |= devices
        ts = c.column("ts").to_pylist()
        assert ts == sorted(ts)                              # arrival order kept
    assert seen == set(ids)
