"""Post simulated reports through the API (``POST /v1/reports``) in batches, with httpx.

Reports of one device must arrive in order: the job ignores a report older than the device's last
one, so a batch overtaking an earlier batch of the same device would change the events. Devices are
therefore split across workers by a stable hash and each worker posts its batches one after another."""
from __future__ import annotations

import time
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import numpy as np
import pandas as pd

from loadgen.progress import bar as progress_bar
from loadgen.records import Pacer, WriteStats, report_dicts

RETRY_STATUS = {429, 500, 502, 503, 504}


@dataclass(frozen=True)
class Batch:
    rows: np.ndarray       # row positions in the frame, in order
    token: str             # farm key, or the token of the batch's single device


def _batches(df: pd.DataFrame, batch_size: int, workers: int, key: str | None,
             tokens: Mapping[str, str] | None) -> list[list[Batch]]:
    """Per worker, its batches in send order. With device tokens a batch holds one device only
    (a token may post only for its own device)."""
    dev = df["device_id"].astype(str).to_numpy(dtype=object)
    shard_of = {d: zlib.crc32(d.encode()) % workers for d in pd.unique(dev)}   # stable across runs
    row_shard = pd.Series(dev).map(shard_of).to_numpy()
    plan: list[list[Batch]] = []
    for w in range(workers):
        rows = np.flatnonzero(row_shard == w)
        if tokens is None:
            plan.append([Batch(rows[i:i + batch_size], key or "") for i in range(0, len(rows), batch_size)])
            continue
        batches = []
        for d, dev_rows in pd.Series(rows).groupby(dev[rows], sort=False):
            r = dev_rows.to_numpy()
            batches += [Batch(r[i:i + batch_size], tokens[d]) for i in range(0, len(r), batch_size)]
        plan.append(batches)
    return plan


def write_reports(base_url: str, df: pd.DataFrame, key: str | None = None,
                  tokens: Mapping[str, str] | None = None, rate: float | None = None,
                  batch_size: int = 500, workers: int = 4, retries: int = 5, timeout_s: float = 30.0,
                  progress: bool = True) -> WriteStats:
    """POST every row to ``{base_url}/v1/reports``, authenticated by a farm ``key`` or per-device
    ``tokens`` ({device_id: token}); 429/5xx and transport errors are retried with backoff."""
    if (key is None) == (tokens is None):
        raise ValueError("give exactly one of key= (farm key) or tokens= (device tokens)")
    records = list(report_dicts(df))
    stats = WriteStats(rows=len(df), sent_at_ms=np.zeros(len(df), dtype=np.int64))
    plan = _batches(df, batch_size, max(1, workers), key, tokens)
    pacer = Pacer(rate)
    bar = progress_bar(total=len(df), unit="rep", disable=not progress, desc="http /v1/reports")

    def post(client: httpx.Client, batch: Batch) -> None:
        body = {"reports": [records[i] for i in batch.rows]}
        headers = {"Authorization": f"Bearer {batch.token}"}
        for attempt in range(retries + 1):
            stats.sent_at_ms[batch.rows] = time.time_ns() // 1_000_000
            try:
                resp = client.post("/v1/reports", json=body, headers=headers)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                wait = 0.2 * 2 ** attempt
            else:
                if resp.status_code == 202:
                    rejected = len(resp.json().get("rejected", []))
                    stats.add(sent=len(batch.rows) - rejected, rejected=rejected)
                    return
                problem = f"HTTP {resp.status_code}: {resp.text[:200]}"
                if resp.status_code not in RETRY_STATUS:
                    break
                wait = float(resp.headers.get("Retry-After") or 0.2 * 2 ** attempt)
            if attempt < retries:
                time.sleep(min(wait, 10.0))
        stats.add(failed=len(batch.rows), error=problem)

    def worker(batches: list[Batch]) -> None:
        with httpx.Client(base_url=base_url, timeout=timeout_s) as client:
            for batch in batches:
                pacer.admit(len(batch.rows))
                post(client, batch)
                bar.update(len(batch.rows))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(plan)) as pool:
        for fut in [pool.submit(worker, batches) for batches in plan]:
            fut.result()
    stats.seconds = time.perf_counter() - t0
    bar.close()
    return stats
