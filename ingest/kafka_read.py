"""Executor side of `herdkafka`: read one KafkaRange [start, end) into Arrow record batches.

Two clients, same contract; `client=confluent` is the default because it is the faster one here
(`herdfence bench ingest` measures the read path). Both stop at `end` even when offsets are missing
inside the range (transaction markers, compaction): an EOF at or past `end` finishes the range.

Gaps. A range can hold offsets that no record holds: on the embedded broker a crash between Tansu's
watermark write and its record write leaves the high watermark past the last record (never
acknowledged to the producer). A fetch inside such a gap returns the next record that exists, and
Kafka's consumers skip to it; a gap at the log's tail returns nothing at all, and a reader would wait
for it forever. So a reader that makes no progress for HOLE_PROBE_S asks the broker with a fresh
consumer: an answered fetch with no record at or after the position, below the high watermark, is a
gap, skipped and reported (`gaps`); a log end below the position is a lost tail (DataLossError).
"""
from __future__ import annotations

import itertools
import logging
import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from ingest.kafka_types import (ARROW_SCHEMA, BATCH_ROWS, FETCH_WAIT_MS, DataLossError, KafkaRange, KafkaRanges,
                                 LogGap)

log = logging.getLogger("herdfence.ingest")
STALL_TIMEOUT_S = 120.0  # no progress for this long inside a range that should exist → error
HOLE_PROBE_S = 2.0       # no progress for this long: ask the broker whether the rest of the range exists
PROBE_WAIT_S = 10.0      # how long a probe waits for the broker's first answer


def _batch(r: KafkaRange, keys: list, values: list, offsets: list, ts_ms: list) -> pa.RecordBatch:
    n = len(values)
    ts = pa.array(np.asarray(ts_ms, dtype=np.int64) * 1000, pa.int64()).cast(ARROW_SCHEMA.field("timestamp").type)
    return pa.RecordBatch.from_arrays([
        pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
        pa.array([r.topic], pa.string()).take(pa.array(np.zeros(n, np.int32))),   # no str object per row
        pa.array(np.full(n, r.partition, np.int32)), pa.array(np.asarray(offsets, np.int64)),
        ts], schema=ARROW_SCHEMA)


def _lost(r: KafkaRange, wanted: int, earliest: int) -> int:
    """Offsets [wanted, earliest) are gone. Raise, or log and skip (failOnDataLoss=false or a
    partition discovered at runtime, whose 'start' was only a guess)."""
    msg = f"{r.topic}[{r.partition}] offsets {wanted}..{earliest - 1} are no longer available"
    if r.fail_on_data_loss and not r.new_partition:
        raise DataLossError(msg + " (set failOnDataLoss=false to skip lost offsets)")
    log.warning("data loss, skipping: %s", msg)
    return earliest


def _gone_tail(r: KafkaRange, log_end: int) -> None:
    msg = f"{r.topic}[{r.partition}] ends at {log_end}, below the planned end {r.end}"
    if r.fail_on_data_loss and not r.new_partition:
        raise DataLossError(msg + " (set failOnDataLoss=false to skip lost offsets)")
    log.warning("data loss, skipping: %s", msg)


def _cached_end(c, r: KafkaRange) -> int:  # noqa: ANN001 - confluent Consumer
    """The log end the consumer's last fetch response for the partition carried (-1: none yet)."""
    from confluent_kafka import TopicPartition
    return c.get_watermark_offsets(TopicPartition(r.topic, r.partition), cached=True)[1]


def read_range(r: KafkaRange, gaps: list[LogGap] | None = None) -> Iterator[pa.RecordBatch]:
    """Records [r.start, r.end); offsets no record holds are appended to `gaps` (when given)."""
    gaps = [] if gaps is None else gaps
    if r.end <= r.start:
        return iter(())
    return _read_confluent((r,), gaps) if r.client == "confluent" else _read_kafka_python(r, gaps)


def read_partition(p: KafkaRange | KafkaRanges, gaps: list[LogGap] | None = None) -> Iterator[pa.RecordBatch]:
    """One planned input partition: a range, or several ranges of a small batch read together."""
    gaps = [] if gaps is None else gaps
    if not isinstance(p, KafkaRanges):
        return read_range(p, gaps)
    todo = tuple(r for r in p.ranges if r.end > r.start)
    # one consumer assignment holds one position per partition: pieces of one partition (minPartitions)
    # are read one after the other
    if todo and all(r.client == "confluent" for r in todo) and len({r.partition for r in todo}) == len(todo):
        return _read_confluent(todo, gaps)
    return itertools.chain.from_iterable(read_range(r, gaps) for r in todo)


