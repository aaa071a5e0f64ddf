"""The one report validation, shared by the API (`validate_report_dicts`) and the job
(`parse_kafka_values`).

Why one module: a report the API accepts must never be dead-lettered by the job, and the reason a
gateway sees in `gps.reports.dlq` must read like the one the API returns in its 422/202 body.

Everything is column-at-a-time: the input is first turned into per-field columns (a pyarrow table
from `pyarrow.json` on the fast path, Python lists from orjson/dicts otherwise), then every check is
a numpy/pyarrow expression over the whole column. The first failing check of a row (in field order)
is its reason; None means valid.
"""
from __future__ import annotations

import base64
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

PING_KEY = b"__herdfence_ping__"
FIELDS = ("device_id", "ts", "lat", "lon", "battery", "accuracy_m", "farm_id")
MIN_TS_MS = 946_684_800_000  # 2000-01-01T00:00:00Z
MAX_FUTURE_MS = 10 * 60 * 1000
DEVICE_ID_RE = r"^[A-Za-z0-9._:-]{1,64}$"

# (field, lo, hi, required) for the plain numeric fields, in reason-priority order.
_NUMERIC = (("lat", -90.0, 90.0, True), ("lon", -180.0, 180.0, True),
            ("battery", 0.0, 100.0, False), ("accuracy_m", 0.0, math.inf, False))

GOOD_SCHEMA = pa.schema([
    ("device_id", pa.string()), ("ts", pa.int64()), ("lat", pa.float64()), ("lon", pa.float64()),
    ("battery", pa.float64()), ("accuracy_m", pa.float64()), ("farm_id", pa.string()),
    ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()),
])


# ----------------------------------------------------------------------------- seams
def _finite_or_inf(v: int | float) -> float:
    """A JSON number as float; an integer too large for a float (1 followed by 400 zeros) becomes
    ±inf, which validation rejects as not finite, instead of raising."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


@dataclass(frozen=True)
class Rejection:
    """One report the API refuses: its index in the request and why."""
    index: int
    reason: str

    def to_json(self) -> dict:
        return {"index": self.index, "reason": self.reason}


@dataclass(frozen=True)
class DeadLetter:
    """One Kafka record the job cannot use; `to_json()` is the contract's DLQ value."""
    reason: str
    raw: str
    topic: str
    partition: int
    offset: int

    def to_json(self) -> dict:
        return {"reason": self.reason, "raw": self.raw, "topic": self.topic,
                "partition": self.partition, "offset": self.offset}

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.to_json())


@dataclass
class ReportColumns:
    """The valid reports, normalized (ts = epoch ms), as parallel columns; `index` = position in
    the request."""
    index: np.ndarray
    table: pa.Table  # device_id, ts, lat, lon, battery, accuracy_m, farm_id

    def __len__(self) -> int:
        return self.table.num_rows

    def to_dicts(self, farm_id: str | None = None) -> list[dict]:
        """The Kafka value of each report (what `ReportProducer.send_many` takes); optional fields
        are left out when absent, farm_id is set when given."""
        rows = self.table.to_pylist()
        for r in rows:
            for k in ("battery", "accuracy_m", "farm_id"):
                if r[k] is None:
                    del r[k]
            if farm_id is not None:
                r["farm_id"] = farm_id
        return rows


@dataclass
class ParsedBatch:
    """What the job gets from one batch of Kafka values."""
    good: pa.Table  # GOOD_SCHEMA
    dead: list[DeadLetter] = field(default_factory=list)
    pings: list[Any] = field(default_factory=list)


