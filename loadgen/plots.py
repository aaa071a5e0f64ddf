"""PNG plots of benchmark runs (matplotlib, Agg backend: no display needed). matplotlib comes with the
`bench` extra; without it a run writes its JSON and skips the plot."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from loadgen.bench_load import handled


def _plt():
    """matplotlib.pyplot, or None (said on stderr) when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install 'herdfence[bench]'): no plot", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def push_plot(path: str | Path, beats: list, t0: float, base: int, latencies_ms: np.ndarray,
              produced: tuple[np.ndarray, np.ndarray] | None, title: str) -> None:
    """Left: points/s per heartbeat interval (and the producer's rate); right: event latency CDF."""
    plt = _plt()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    if len(beats) >= 1:
        t = np.r_[0.0, np.array([b.time for b in beats]) - t0]
        pts = np.r_[0.0, np.array([handled(b) for b in beats], dtype=float) - base]
        rate = np.diff(pts) / np.maximum(np.diff(t), 1e-3)
        ax1.step(t[1:], rate / 1e3, where="pre", label="processed by the job (heartbeats)")
        ax1b = ax1.twinx()
        ax1b.plot(t, pts / 1e3, color="grey", lw=1, ls="--", label="cumulative (k points)")
        ax1b.set_ylabel("cumulative processed (k points)")
    if produced is not None and len(produced[0]) > 1:
        pt, pn = produced
        ax1.plot(pt[1:] - t0, np.diff(pn) / np.maximum(np.diff(pt), 1e-3) / 1e3, color="tab:orange",
                 lw=0.8, alpha=0.7, label="produced to Kafka")
    ax1.set_xlabel("seconds since first report produced")
    ax1.set_ylabel("k points/s")
    ax1.set_title("throughput over time")
    ax1.legend(loc="upper left", fontsize=8)
    if len(latencies_ms):
        x = np.sort(latencies_ms) / 1000.0
        ax2.plot(x, np.arange(1, len(x) + 1) / len(x))
        for q in (50, 99):
            v = np.percentile(latencies_ms, q) / 1000.0
            ax2.axvline(v, color="grey", ls=":", lw=1)
            ax2.text(v, 0.02 + (0.1 if q == 99 else 0), f" p{q} {v:.2f} s", fontsize=8)
    _finish(plt, fig, ax2, "event latency: report produced → event visible (s)", "fraction of events",
            "event latency CDF", title, path)


def pull_plot(path: str | Path, runs: dict[str, tuple[float, dict[float, float]]], title: str) -> None:
    """runs: label → (queries/s, {percentile: ms}). Left: queries/s per run; right: their latency CDFs."""
    plt = _plt()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels = list(runs)
    ax1.bar(labels, [runs[k][0] for k in labels], color=["tab:blue", "tab:orange", "tab:green"][:len(labels)])
    for i, label in enumerate(labels):
        ax1.annotate(f"{runs[label][0]:,.0f}", (i, runs[label][0]), ha="center", va="bottom")
    ax1.set_ylabel("queries/s")
    ax1.set_title("throughput")
    for label in labels:
        percentiles = runs[label][1]
        qs = sorted(percentiles)
        if qs:
            ax2.plot([percentiles[q] for q in qs], [q / 100 for q in qs], marker=".", label=label)
    ax2.set_xscale("log")
    ax2.legend()
    _finish(plt, fig, ax2, "latency (ms)", "fraction of queries", "latency CDF", title, path)


def _finish(plt, fig, cdf_ax, xlabel: str, ylabel: str, cdf_title: str, title: str, path: str | Path) -> None:
    """The latency-CDF panel's labels, then title, layout and the PNG: the same for every plot."""
    cdf_ax.set_xlabel(xlabel)
    cdf_ax.set_ylabel(ylabel)
    cdf_ax.set_title(cdf_title)
    cdf_ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def failover_plot(path: str | Path, samples: list[tuple[float, float]], marks: list[tuple[float, str]],
                  result: dict) -> None:
    """Freshness lag over the run, with the faults marked (kill -9, SIGSTOP past the lease)."""
    plt = _plt()
    if plt is None:
        return
    if not samples:
        return
    t0 = samples[0][0]
    t = np.array([s[0] for s in samples]) - t0
    lag = np.array([s[1] for s in samples])
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(t, lag, lw=1, label="freshness lag (now − newest processed report)")
    steady = (result.get("steady_lag_ms") or {}).get("max")
    if steady:
        ax.axhline(steady / 1000, color="grey", ls=":", lw=1, label=f"steady maximum ({steady} ms)")
    top = max(float(lag.max()), 1.0) * 1.25
    ax.set_ylim(0, top)
    for i, (at, mode) in enumerate(marks):
        r = result.get(mode, {})
        parts = [f"fresh {r['fresh_ms'] / 1000:.1f} s" if r.get("fresh_ms") is not None else "",
                 f"settled {r['outage_ms'] / 1000:.1f} s" if r.get("outage_ms") is not None else "not settled",
                 f"worst {r['worst_lag_ms'] / 1000:.1f} s" if r.get("worst_lag_ms") is not None else ""]
        ax.axvline(at - t0, color="red", ls="--", lw=1)
        ax.text(at - t0, top * (0.93 - 0.09 * i), f" {'kill -9' if mode == 'kill' else 'SIGSTOP'}: "
                + ", ".join(p for p in parts if p), color="red", fontsize=9)
    ax.set_xlabel("seconds")
    ax.set_ylabel("lag (s)")
    ax.set_title(f"herdfence failover: {result['rate']:.0f} reports/s, {result['devices']:,} devices, "
                 f"lease {result['lease_ms']} ms — lost {result.get('lost')}, duplicated {result.get('duplicated')}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def produce_curve(sent_at_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if sent_at_ms is None or not len(sent_at_ms):
        return np.empty(0), np.empty(0)
    s = sent_at_ms / 1000.0
    grid = np.arange(s[0], s[-1] + 0.5, 0.5)
    return grid, np.searchsorted(s, grid, side="right").astype(float)
