"""Kept JSON is compact (fencing/model/compact_json.py, issue 23): a hundred thousand kept records
cost about their own size, not orjson's 4 KB buffer each, and read back the same."""
import os

import orjson

from fencing.model import compact_json
from loadgen.bench_memory import rss_bytes


def test_kept_records_cost_their_size_and_read_back_the_same():
    recs = [{"device_id": f"cow-{i:06d}", "ts": 1735689600000 + i, "lat": 47.0123456, "lon": 8.5123456,
             "battery": 71.4} for i in range(100_000)]
    before = rss_bytes(os.getpid())
    kept = [compact_json.dumps(r) for r in recs]
    per_record = (rss_bytes(os.getpid()) - before) / len(kept)
    assert per_record < 1_000, per_record            # ~90 bytes of JSON each; orjson's own: ~4 KB
    assert [orjson.loads(k) for k in kept[:1000]] == recs[:1000]
    assert kept[5] == orjson.dumps(recs[5]) and type(kept[5]) is bytes