# ----------------------------------------------------------------------------- columns
@dataclass
class FieldCol:
    """One field over all rows, split by JSON type so that every check is a vector op.
    bool is neither number nor string (JSON true must not pass as 1). Strings stay an Arrow array:
    the job's batches never make a Python object of them."""
    present: np.ndarray  # bool: key present and not null
    num: np.ndarray      # float64, NaN where not a number
    is_num: np.ndarray   # bool
    text: pa.Array       # string: the value where it is a string, else null

    @property
    def is_str(self) -> np.ndarray:
        return np.asarray(self.text.is_valid().to_numpy(zero_copy_only=False), dtype=bool)

    @classmethod
    def absent(cls, n: int) -> "FieldCol":
        return cls(np.zeros(n, bool), np.full(n, np.nan), np.zeros(n, bool), pa.nulls(n, pa.string()))

    @classmethod
    def from_objects(cls, values: Sequence[Any]) -> "FieldCol":
        types = [type(v) for v in values]
        is_num = np.fromiter((t in (int, float) for t in types), bool, len(types))
        num = np.array([_finite_or_inf(v) if ok else np.nan for v, ok in zip(values, is_num)], dtype=float) \
            if is_num.any() else np.full(len(types), np.nan)
        text = pa.array([v if t is str else None for v, t in zip(values, types)], pa.string())
        present = np.fromiter((v is not None for v in values), bool, len(types))
        return cls(present, num, is_num, text)

    @classmethod
    def from_arrow(cls, arr: pa.Array | pa.ChunkedArray) -> "FieldCol":
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        n, t = len(arr), arr.type
        present = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        col = cls.absent(n)
        col.present = present
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            col.num = np.where(present, pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False), np.nan)
            col.is_num = present.copy()
        elif pa.types.is_timestamp(t):  # pyarrow.json inferred an ISO string: same as epoch ms
            ms = pc.cast(pc.cast(arr, pa.timestamp("ms", tz=t.tz)), pa.int64())
            col.num = np.where(present, ms.to_numpy(zero_copy_only=False).astype(float), np.nan)
            col.is_num = present.copy()
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            col.text = arr.cast(pa.string())
        return col  # null/bool/list/struct: present, but neither number nor string


def _iso_to_ms(text: pa.Array, mask: np.ndarray) -> np.ndarray:
    """ISO 8601 strings → epoch ms (NaN where unparseable). Vectorized arrow cast first; per value
    only when the batch holds something arrow rejects (no zone → UTC, date only, garbage)."""
    out = np.full(len(text), np.nan)
    idx = np.flatnonzero(mask)
    if not len(idx):
        return out
    strings = text.take(pa.array(idx))
    try:
        ms = pc.cast(pc.cast(strings, pa.timestamp("ms", tz="UTC")), pa.int64())
        out[idx] = ms.to_numpy(zero_copy_only=False).astype(float)
        return out
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    for i, v in zip(idx, strings.to_pylist()):
        try:
            d = datetime.fromisoformat(v)
        except ValueError:
            if v.strip().isdigit():  # "1700000000000": epoch ms sent as a string
                out[i] = float(v)
            continue
        if d.tzinfo is None:
            d = d.replace(tzinfo=timezone.utc)
        out[i] = d.timestamp() * 1000.0
    return out


# ----------------------------------------------------------------------------- the checks
@dataclass
class Verdicts:
    """Each row's verdict: `ok`, and for the rows that are not, the first failing check's reason."""
    ok: np.ndarray                       # bool
    checks: list[tuple[np.ndarray, str]]  # (bad mask, reason) in priority order

    def reasons(self, rows: np.ndarray) -> list[str]:
        """The reason of each of `rows` (rows that are not ok)."""
        out = np.full(len(rows), None, dtype=object)
        for bad, reason in reversed(self.checks):  # reversed: the first failing check wins
            out[bad[rows]] = reason
        return out.tolist()


def _verdicts(n: int, checks: list[tuple[np.ndarray, str]]) -> Verdicts:
    bad = np.zeros(n, dtype=bool)
    for mask, _ in checks:
        bad |= mask
    return Verdicts(~bad, checks)


