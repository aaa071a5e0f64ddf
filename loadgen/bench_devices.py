"""`herdfence bench devices`: does a point cost the same with a million collars as with ten thousand?

For each fence count F and device count D (e.g. F = 10,000; D = 10k, 100k, 1M) it runs the push
benchmark (loadgen.bench.push: a fresh private stack, the real job, the oracle) with the same number of
points per device (default 3: collars reporting every 5–15 minutes, so a run touches every device a
few times), and records per run: points/s and µs per point, lost/duplicated, the resident memory
peaks of the job's driver (its Python process and its JVM), its Python workers, the Redis masters
and the bench itself (loadgen.bench_memory), and Redis bytes per device. It writes one JSON (the runs
and, per fence count, the cost ratio of the largest device count to the smallest) and a plot.

The bars (issue 23): the ratio ≤ 1.5, the driver under 2 GB, 0 lost / 0 duplicated at 1M devices.
"""
from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

from loadgen.bench_stack import PRIVATE_PORTS, machine, say

RATIO_BAR = 1.5
DRIVER_BAR_MB = 2048


def shifted_ports(offset: int) -> dict[str, str]:
    """The private stack's ports moved by `offset` (beside another bench's private stack)."""
    return {k: str(int(v) + offset) for k, v in PRIVATE_PORTS.items()}


def run_one(fences: int, devices: int, points_per_device: int, out_dir: Path, seed: int = 0,
            ports: dict[str, str] | None = None, tracks: str = "dense") -> dict:
    from loadgen.bench import push
    path = out_dir / f"bench-devices-{fences}f-{devices}d.json"
    say(f"=== {fences:,} fences, {devices:,} devices, {points_per_device * devices:,} points ===")
    r = push(fences, points_per_device * devices, devices, str(path), seed=seed, plot=False, ports=ports,
             tracks=tracks, command=f"(herdfence bench devices) push --fences {fences} --devices {devices} "
                                   f"--points {points_per_device * devices}")
    mem = r.get("memory") or {}
    peak = mem.get("peak_mb") or {}
    redis = mem.get("redis") or {}
    run_b, event_b = redis.get("run_bytes_per_device"), redis.get("event_bytes")
    per_event = (r.get("observed_events") or 0) / devices
    # the measured devices' live state alone: the run's growth less its events (their own keys)
    state_b = round(run_b - per_event * event_b, 1) if run_b is not None and event_b is not None else None
    return {"fences": fences, "devices": devices, "points": r["points"], "points_per_s": r["points_per_s"],
            "us_per_point": round(1e6 / r["points_per_s"], 2) if r["points_per_s"] else None,
            "completed": r["completed"], "events": r["events"], "lost": r["lost"], "duplicated": r["duplicated"],
            "unexpected": r.get("unexpected_events"),
            "driver_mb": peak.get("driver"), "jvm_mb": peak.get("jvm"), "worker_max_mb": peak.get("worker_max"),
            "workers_sum_mb": peak.get("workers_sum"), "redis_masters_mb": peak.get("redis_masters"),
            "bench_mb": mem.get("bench_peak_mb"),
            "redis_run_bytes_per_device": run_b, "redis_event_bytes": event_b,
            "events_per_device": round(per_event, 2), "redis_state_bytes_per_device": state_b,
            "redis_total_bytes_per_device": redis.get("total_bytes_per_device"),
            "redis_family_bytes_per_device": redis.get("family_bytes_per_device"),
            "batches": r.get("batches"), "batch_seconds": r.get("batch_seconds"),
            "setup_seconds": r.get("setup_seconds"), "json": path.name}


def ratios(runs: list[dict]) -> dict[str, float | None]:
    """Per fence count: µs/point at the most devices over µs/point at the fewest."""
    out: dict[str, float | None] = {}
    for fences in sorted({r["fences"] for r in runs}):
        mine = sorted((r for r in runs if r["fences"] == fences and r["us_per_point"]), key=lambda r: r["devices"])
        out[str(fences)] = round(mine[-1]["us_per_point"] / mine[0]["us_per_point"], 3) if len(mine) > 1 else None
    return out