def _skip_gap(r: KafkaRange, start: int, end: int, gaps: list[LogGap]) -> None:
    gap = LogGap(r.topic, r.partition, start, end)
    log.warning("%s[%d] offsets %d..%d hold no record (a produce cut off by a crash, never acknowledged): "
                "skipped", r.topic, r.partition, start, end - 1)
    gaps.append(gap)


@dataclass(frozen=True)
class Probe:
    """What a fresh consumer's fetch at `pos` found: the first record's offset (None: no record) and
    the log end the broker answered with (None: no answer, or the position is out of range)."""
    first: int | None
    high: int | None


def probe(r: KafkaRange, pos: int, wait_s: float = PROBE_WAIT_S) -> Probe:
    """Ask the broker directly what it holds at and after `pos` (a fresh consumer: its cached log end
    can only come from a fetch at `pos` answered now)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    c = Consumer({"bootstrap.servers": r.bootstrap, "group.id": "herdfence-probe", "enable.auto.commit": False,
                  "enable.partition.eof": True, "auto.offset.reset": "error", "fetch.wait.max.ms": FETCH_WAIT_MS,
                  "log_level": 3, "fetch.error.backoff.ms": 10})
    try:
        c.assign([TopicPartition(r.topic, r.partition, pos)])
        deadline, answered_at = time.monotonic() + wait_s, None
        while time.monotonic() < deadline:
            for m in c.consume(64, 0.1):
                err = m.error()
                if err is None:
                    return Probe(m.offset(), _cached_end(c, r))
                if err.code() == KafkaError._PARTITION_EOF:
                    return Probe(None, m.offset())
                if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    return Probe(None, None)     # the reader's own consumer meets this error too
            if _cached_end(c, r) >= 0:
                # a fetch was answered; records it carried are delivered with it or on the next
                # consume: several more fetch rounds with nothing means there is nothing
                answered_at = answered_at or time.monotonic()
                if time.monotonic() - answered_at >= 5 * FETCH_WAIT_MS / 1000:
                    return Probe(None, _cached_end(c, r))
        return Probe(None, None)
    finally:
        c.close()


def _check_for_gap(r: KafkaRange, pos: int, gaps: list[LogGap]) -> int:
    """The position to go on from after a reader stalled at `pos` (unchanged: keep waiting)."""
    found = probe(r, pos)
    if found.first is not None or found.high is None:
        return pos                      # records exist (a slow read), or the broker did not answer
    if found.high <= pos:
        _gone_tail(r, found.high)       # the log ends below the position: raises unless allowed
        return r.end
    _skip_gap(r, pos, min(found.high, r.end), gaps)
    if found.high < r.end:
        _gone_tail(r, found.high)
    return r.end


# The idle consumer of this Python worker (bootstrap servers, consumer). Spark reuses its Python workers,
# so a range read by a worker that read one before skips the consumer's start (connect, metadata, first
# fetch): part of every micro-batch's fixed cost. A read owns the consumer until it hands it back.
_idle: tuple[str, object] | None = None

# A consumer that read to the log end has its next fetch in flight there, and Tansu holds that fetch
# until new records arrive or the fetch wait is over: the consumer's next read, of any partition,
# waits for it (~110 ms per reused reader when nothing new arrives, measured). Small ranges read
# together pay it once. Their fetch wait stays FETCH_WAIT_MS: at 20 ms, Tansu on its disk engine
# answered nothing at all to a 4-partition fetch under a 2,000 reports/s feed (a reader stalled 120 s).
def _consumer(bootstrap: str):  # noqa: ANN202 - confluent_kafka.Consumer
    global _idle
    from confluent_kafka import Consumer
    if _idle is not None and _idle[0] == bootstrap:
        consumer, _idle = _idle[1], None
        return consumer
    return Consumer({
        "bootstrap.servers": bootstrap, "group.id": "herdfence-reader",
        "enable.auto.commit": False, "enable.partition.eof": True,
        # "error": an out-of-range start surfaces as an event instead of a silent reset.
        "auto.offset.reset": "error", "fetch.wait.max.ms": FETCH_WAIT_MS,
        "fetch.max.bytes": 104_857_600, "max.partition.fetch.bytes": 104_857_600,
        "receive.message.max.bytes": 209_715_200, "log_level": 3,
        "fetch.error.backoff.ms": 10, "fetch.queue.backoff.ms": 1,
    })


def _hand_back(bootstrap: str, consumer) -> None:  # noqa: ANN001
    """Keep it for the next read (one per worker: a job reads one cluster), closing any other."""
    global _idle
    consumer.unassign()             # stops its prefetching; the next read assigns its own range
    if _idle is not None:
        _idle[1].close()
    _idle = (bootstrap, consumer)


def close_idle() -> None:
    """Close the consumer kept for the next read (a process done reading: its broker may go away)."""
    global _idle
    if _idle is not None:
        _idle[1].close()
        _idle = None


def _in_spark_task() -> bool:
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None


def _take(data: list, r: KafkaRange, pos: int, into: tuple[list, list, list, list], gaps: list[LogGap]) -> int:
    """Append the messages (no errors among them) below `r.end`; returns the next position. Offsets
    skipped on the way (a fetch returns the next record that exists) are reported in `gaps`."""
    if not data or pos >= r.end:
        return pos
    keys, values, offsets, tss = into
    first, last = data[0].offset(), data[-1].offset()
    # offsets are consecutive unless gaps (a crash, compaction, transaction markers) are among them:
    # no call per message in the common case
    offs = range(first, last + 1) if last - first + 1 == len(data) else [m.offset() for m in data]
    if first > pos:
        _skip_gap(r, pos, min(first, r.end), gaps)
    if isinstance(offs, list):
        steps = np.diff(np.asarray(offs, np.int64))
        for i in np.flatnonzero(steps > 1).tolist():
            if offs[i] + 1 < r.end:
                _skip_gap(r, offs[i] + 1, min(offs[i + 1], r.end), gaps)
    end = offs[-1] + 1
    if end > r.end:                 # a fetch returns whole record batches: cut at the range's end
        cut = bisect_left(offs, r.end)
        data, offs, end = data[:cut], offs[:cut], r.end
    keys += [m.key() for m in data]
    values += [m.value() for m in data]
    tss += [m.timestamp()[1] for m in data]
    offsets += offs
    return end


def _on_error(c, r: KafkaRange, m, pos: int) -> tuple[int, bool]:  # noqa: ANN001 - confluent Consumer, Message
    """A consume error inside the range: (the next position, whether to seek there), or raise."""
    from confluent_kafka import KafkaError, TopicPartition
    err = m.error()
    if err.code() == KafkaError._PARTITION_EOF:
        # EOF offset = the high watermark. Below `end` means the log lost the tail that
        # latestOffset saw (truncated / re-created): nothing to wait for.
        if m.offset() < r.end:
            _gone_tail(r, m.offset())
        return r.end, False
    if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        lo, _hi = c.get_watermark_offsets(TopicPartition(r.topic, r.partition), timeout=10)
        pos = _lost(r, pos, lo) if pos < lo else r.end  # past hi: nothing to read
        return pos, pos < r.end
    raise RuntimeError(f"kafka error reading {r}: {err}")


class _Pending:
    """One range being read: its position and the records taken since the last yielded batch."""

    def __init__(self, r: KafkaRange) -> None:
        self.range, self.pos = r, r.start
        self.end_at_assign = -1         # the consumer's cached log end when the range was assigned
        self.rows: tuple[list, list, list, list] = ([], [], [], [])   # keys, values, offsets, timestamps

    def flush(self, force: bool) -> pa.RecordBatch | None:
        keys, values, offsets, tss = self.rows
        if values and (force or len(values) >= BATCH_ROWS):
            self.rows = ([], [], [], [])
            return _batch(self.range, keys, values, offsets, tss)
        return None


def _read_confluent(ranges: tuple[KafkaRange, ...], gaps: list[LogGap]) -> Iterator[pa.RecordBatch]:
    """Ranges of distinct partitions of one topic, all assigned to one consumer and fetched together."""
    from confluent_kafka import TopicPartition
    bootstrap = ranges[0].bootstrap
    c = _consumer(bootstrap)
    open_ = {r.partition: _Pending(r) for r in ranges}
    reusable = False

    def assign() -> None:
        c.assign([TopicPartition(p.range.topic, p.range.partition, p.pos) for p in open_.values()])
        for p in open_.values():
            p.end_at_assign = _cached_end(c, p.range)
    try:
        assign()
        last_progress = last_probe = time.monotonic()
        while open_:
            # Ask for exactly what is left: consume(n, timeout) otherwise waits the whole timeout
            # for n messages (measured: 1 s per call).
            left = sum(p.range.end - p.pos for p in open_.values())
            msgs = c.consume(min(left, BATCH_ROWS), 0.5)
            # (a finished range stays assigned: its partition's messages are skipped here)
            by_partition = _split(msgs) if len(ranges) > 1 else {ranges[0].partition: msgs}
            reassign = False
            for partition, data in by_partition.items():
                p = open_.get(partition)
                if p is None:
                    continue
                # whole-list comprehensions instead of a loop body per message: ~2 µs → ~0.4 µs a record
                errors = [i for i, m in enumerate(data) if m.error() is not None]
                start = 0
                for stop in errors + [len(data)]:
                    p.pos = _take(data[start:stop], p.range, p.pos, p.rows, gaps)
                    if stop < len(data) and p.pos < p.range.end:
                        p.pos, seek = _on_error(c, p.range, data[stop], p.pos)
                        reassign |= seek
                    start = stop + 1
            if msgs:
                last_progress = time.monotonic()
            else:
                for p in open_.values():
                    if 0 <= (hw := _cached_end(c, p.range)) <= p.pos and hw != p.end_at_assign:
                        # Tansu answers a fetch past the log end with nothing (no EOF, no
                        # OFFSET_OUT_OF_RANGE): the tail latestOffset saw is gone. Only a log end a
                        # fetch of this assignment brought tells: a reused consumer's cached one can be
                        # from a read long before (a stalled broker answering nothing then looked like
                        # a lost tail, and failed the batch); a broker that never answers hits the
                        # stall timeout instead
                        _gone_tail(p.range, hw)
                        p.pos = p.range.end
                if time.monotonic() - max(last_progress, last_probe) > HOLE_PROBE_S:
                    for p in open_.values():
                        p.pos = _check_for_gap(p.range, p.pos, gaps)
                    last_probe = time.monotonic()
                if time.monotonic() - last_progress > STALL_TIMEOUT_S:
                    stuck = [f"{p.range} at offset {p.pos}" for p in open_.values()]
                    raise DataLossError(f"no progress reading {'; '.join(stuck)} for {STALL_TIMEOUT_S}s")
            for partition in list(open_):
                p = open_[partition]
                done = p.pos >= p.range.end
                batch = p.flush(force=done)
                if batch is not None:
                    yield batch
                if done:        # stays assigned: a new assignment would wait for the fetch in flight
                    del open_[partition]
            if reassign and open_:
                assign()
        # only a Spark task's worker keeps it (it will read the next range); anything else closes it
        reusable = _in_spark_task()
    finally:
        if reusable:
            _hand_back(bootstrap, c)
        else:                       # failed or abandoned mid-range: never hand on a consumer in doubt
            c.close()


def _split(msgs: list) -> dict[int, list]:
    """Messages by partition, each partition's in their order."""
    out: dict[int, list] = {}
    for m in msgs:
        out.setdefault(m.partition(), []).append(m)
    return out