def validate_columns(cols: dict[str, FieldCol], n: int, now_ms: int | None = None
                     ) -> tuple[Verdicts, dict[str, np.ndarray | pa.Array]]:
    """The validation itself. Returns (verdicts, normalized columns: device_id and farm_id as Arrow
    strings, ts (int64 ms), lat, lon, battery, accuracy_m as numpy)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    get = lambda f: cols.get(f) or FieldCol.absent(n)  # noqa: E731
    checks: list[tuple[np.ndarray, str]] = []

    dev = get("device_id")
    dev_ok = pc.match_substring_regex(dev.text, DEVICE_ID_RE)
    dev_ok = np.asarray(pc.fill_null(dev_ok, False).to_numpy(zero_copy_only=False), dtype=bool)
    checks += [(~dev.present, "device_id missing"),
               (~dev_ok, "device_id must be a string of 1..64 characters [A-Za-z0-9._:-]")]

    ts = get("ts")
    is_str = ts.is_str
    ts_ms = np.where(ts.is_num, ts.num, _iso_to_ms(ts.text, is_str))
    with np.errstate(invalid="ignore"):
        checks += [(~ts.present, "ts missing"),
                   (~(ts.is_num | is_str), "ts must be an ISO 8601 string or epoch milliseconds"),
                   (is_str & np.isnan(ts_ms), "ts is not a valid ISO 8601 time"),
                   (~np.isfinite(ts_ms), "ts not finite"),
                   (ts_ms < MIN_TS_MS, "ts before 2000-01-01"),
                   (ts_ms > now_ms + MAX_FUTURE_MS, "ts more than 10 minutes in the future")]

    out: dict[str, np.ndarray | pa.Array] = {}
    for name, lo, hi, required in _NUMERIC:
        c = get(name)
        with np.errstate(invalid="ignore"):
            range_bad = c.is_num & np.isfinite(c.num) & ((c.num < lo) | (c.num > hi))
        rng = f"[{_fmt(lo)}, {_fmt(hi)}]" if math.isfinite(hi) else None
        checks += ([(~c.present, f"{name} missing")] if required else []) + [
            (c.present & ~c.is_num, f"{name} must be a number"),
            (c.is_num & ~np.isfinite(c.num), f"{name} not finite"),
            (range_bad, f"{name} out of range {rng}" if rng else f"{name} must be >= {_fmt(lo)}")]
        out[name] = c.num

    farm = get("farm_id")
    checks.append((farm.present & ~farm.is_str, "farm_id must be a string"))

    out["device_id"] = dev.text
    out["ts"] = np.where(np.isfinite(ts_ms), ts_ms, 0).astype(np.int64)
    out["farm_id"] = farm.text
    return _verdicts(n, checks), out


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _good_table(out: dict[str, np.ndarray], keep: np.ndarray) -> pa.Table:
    def num(name: str, nullable: bool) -> pa.Array:
        v = out[name][keep]
        return pa.array(v, pa.float64(), mask=np.isnan(v) if nullable else None)
    every = bool(keep.all())
    text = lambda name: out[name] if every else out[name].filter(pa.array(keep))  # noqa: E731
    return pa.table({
        "device_id": text("device_id"),
        "ts": pa.array(out["ts"][keep], pa.int64()),
        "lat": num("lat", False), "lon": num("lon", False),
        "battery": num("battery", True), "accuracy_m": num("accuracy_m", True),
        "farm_id": text("farm_id"),
    })


# ----------------------------------------------------------------------------- the API side
def validate_report_dicts(reports: list, now_ms: int | None = None
                          ) -> tuple[ReportColumns, list[Rejection]]:
    """For `POST /v1/reports`: any list element may be anything; non-dicts are rejected, never
    raised on."""
    n = len(reports)
    is_obj = np.fromiter((type(r) is dict for r in reports), bool, n)
    cols = {f: FieldCol.from_objects([r.get(f) if ok else None for r, ok in zip(reports, is_obj)])
            for f in FIELDS}
    verdicts, out = validate_columns(cols, n, now_ms)
    keep = verdicts.ok & is_obj
    bad = np.flatnonzero(~keep)
    reasons = verdicts.reasons(bad)
    rejected = [Rejection(int(i), "report is not a JSON object" if not is_obj[i] else reason)
                for i, reason in zip(bad.tolist(), reasons)]
    return ReportColumns(np.flatnonzero(keep), _good_table(out, keep)), rejected


# ----------------------------------------------------------------------------- the job side
def _raw_text(b: bytes | None) -> str:
    if b is None:
        return ""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(b).decode("ascii")


_FAST_SCHEMA = pa.schema([("device_id", pa.string()), ("lat", pa.float64()), ("lon", pa.float64()),
                          ("battery", pa.float64()), ("accuracy_m", pa.float64()),
                          ("farm_id", pa.string())])
_FAST_OPTS = pj.ParseOptions(explicit_schema=_FAST_SCHEMA, unexpected_field_behavior="infer")
# One thread, large blocks: a reader task has its core, and Arrow's thread pool (one thread per core,
# shared by the tasks of this machine) made a 150k-report parse wait: 0.71 s against 0.18 s, for the
# same CPU (measured 2026-11-27 on this 2-core machine, beside a running benchmark)
_FAST_READ = pj.ReadOptions(use_threads=False, block_size=16 << 20)


def _columns_fast(values: pa.Array) -> dict[str, FieldCol] | None:
    """pyarrow.json over the values (binary, no nulls) as newline-terminated lines, in one C++ pass
    and no Python object per value. Returns None whenever the batch is not uniformly well-typed
    objects, one per line (then the caller parses value by value to find out which ones are bad)."""
    if values.null_count:
        return None
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32, count=len(values) + 1, offset=values.offset * 4)
    data = values.buffers()[2]
    body = np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]] if data is not None else np.empty(0, np.uint8)
    if (body == 10).any() or (body == 13).any():      # a line break inside a value: one line per value no more
        return None
    lines = pc.binary_join_element_wise(values, pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary()))
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32, count=len(lines) + 1, offset=lines.offset * 4)
    data = lines.buffers()[2][offsets[0]:offsets[-1]]
    try:
        t = pj.read_json(pa.BufferReader(data), read_options=_FAST_READ, parse_options=_FAST_OPTS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if t.num_rows != len(values):  # blank values are skipped by the reader: rows would shift
        return None
    return {f: FieldCol.from_arrow(t.column(f)) for f in FIELDS if f in t.column_names}


def _columns_slow(values: list[bytes]) -> tuple[dict[str, FieldCol], np.ndarray]:
    """orjson value by value: (columns, per-row reason for values that are not JSON objects)."""
    docs: list[Any] = []
    bad = np.full(len(values), None, dtype=object)
    for i, v in enumerate(values):
        try:
            d = orjson.loads(v)
        except orjson.JSONDecodeError as e:
            bad[i] = f"malformed JSON: {e}"
            d = None
        if d is not None and type(d) is not dict:
            bad[i], d = "report is not a JSON object", None
        elif d is None and bad[i] is None:
            bad[i] = "report is not a JSON object"
        docs.append(d or {})
    return {f: FieldCol.from_objects([d.get(f) for d in docs]) for f in FIELDS}, bad


def parse_kafka_values(values: pa.Array, keys: pa.Array, partitions: pa.Array, offsets: pa.Array,
                       topic: str, now_ms: int | None = None) -> ParsedBatch:
    """For the job: Kafka values (binary) → ParsedBatch(good GOOD_SCHEMA table, dead letters,
    ping ids). Control records (key == PING_KEY) are pings, never reports nor dead letters."""
    values = values.cast(pa.binary()) if values.type != pa.binary() else values
    parts = np.asarray(partitions.to_numpy(zero_copy_only=False), dtype=np.int32)
    offs = np.asarray(offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    is_ping = np.zeros(len(values), dtype=bool)
    if keys is not None and len(keys):
        is_ping = pc.fill_null(pc.equal(keys.cast(pa.binary()), pa.scalar(PING_KEY, pa.binary())), False) \
            .to_numpy(zero_copy_only=False)
    pings = [_ping_id(values[int(i)].as_py()) for i in np.flatnonzero(is_ping)]
    idx = np.flatnonzero(~is_ping)
    reports = values.take(pa.array(idx)) if len(pings) else values
    reports = pc.fill_null(reports, pa.scalar(b"", pa.binary())) if reports.null_count else reports

    cols = _columns_fast(reports) if len(reports) else None
    not_obj = None                    # per value, why it is not a JSON object (slow path only)
    if cols is None:
        cols, not_obj = _columns_slow(reports.to_pylist())
    verdicts, out = validate_columns(cols, len(reports), now_ms)
    keep = verdicts.ok
    if not_obj is not None:
        keep = keep & np.array([r is None for r in not_obj], bool)

    good = _good_table(out, keep)
    good = good.append_column("kafka_partition", pa.array(parts[idx][keep], pa.int32()))
    good = good.append_column("kafka_offset", pa.array(offs[idx][keep], pa.int64()))
    bad = np.flatnonzero(~keep)
    reasons = verdicts.reasons(bad)
    dead = [DeadLetter(str(not_obj[j] if not_obj is not None and not_obj[j] is not None else reason),
                       _raw_text(reports[int(j)].as_py()), topic, int(parts[idx[j]]), int(offs[idx[j]]))
            for j, reason in zip(bad.tolist(), reasons)]
    return ParsedBatch(good.cast(GOOD_SCHEMA), dead, [p for p in pings if p is not None])


def _ping_id(value: bytes | None) -> Any:
    try:
        d = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    return d.get("id") if type(d) is dict and d.get("control") == "ping" else None
