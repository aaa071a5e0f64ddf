"""The benchmarks' oracle: loadgen.reference (the event semantics report by report, naive on purpose)
applied to a whole simulated run, one farm at a time, in one process or one per core."""
from __future__ import annotations

import shapely

from loadgen.reference import RefFence, RefReport, Reference

PARALLEL_ROWS = 200_000      # runs this large are judged by one process per core (farms are independent)
_RUN: dict = {}              # the run being judged, shared with forked workers (copy on write)


def expected_events(reports_df, fences, device_farm, workers: int | None = None) -> "pd.DataFrame":
    """The benchmarks' oracle: every event the job must emit for a simulation's reports (rows in
    arrival order; `fences`: loadgen.herd.Fence; `device_farm`: device → farm), as a DataFrame
    [device_id, fence_id, type, ts, inferred, late]. A device sees only its farm's fences, so the run
    is judged one farm at a time (issue 23): membership with vectorized `covers` over the farm's rows
    (the same answer the per-report call gives), then its reports fed one by one, as one batch (late
    fixes are replayed where they arrived, before the device's next report that is not late, so the
    job's batches need not be known). Only one farm's devices and membership are held at a time: the
    oracle's memory does not grow with the number of devices or points of the run. `workers`: processes (forked) sharing the
    farms; None = one per core for runs of PARALLEL_ROWS reports or more (the benchmarks run it once
    their stack is down), else this process alone."""
    import os

    import numpy as np
    import pandas as pd

    from loadgen.truth import _valid_rows

    valid = np.flatnonzero(_valid_rows(reports_df))
    dev_all = reports_df["device_id"].to_numpy()
    farm_of_row = pd.Series(dev_all[valid]).map(device_farm).fillna("").to_numpy(dtype=object)
    by_farm: dict[str, list[RefFence]] = {}
    for f in fences:
        by_farm.setdefault(f.farm_id, []).append(
            RefFence(f"{f.farm_id}/{f.fence_id}", f.geometry,
                     f.debounce_reports if f.debounce_reports is not None else 2,
                     f.debounce_seconds if f.debounce_seconds is not None else 30.0))
    groups = [(farm, rows.to_numpy()) for farm, rows in pd.Series(valid).groupby(farm_of_row, sort=False)
              if by_farm.get(farm)]            # a farm without fences: no event for its devices
    _RUN.update(by_farm=by_farm, dev=dev_all, lon=reports_df["lon"].to_numpy(float),
                lat=reports_df["lat"].to_numpy(float), ts=reports_df["ts"].to_numpy(np.int64),
                acc=reports_df["accuracy_m"].to_numpy(float) if "accuracy_m" in reports_df else None)
    if workers is None:
        workers = (os.cpu_count() or 1) if len(valid) >= PARALLEL_ROWS else 1
    try:
        if workers > 1 and len(groups) > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            shares = [groups[i::workers * 8] for i in range(workers * 8)]
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                out = [e for part in pool.map(_farms_events, shares) for e in part]
        else:
            out = _farms_events(groups)
    finally:
        _RUN.clear()
    return pd.DataFrame(out, columns=["device_id", "fence_id", "type", "ts", "inferred", "late"])


def _farms_events(groups: list) -> list[tuple]:
    import numpy as np

    run = _RUN
    out: list[tuple] = []
    for farm, rows in groups:
        ref = Reference(run["by_farm"][farm])
        mine = ref.fences_of_farm(farm)
        points = shapely.points(run["lon"][rows], run["lat"][rows])
        inside = np.empty((len(rows), len(mine)), dtype=bool)
        for k, f in enumerate(mine):
            shapely.prepare(f.geometry)
            inside[:, k] = shapely.covers(f.geometry, points)
        del points
        uids = [f.uid for f in mine]
        late: dict[str, list[RefReport]] = {}
        dev, ts = run["dev"][rows].tolist(), run["ts"][rows].tolist()
        lat, lon = run["lat"][rows].tolist(), run["lon"][rows].tolist()
        accuracy = run["acc"][rows].tolist() if run["acc"] is not None else [float("nan")] * len(rows)
        for i, row_inside in enumerate(inside.tolist()):
            report = RefReport(f"{farm}/{dev[i]}", ts[i], lat[i], lon[i],
                               None if accuracy[i] != accuracy[i] else accuracy[i])
            ref.feed_arriving(report, late, dict(zip(uids, row_inside)))
        for device, fixes in late.items():
            ref._replay(device, fixes)
        out += [(e.device_id, e.fence_id, e.type, e.ts, e.inferred, e.late) for e in ref.events]
    return out