def plot(path: Path, runs: list[dict], title: str) -> None:
    from loadgen.plots import _plt
    plt = _plt()
    if plt is None:
        return
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.4))
    for fences in sorted({r["fences"] for r in runs}):
        mine = sorted((r for r in runs if r["fences"] == fences), key=lambda r: r["devices"])
        x = [r["devices"] for r in mine]
        done = [r for r in mine if r["us_per_point"]]        # an incomplete run has no cost per point
        ax1.plot([r["devices"] for r in done], [r["us_per_point"] for r in done], marker="o", label=f"{fences:,} fences")
        for r in done:
            ax1.annotate(f"{r['points_per_s'] / 1e3:,.0f}k/s", (r["devices"], r["us_per_point"]), fontsize=7,
                         textcoords="offset points", xytext=(3, 4))
        ax3.plot(x, [r["redis_state_bytes_per_device"] for r in mine], marker="o", label=f"{fences:,} fences: live state")
        ax3.plot(x, [r["redis_run_bytes_per_device"] for r in mine], marker="s", ls=":",
                 label=f"{fences:,} fences: live state + its events")
        ax3.plot(x, [r["redis_total_bytes_per_device"] for r in mine], marker="x", ls="--",
                 label=f"{fences:,} fences: all, fences incl.")
    biggest = max(runs, key=lambda r: (r["fences"], 0))["fences"]
    mine = sorted((r for r in runs if r["fences"] == biggest), key=lambda r: r["devices"])
    x = [r["devices"] for r in mine]
    for key, label in (("driver_mb", "job driver (Python)"), ("jvm_mb", "job JVM (driver + local executor)"),
                       ("worker_max_mb", "largest Python worker"), ("redis_masters_mb", "Redis masters (sum)"),
                       ("bench_mb", "bench process")):
        ax2.plot(x, [r[key] for r in mine], marker="o", label=label)
    ax2.axhline(DRIVER_BAR_MB, color="grey", ls=":", lw=1)
    for ax, ylabel, sub in ((ax1, "µs per point (end to end)", "per-point cost"),
                            (ax2, f"peak RSS (MB), {biggest:,} fences", "memory"),
                            (ax3, "Redis bytes per device", "Redis")):
        ax.set_xscale("log")
        ax.set_xlabel("devices")
        ax.set_ylabel(ylabel)
        ax.set_title(sub)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="herdfence bench devices", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", default="10000,100000,1000000", help="comma-separated device counts")
    p.add_argument("--fences", default="10000", help="comma-separated fence counts")
    p.add_argument("--points-per-device", type=int, default=3)
    p.add_argument("--json", required=True, metavar="FILE", help="the summary (runs' own JSON beside it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tracks", choices=("dense", "sparse"), default="dense")
    p.add_argument("--ports-offset", type=int, default=0, help="move the private stack's ports by N")
    a = p.parse_args(argv)
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    ports = shifted_ports(a.ports_offset) if a.ports_offset else None
    runs = []
    for fences in [int(x) for x in a.fences.split(",")]:
        for devices in [int(x) for x in a.devices.split(",")]:
            runs.append(run_one(fences, devices, a.points_per_device, out.parent, a.seed, ports, a.tracks))
            _write(out, runs, a, argv)          # after every run: a long sweep keeps what it measured
    summary = _write(out, runs, a, argv)
    plot(out.with_suffix(".png"), runs,
         f"herdfence: cost per point and memory vs devices ({a.points_per_device} points per device; "
         f"ratio largest/smallest {summary['cost_ratio']}; {machine()['cores']} cores)")
    out.with_suffix(".md").write_text(markdown(summary, out.with_suffix(".png").name))
    print(json.dumps({k: v for k, v in summary.items() if k != "machine"}, indent=1))
    return 0


def _f(v, digits: int = 0) -> str:
    if v is None:
        return "—"
    return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def markdown(summary: dict, png: str) -> str:
    """The runs as a table (the plot beside it), as the command wrote them."""
    m = summary.get("machine") or {}
    lines = ["# Cost per point and memory vs devices", "",
             f"`{summary['command']}` ({summary['points_per_device']} points per device, {summary['tracks']} "
             f"tracks; {m.get('cores')} cores, {m.get('memory')}; {summary['time']}). One run per row: a fresh "
             "private stack, the real job, every event reconciled against the oracle.", "",
             f"![cost per point and memory vs devices]({png})", "",
             "| fences | devices | points | points/s | µs/point | lost | dup | job driver (Python) MB | job JVM MB "
             "| largest worker MB | Redis masters MB | bench MB | Redis B/device: live state | + its events "
             "| all, fences incl. |",
             "|" + "---|" * 15]
    for r in summary["runs"]:
        lines.append("| " + " | ".join(_f(x) for x in (
            r["fences"], r["devices"], r["points"], r["points_per_s"], _f(r["us_per_point"], 1), r["lost"],
            r["duplicated"],
            r["driver_mb"], r["jvm_mb"], r["worker_max_mb"], r["redis_masters_mb"], r["bench_mb"],
            r.get("redis_state_bytes_per_device"), r["redis_run_bytes_per_device"],
            r["redis_total_bytes_per_device"])) + " |")
    lines += ["", "Cost ratio (µs/point at the most devices ÷ at the fewest), per fence count: "
              + ", ".join(f"{k} fences: {_f(v, 2) if v else '—'}" for k, v in summary["cost_ratio"].items())
              + f" (bar: ≤ {summary['ratio_bar']}).", ""]
    fam = next((r["redis_family_bytes_per_device"] for r in reversed(summary["runs"])
                if r.get("redis_family_bytes_per_device")), None)
    if fam:
        lines += ["Where a device's Redis bytes go (MEMORY USAGE of sample keys, bytes per entry, largest run):", "",
                  "| " + " | ".join(fam) + " |", "|" + "---|" * len(fam),
                  "| " + " | ".join(_f(v, 0) for v in fam.values()) + " |", ""]
    return "\n".join(lines)


def _write(out: Path, runs: list[dict], a, argv: list[str]) -> dict:
    summary = {"points_per_device": a.points_per_device, "tracks": a.tracks, "runs": runs,
               "cost_ratio": ratios(runs), "ratio_bar": RATIO_BAR, "driver_bar_mb": DRIVER_BAR_MB,
               "command": "herdfence bench devices " + " ".join(shlex.quote(x) for x in argv),
               "machine": machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out.write_text(json.dumps(summary, indent=1) + "\n")
    return summary
