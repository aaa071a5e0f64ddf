"""Reference oracle: the enter/exit events a correct herdfence must produce for a set of reports.

Written independently of the job and on purpose naive: membership is GEOS ``covers`` on the exact
fence geometry (boundary counts as inside; no H3 shortcuts), and the debounce is a plain loop over each
device's reports, fence by fence. Slow but obviously right; benchmarks reconcile the job against it.

Semantics, per (device, fence): confirmed state starts outside. A device's reports are taken in the
order of the rows (= arrival order; for a ts-sorted frame that is ts order); a report whose ts is
strictly less than the device's last processed ts is ignored. Then, per fence of the device's farm:
inside == confirmed resets the pending streak; otherwise the streak grows (n += 1, t0 = ts of its first
report) and once n >= debounce_reports or ts - t0 >= debounce_seconds * 1000 the state flips, an
event ("enter"/"exit") is emitted with this report's ts, and the streak resets.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd
import shapely

from loadgen.herd import Fence

DEFAULT_DEBOUNCE_REPORTS = 2
DEFAULT_DEBOUNCE_SECONDS = 30.0
EVENT_KEY = ["device_id", "fence_id", "type", "ts"]
EVENT_TYPES = ("enter", "exit")


def _valid_rows(df: pd.DataFrame) -> np.ndarray:
    """Reports the job would reject (and send to the DLQ) never touch device state."""
    lat, lon = df["lat"].to_numpy(float), df["lon"].to_numpy(float)
    return np.isfinite(lat) & np.isfinite(lon) & (np.abs(lat) <= 90) & (np.abs(lon) <= 180) & df["ts"].notna().to_numpy()


def _fences_by_device(devices: Iterable[str], fences: list[Fence],
                      device_farm: Mapping[str, str] | None) -> dict[str, list[int]]:
    """Indices of the fences that apply to each device: all of them, or those of the device's farm."""
    if device_farm is None:
        every = list(range(len(fences)))
        return {d: every for d in devices}
    by_farm: dict[str, list[int]] = defaultdict(list)
    for j, f in enumerate(fences):
        by_farm[f.farm_id].append(j)
    return {d: by_farm.get(device_farm.get(d, ""), []) for d in devices}


def expected_events(reports_df: pd.DataFrame, fences: list[Fence],
                    device_farm: Mapping[str, str] | None = None,
                    debounce_reports: int = DEFAULT_DEBOUNCE_REPORTS,
                    debounce_seconds: float = DEFAULT_DEBOUNCE_SECONDS) -> pd.DataFrame:
    """Expected events as a DataFrame[device_id, fence_id, type, ts], ordered by ts (stable)."""
    df = reports_df.loc[_valid_rows(reports_df), ["device_id", "ts", "lat", "lon"]]
    dev = df["device_id"].astype(str).to_numpy(dtype=object)
    ts = df["ts"].to_numpy(np.int64)
    fence_idx = _fences_by_device(pd.unique(dev), fences, device_farm)
    rules = [(f.debounce_reports if f.debounce_reports is not None else debounce_reports,
              1000.0 * (f.debounce_seconds if f.debounce_seconds is not None else debounce_seconds))
             for f in fences]

    # devices that see the same fences (one farm) share one membership matrix (their rows x its
    # fences), computed with vectorized covers; all other (row, fence) pairs are never needed
    points = shapely.points(df["lon"].to_numpy(float), df["lat"].to_numpy(float))
    group_ids: dict[tuple[int, ...], int] = {}
    device_group = {d: group_ids.setdefault(tuple(idx), len(group_ids)) for d, idx in fence_idx.items()}
    row_group = pd.Series(dev).map(device_group).to_numpy(np.int64)
    order = np.argsort(row_group, kind="stable")                 # stable: arrival order is kept
    bounds = np.searchsorted(row_group[order], np.arange(len(group_ids) + 1))
    out: list[tuple[str, str, str, int]] = []
    for idx, g in group_ids.items():
        rows = order[bounds[g]:bounds[g + 1]]
        if not idx or not len(rows):
            continue
        inside = np.zeros((len(rows), len(idx)), dtype=bool)
        for k, j in enumerate(idx):
            shapely.prepare(fences[j].geometry)
            inside[:, k] = shapely.covers(fences[j].geometry, points[rows])
        # positions of each device's rows within this group, ascending = arrival order
        local_rows = pd.Series(dev[rows]).groupby(dev[rows], sort=False).indices
        for d, rs in local_rows.items():
            out.extend(_device_events(d, ts[rows[rs]], inside[rs], [fences[j] for j in idx],
                                      [rules[j] for j in idx]))
    events = pd.DataFrame(out, columns=EVENT_KEY)
    events["ts"] = events["ts"].astype(np.int64)
    return events.sort_values("ts", kind="stable").reset_index(drop=True)


