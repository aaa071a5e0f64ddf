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
    bool is neither number nor string (JSON true must not pass as 1)."""
    present: np.ndarray  # bool: key present and not null
    num: np.ndarray      # float64, NaN where not a number
    is_num: np.ndarray   # bool
    strs: np.ndarray     # object: str or None

    @classmethod
    def absent(cls, n: int) -> "FieldCol":
        return cls(np.zeros(n, bool), np.full(n, np.nan), np.zeros(n, bool), np.full(n, None, object))

    @classmethod
    def from_objects(cls, values: Sequence[Any]) -> "FieldCol":
        types = [type(v) for v in values]
        is_num = np.fromiter((t is int or t is float for t in types), bool, len(types))
        num = np.array([_finite_or_inf(v) if ok else np.nan for v, ok in zip(values, is_num)], dtype=float) \
            if is_num.any() else np.full(len(types), np.nan)
        strs = np.array([v if t is str else None for v, t in zip(values, types)], dtype=object)
        present = np.fromiter((v is not None for v in values), bool, len(types))
        return cls(present, num, is_num, strs)

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
            col.strs = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=object)
        return col  # null/bool/list/struct: present, but neither number nor string


def _iso_to_ms(strs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """ISO 8601 strings → epoch ms (NaN where unparseable). Vectorized arrow cast first; per value
    only when the batch holds something arrow rejects (no zone → UTC, date only, garbage)."""
    out = np.full(len(strs), np.nan)
    idx = np.flatnonzero(mask)
    if not len(idx):
        return out
    vals = strs[idx]
    try:
        ms = pc.cast(pc.cast(pa.array(vals, pa.string()), pa.timestamp("ms", tz="UTC")), pa.int64())
        out[idx] = ms.to_numpy(zero_copy_only=False).astype(float)
        return out
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    for i, v in zip(idx, vals):
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
def _first_reason(n: int, checks: list[tuple[np.ndarray, str]]) -> np.ndarray:
    """checks = [(bad_mask, reason)] in priority order → object array of reasons (None = ok)."""
    out = np.full(n, None, dtype=object)
    for bad, reason in reversed(checks):  # reversed: the first failing check wins
        out[bad] = reason
    return out


def validate_columns(cols: dict[str, FieldCol], n: int, now_ms: int | None = None
                     ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The validation itself. Returns (reasons object array, normalized columns for valid rows:
    device_id, ts (int64 ms), lat, lon, battery, accuracy_m, farm_id)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    get = lambda f: cols.get(f) or FieldCol.absent(n)  # noqa: E731
    checks: list[tuple[np.ndarray, str]] = []

    dev = get("device_id")
    dev_ok = pc.match_substring_regex(pa.array(dev.strs, pa.string()), DEVICE_ID_RE)
    dev_ok = np.asarray(pc.fill_null(dev_ok, False).to_numpy(zero_copy_only=False), dtype=bool)
    checks += [(~dev.present, "device_id missing"),
               (~dev_ok, "device_id must be a string of 1..64 characters [A-Za-z0-9._:-]")]

    ts = get("ts")
    is_str = np.array([s is not None for s in ts.strs], dtype=bool)
    ts_ms = np.where(ts.is_num, ts.num, _iso_to_ms(ts.strs, is_str))
    with np.errstate(invalid="ignore"):
        checks += [(~ts.present, "ts missing"),
                   (~(ts.is_num | is_str), "ts must be an ISO 8601 string or epoch milliseconds"),
                   (is_str & np.isnan(ts_ms), "ts is not a valid ISO 8601 time"),
                   (~np.isfinite(ts_ms), "ts not finite"),
                   (ts_ms < MIN_TS_MS, "ts before 2000-01-01"),
                   (ts_ms > now_ms + MAX_FUTURE_MS, "ts more than 10 minutes in the future")]

    out: dict[str, np.ndarray] = {}
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
    checks.append((farm.present & np.array([s is None for s in farm.strs], bool),
                   "farm_id must be a string"))

    reasons = _first_reason(n, checks)
    out["device_id"] = dev.strs
    out["ts"] = np.where(np.isfinite(ts_ms), ts_ms, 0).astype(np.int64)
    out["farm_id"] = farm.strs
    return reasons, out


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _good_table(out: dict[str, np.ndarray], keep: np.ndarray) -> pa.Table:
    def num(name: str, nullable: bool) -> pa.Array:
        v = out[name][keep]
        return pa.array(v, pa.float64(), mask=np.isnan(v) if nullable else None)
    return pa.table({
        "device_id": pa.array(out["device_id"][keep], pa.string()),
        "ts": pa.array(out["ts"][keep], pa.int64()),
        "lat": num("lat", False), "lon": num("lon", False),
        "battery": num("battery", True), "accuracy_m": num("accuracy_m", True),
        "farm_id": pa.array(out["farm_id"][keep], pa.string()),
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
    reasons, out = validate_columns(cols, n, now_ms)
    reasons[~is_obj] = "report is not a JSON object"
    keep = np.array([r is None for r in reasons], dtype=bool)
    rejected = [Rejection(int(i), reasons[i]) for i in np.flatnonzero(~keep)]
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
        t = pj.read_json(pa.BufferReader(data), parse_options=_FAST_OPTS)
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
    vals = None                       # Python bytes per value: only when something needs them
    not_obj = np.full(len(reports), None, dtype=object)
    if cols is None:
        vals = reports.to_pylist()
        cols, not_obj = _columns_slow(vals)
    reasons, out = validate_columns(cols, len(reports), now_ms)
    has_obj_reason = np.array([r is not None for r in not_obj], bool)
    reasons[has_obj_reason] = not_obj[has_obj_reason]
    keep = np.array([r is None for r in reasons], dtype=bool)

    good = _good_table(out, keep)
    good = good.append_column("kafka_partition", pa.array(parts[idx][keep], pa.int32()))
    good = good.append_column("kafka_offset", pa.array(offs[idx][keep], pa.int64()))
    dead = [DeadLetter(str(reasons[j]), _raw_text(reports[int(j)].as_py()), topic, int(parts[idx[j]]),
                       int(offs[idx[j]])) for j in np.flatnonzero(~keep)]
    return ParsedBatch(good.cast(GOOD_SCHEMA), dead, [p for p in pings if p is not None])


def _ping_id(value: bytes | None) -> Any:
    try:
        d = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    return d.get("id") if type(d) is dict and d.get("control") == "ping" else None