def _read_kafka_python(r: KafkaRange, gaps: list[LogGap]) -> Iterator[pa.RecordBatch]:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import OffsetOutOfRangeError
    c = KafkaConsumer(bootstrap_servers=r.bootstrap, enable_auto_commit=False,
                      auto_offset_reset="none", fetch_max_wait_ms=FETCH_WAIT_MS,
                      fetch_max_bytes=104_857_600, max_partition_fetch_bytes=104_857_600)
    tp = TopicPartition(r.topic, r.partition)
    try:
        c.assign([tp]); c.seek(tp, r.start)  # noqa: E702
        pos = r.start
        last_progress = last_probe = time.monotonic()
        while pos < r.end:
            try:
                got = c.poll(timeout_ms=500, max_records=min(r.end - pos, BATCH_ROWS)).get(tp, [])
            except OffsetOutOfRangeError:
                lo = c.beginning_offsets([tp])[tp]
                pos = _lost(r, pos, lo) if pos < lo else r.end
                c.seek(tp, pos)
                continue
            got = [m for m in got if m.offset < r.end]
            if got:
                if got[0].offset > pos:
                    _skip_gap(r, pos, got[0].offset, gaps)
                last_progress, pos = time.monotonic(), got[-1].offset + 1
                yield _batch(r, [m.key for m in got], [m.value for m in got],
                             [m.offset for m in got], [m.timestamp for m in got])
            elif c.position(tp) >= r.end:  # only markers/compacted offsets were left in the range
                pos = r.end
            elif time.monotonic() - max(last_progress, last_probe) > HOLE_PROBE_S:
                pos, last_probe = _check_for_gap(r, pos, gaps), time.monotonic()
            if not got and time.monotonic() - last_progress > STALL_TIMEOUT_S:
                raise DataLossError(f"no progress reading {r} at offset {pos} for {STALL_TIMEOUT_S}s")
    finally:
        c.close()