def _device_events(device: str, ts: np.ndarray, inside: np.ndarray, fences: list[Fence],
                   rules: list[tuple[int, float]]) -> list[tuple[str, str, str, int]]:
    """The debounce state machine over one device's reports (rows of ``inside``, in arrival order)."""
    confirmed = [False] * len(fences)
    streak_n = [0] * len(fences)
    streak_t0 = [0] * len(fences)
    last_ts: int | None = None
    out = []
    for t, row in zip(ts.tolist(), inside.tolist()):
        if last_ts is not None and t < last_ts:
            continue                                       # too old: never re-ordered into the past
        last_ts = t
        for k, now_in in enumerate(row):
            if now_in == confirmed[k]:
                streak_n[k] = 0
                continue
            if streak_n[k] == 0:
                streak_t0[k] = t
            streak_n[k] += 1
            need_n, need_ms = rules[k]
            if streak_n[k] >= need_n or t - streak_t0[k] >= need_ms:
                confirmed[k] = now_in
                streak_n[k] = 0
                out.append((device, fences[k].fence_id, "enter" if now_in else "exit", t))
    return out


def to_epoch_ms(values: pd.Series) -> pd.Series:
    """Event ts as epoch ms, whether given as numbers or as ISO 8601 strings (the API's form)."""
    numbers = pd.to_numeric(values, errors="coerce")
    text = numbers.isna() & values.notna()
    if text.any():
        parsed = pd.to_datetime(values[text].astype(str), utc=True, format="ISO8601")
        numbers[text] = (parsed - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)
    return numbers.astype(np.int64)


def _keys(df: pd.DataFrame) -> pd.DataFrame:
    keys = df.loc[df["type"].isin(EVENT_TYPES), EVENT_KEY].copy()
    keys["device_id"] = keys["device_id"].astype(str)
    keys["fence_id"] = keys["fence_id"].astype(str)
    keys["type"] = keys["type"].astype(str)
    keys["ts"] = to_epoch_ms(keys["ts"]).astype(np.int64)
    return keys


def reconcile(expected_df: pd.DataFrame, observed_df: pd.DataFrame) -> dict[str, int]:
    """Compare observed events with expected ones by key (device_id, fence_id, type, ts).

    Only enter/exit are compared (dwell and silent have no oracle here). Returns
    events = distinct expected keys, observed = observed enter/exit rows, lost = expected keys never
    observed, duplicated = observed rows beyond the first per key, unexpected = distinct observed keys
    that were not expected."""
    exp = _keys(expected_df).drop_duplicates()
    obs = _keys(observed_df)
    counts = obs.groupby(EVENT_KEY, sort=False).size().rename("n").reset_index()
    merged = exp.merge(counts, on=EVENT_KEY, how="outer", indicator=True)
    return {
        "events": len(exp),
        "observed": len(obs),
        "lost": int((merged["_merge"] == "left_only").sum()),
        "duplicated": int((counts["n"] - 1).sum()),
        "unexpected": int((merged["_merge"] == "right_only").sum()),
    }
