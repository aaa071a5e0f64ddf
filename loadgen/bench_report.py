"""`herdfence bench report`: docs/benchmarks.md from the committed result JSON files under docs/.

Results only: every figure in the page comes from a result file (bench-push-*.json, bench-pull-*.json,
bench-failover*.json, bench-devices.json, bench-fences.json, elastic-skew.json, soak-*.json) and is
shown with the date of its run, the machine and the command that produced it. Per-beat files
(`*.beats.json`) are never read: they are local profiling output and not committed.
"""
from __future__ import annotations

import json
import subprocess
from functools import lru_cache
from pathlib import Path

FENCEX = {
    "push": "~15,000 updates/s sustained on 4 servers (Kafka Streams + Spring); 65,000/s backlog drain",
    "pull": "2,000 queries/s per instance",
}
# Files that do not record their own command: the command that writes them.
DEFAULT_COMMANDS = {
    "elastic-skew.json": "herdfence elastic skew --json docs/elastic-skew.json",
    "soak-3min.json": "python -m loadgen.soak --minutes 3 --json docs/soak-3min.json",
}


def _is_result(p: Path) -> bool:
    return p.suffix == ".json" and not p.name.endswith(".beats.json")


def _read(p: Path) -> dict | None:
    try:
        out = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def _load(docs: Path, kind: str) -> list[tuple[Path, dict]]:
    out = [(p, r) for p in sorted(docs.glob(f"bench-{kind}-*.json")) if _is_result(p)
           for r in [_read(p)] if r is not None]
    return sorted(out, key=lambda x: (x[1].get("fences", 0), x[1].get("points", 0), str(x[1].get("time", "")), x[0].name))


def _load_one(docs: Path, pattern: str) -> list[tuple[Path, dict]]:
    return [(p, r) for p in sorted(docs.glob(pattern)) if _is_result(p) for r in [_read(p)] if r is not None]


def _fmt(v, digits: int = 0) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


@lru_cache(maxsize=None)
def _committed_date(p: Path) -> str | None:
    """The date the file was last committed (for results that do not record when they ran)."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", p.name], cwd=p.parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _when(p: Path, r: dict) -> str:
    if r.get("time"):
        return str(r["time"])
    committed = _committed_date(p)
    return f"{committed} (committed)" if committed else "date not recorded"


def _date(p: Path, r: dict) -> str:
    """The run's day for a table column (YYYY-MM-DD), or a dash."""
    day = _when(p, r)[:10]
    return day if day[:4].isdigit() else "—"


def _machine(r: dict) -> str:
    m = r.get("machine") or {}
    if not m:
        return "machine not recorded"
    return f"{m.get('cores')} cores ({m.get('cpu') or 'unknown CPU'}), {m.get('memory')} RAM, Python {m.get('python')}"


def _command(p: Path, r: dict) -> str:
    """The recorded command, its output path shown as the committed file's (runs are often written
    elsewhere first, then copied into docs/)."""
    command = r.get("command") or DEFAULT_COMMANDS.get(p.name)
    if not command:
        return "command not recorded"
    words = str(command).split()
    if "--json" in words[:-1]:
        words[words.index("--json") + 1] = f"docs/{p.name}"
    return " ".join(words)


def _provenance(p: Path, r: dict) -> list[str]:
    """Command, date and machine of one result file."""
    return [f"```\n{_command(p, r)}\n```", "",
            f"`{p.name}`: {_when(p, r)}; {_machine(r)}.", ""]


def _paced_summary(pushes: list[tuple[Path, dict]]) -> str:
    """The lowest event p99 among the paced runs (latency at a sustainable rate), if any."""
    paced = [r for _, r in pushes if r.get("offered_rate") and (r.get("event_latency_ms") or {}).get("p99") is not None]
    if not paced:
        return ""
    r = min(paced, key=lambda r: r["event_latency_ms"]["p99"])
    return (f"; paced at {_fmt(float(r['offered_rate']))} reports/s ({_fmt(r.get('fences'))} fences): event p50 "
            f"{_fmt(r['event_latency_ms'].get('p50'))} ms, p99 {_fmt(r['event_latency_ms'].get('p99'))} ms")


def _summary(pushes: list[tuple[Path, dict]], pulls: list[tuple[Path, dict]]) -> list[str]:
    if not (pushes or pulls):
        return []
    lines = ["## Summary beside FenceX", "",
             "| | herdfence (best run below) | FenceX (published) |", "|---|---|---|"]
    if pushes:
        p, best = max(pushes, key=lambda x: x[1].get("points_per_s", 0))
        lat = best.get("event_latency_ms") or {}
        lines.append(f"| push (stream processing) | {_fmt(best.get('points_per_s'))} points/s end to end "
                     f"({_fmt(best.get('fences'))} fences, {_fmt(best.get('devices'))} devices, {_when(p, best)}), "
                     f"event p99 {_fmt(lat.get('p99'))} ms, lost {best.get('lost')}, duplicated "
                     f"{best.get('duplicated')}" + _paced_summary(pushes) + f" | {FENCEX['push']} |")
    if pulls:
        p, best = max(pulls, key=lambda x: x[1].get("queries_per_s", 0))
        lat = best.get("latency_ms") or {}
        unc = best.get("uncached") or {}
        lines.append(f"| pull (queries) | {_fmt(best.get('queries_per_s'))} queries/s, p50 {lat.get('p50')} ms, "
                     f"p99 {lat.get('p99')} ms, errors {best.get('errors')} ({_when(p, best)})"
                     + (f"; with `Cache-Control: no-cache` {_fmt(unc.get('queries_per_s'))} queries/s, "
                        f"p99 {(unc.get('latency_ms') or {}).get('p99')} ms" if unc else "")
                     + f" | {FENCEX['pull']} |")
    return lines + [""]


def _push(pushes: list[tuple[Path, dict]]) -> list[str]:
    if not pushes:
        return []
    lines = ["## Push: reports → events, end to end", "",
             "Simulated herds (loadgen/herd.py) are produced to `gps.reports` as fast as possible (offered: "
             "flood; points/s is then the job's drain rate and latency is mostly queueing behind the "
             "backlog) or paced at the offered rate (`--rate`: latency is the job's own). The clock runs "
             "from the first report produced until the job's heartbeat has counted every point. Event "
             "latency = when the event became visible in Redis − when its confirming report was produced. "
             "`vectorized limit` = the same membership work (H3 cell of every point + one STRtree query over "
             "the same fences) in one process, measured in the same run. lost/duplicated reconcile the "
             "events against the oracle (loadgen/reference.py). Warm-up batches run before the clock starts.",
             "",
             "`tracks`: dense (a fix every 30 s) or sparse (a fix every 5–15 min, 5% uploaded late; "
             "`--tracks sparse`).", "",
             "`drain`: after a flood on a private stack, the running job's reads are held while the same "
             "reports are produced again, then released: the job, warm, processes the backlog with no producer "
             "on the cores (loadgen/bench_drain.py; timed from the first batch after the release to the heartbeat "
             "that counted all of it). Figures before 2026-11-29 restarted the job instead, and include its "
             "workers' fence load.", "",
             "| fences | devices | points | tracks | offered | points/s | drain points/s | vectorized limit | ratio | "
             "event p50 (ms) | event p99 (ms) | events | lost | duplicated | batches | run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p, r in pushes:
        lat = r.get("event_latency_ms") or {}
        offered = f"{_fmt(float(r['offered_rate']))}/s" if r.get("offered_rate") else "flood"
        lines.append("| " + " | ".join(_fmt(x) for x in (
            r.get("fences"), r.get("devices"), r.get("points"), r.get("tracks") or "dense", offered,
            r.get("points_per_s"), r.get("drain_points_per_s"),
            r.get("vectorized_limit_points_per_s"))) + f" | {_fmt(r.get('ratio_to_limit'), 3)} | "
            + " | ".join(_fmt(x) for x in (lat.get("p50"), lat.get("p99"), r.get("events"), r.get("lost"),
                                            r.get("duplicated"), r.get("batches")))
            + f" | {_date(p, r)} |")
    lines.append("")
    lines += _cpu_per_million(pushes)
    for p, r in pushes:
        pace = f", paced at {r['offered_rate']:,.0f} reports/s" if r.get("offered_rate") else ""
        pace += ", sparse collars" if r.get("tracks") == "sparse" else ""
        lines += [f"### {_fmt(r.get('fences'))} fences, {_fmt(r.get('devices'))} devices, "
                  f"{_fmt(r.get('points'))} points{pace}", ""] + _provenance(p, r)
        png = p.with_suffix(".png")
        if png.exists():
            lines += [f"![push {p.stem}]({png.name})", ""]
        bs = r.get("batch_seconds") or {}
        if bs:
            lines += [f"{r.get('batches')} micro-batches, mean {bs.get('mean')} s (max {bs.get('max')} s), "
                      f"mean {_fmt(bs.get('points_mean'))} points per batch.", ""]
    return lines


# the stack's parts in the order the push path meets them, then the rest of the machine
CPU_ROLES = ("bench", "broker", "broker_store", "workers", "jvm", "driver", "redis", "standby", "api", "stack_other",
             "other")


def _cpu_per_million(pushes: list[tuple[Path, dict]]) -> list[str]:
    """Core-seconds per million points by component, from each run's CPU sampling of its measured
    window (loadgen/bench_cpu.py)."""
    runs = [(p, r) for p, r in pushes if (r.get("cpu") or {}).get("core_seconds") and r.get("points")]
    if not runs:
        return []
    lines = ["### Where the CPU goes: core-seconds per million points", "",
             "Each process's user + system time over the measured window (loadgen/bench_cpu.py), divided by the "
             "points. `bench`: the load generator (its producer); `broker_store`: the broker's object store; "
             "`workers`: the job's Python workers (readers and process stage); `jvm`/`driver`: the job's Spark "
             "JVM and driver; `standby`: the hot standby job, all of its processes; `other`: everything else "
             "on the machine.", "",
             "| run | points/s | " + " | ".join(CPU_ROLES) + " | all |", "|---|---|" + "---|" * (len(CPU_ROLES) + 1)]
    for p, r in runs:
        per = 1e6 / r["points"]
        cs = r["cpu"]["core_seconds"]
        lines.append(f"| {p.name} | {_fmt(r.get('points_per_s'))} | "
                     + " | ".join(_fmt(cs.get(role, 0.0) * per, 1) for role in CPU_ROLES)
                     + f" | {_fmt(sum(cs.values()) * per, 1)} |")
    return lines + [""]


def _pull(pulls: list[tuple[Path, dict]]) -> list[str]:
    if not pulls:
        return []
    lines = ["## Pull: who is inside?", "",
             "Fences and devices are loaded, every device gets a few reports through the job, then concurrent "
             "keep-alive clients alternate `GET /v1/fences/{id}/devices` and `POST /v1/query/within` (an area "
             "around a random fence), each with its farm's key. \"as asked\": plain requests, which each API "
             "worker may answer from its answer cache; \"no-cache\": the same mix with `Cache-Control: "
             "no-cache`, every answer read from Redis. `streams`: live event streams held open meanwhile "
             "(`--streams N`), with the delay from a report's POST to its event on every stream.", "",
             "| fences | devices | client | connections | streams | requests | queries/s | p50 (ms) | p99 (ms) | "
             "errors | event delay p99 (s) | run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p, r in pulls:
        live = r.get("streams") or {}
        delay = (live.get("delay_s") or {}).get("p99") if isinstance(live, dict) else None
        runs = [("as asked", r)] + ([("no-cache", r["uncached"])] if r.get("uncached") else [])
        for label, run in runs:
            lat = run.get("latency_ms") or {}
            lines.append(f"| {_fmt(r.get('fences'))} | {_fmt(r.get('devices'))} | {r.get('client')} | "
                         f"{r.get('connections')} | {_fmt(live.get('streams')) if live else 0} | {label} | "
                         f"{_fmt(run.get('queries_per_s'))} | {lat.get('p50')} | {lat.get('p99')} | {run.get('errors')} | "
                         f"{_fmt(delay, 2) if label == 'as asked' and delay is not None else '—'} | {_date(p, r)} |")
    lines.append("")
    for p, r in pulls:
        lines += _provenance(p, r)
        png = p.with_suffix(".png")
        if png.exists():
            lines += [f"![pull {p.stem}]({png.name})", ""]
    return lines


def _failover(runs: list[tuple[Path, dict]]) -> list[str]:
    if not runs:
        return []
    lines = ["## Take-over: the active job killed or frozen", "",
             "A paced producer writes to `gps.reports` while the freshness lag (now − the newest processed "
             "report time of sampled devices) is sampled every 100 ms. The active job is killed (kill -9), "
             "then the new active job is frozen (SIGSTOP) past its lease. `fresh`: from the fault until the "
             "lag is first back at its steady level; `outage`: until it stays there for 2 s.", "",
             "| fault | rate (reports/s) | steady lag p50 (ms) | take-over (ms) | fresh (ms) | outage (ms) | "
             "worst lag (ms) | lost | duplicated | run |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p, r in runs:
        for fault, label in (("kill", "kill -9"), ("stop", "SIGSTOP")):
            f = r.get(fault) or {}
            if not f:
                continue
            lines.append(f"| {label} | {_fmt(r.get('rate'))} | {_fmt((r.get('steady_lag_ms') or {}).get('p50'))} | "
                         f"{_fmt(f.get('takeover_ms'))} | {_fmt(f.get('fresh_ms'))} | {_fmt(f.get('outage_ms'))} | "
                         f"{_fmt(f.get('worst_lag_ms'))} | {r.get('lost')} | {r.get('duplicated')} | {_date(p, r)} |")
    lines.append("")
    for p, r in runs:
        lines += _provenance(p, r)
        png = p.with_suffix(".png")
        if png.exists():
            lines += [f"![failover {p.stem}]({png.name})", ""]
    return lines


def _devices(runs: list[tuple[Path, dict]]) -> list[str]:
    if not runs:
        return []
    lines = ["## Devices: cost per point and memory, 10k to 1M devices", "",
             "One fresh private stack per row, the real job, every event reconciled against the oracle.", "",
             "| fences | devices | points | points/s | µs/point | lost | duplicated | job driver MB | job JVM MB | "
             "largest worker MB | Redis masters MB | Redis bytes/device (live state) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, summary in runs:
        for r in summary.get("runs") or []:
            lines.append("| " + " | ".join(_fmt(r.get(k)) for k in ("fences", "devices", "points")) +
                         f" | {_fmt(r.get('points_per_s'))} | {_fmt(r.get('us_per_point'), 1)} | {r.get('lost')} | "
                         f"{r.get('duplicated')} | {_fmt(r.get('driver_mb'))} | {_fmt(r.get('jvm_mb'))} | "
                         f"{_fmt(r.get('worker_max_mb'))} | {_fmt(r.get('redis_masters_mb'))} | "
                         f"{_fmt(r.get('redis_state_bytes_per_device'))} |")
    lines.append("")
    for p, r in runs:
        lines += _provenance(p, r)
        png = p.with_suffix(".png")
        if png.exists():
            lines += [f"![devices {p.stem}]({png.name})", ""]
    return lines


def _fences(runs: list[tuple[Path, dict]]) -> list[str]:
    if not runs:
        return []
    lines = ["## Fences: 10k vs 1M", "",
             "The job's matching call (`FenceCache.match`) over 1M points spread over the same farms, caches "
             "loaded from a private Redis Cluster, points in the job's order.", "",
             "| fences | bulk load (s) | Redis bytes/fence | fences cached, largest partition | ns/point | "
             "ns/point with H3 | vectorized limit (points/s) |", "|---|---|---|---|---|---|---|"]
    for _, summary in runs:
        for r in summary.get("results") or []:
            match, cache = r.get("match") or {}, r.get("cache") or {}
            lines.append(f"| {_fmt(r.get('fences'))} | {_fmt((r.get('load') or {}).get('seconds'), 1)} | "
                         f"{_fmt((r.get('redis_memory') or {}).get('bytes_per_fence'))} | "
                         f"{_fmt(cache.get('fences_cached_max'))} | {_fmt(match.get('ns_per_point'))} | "
                         f"{_fmt(match.get('ns_per_point_with_h3'))} | "
                         f"{_fmt((r.get('vectorized_limit') or {}).get('points_per_s'))} |")
        if summary.get("per_point_cost_ratio") is not None:
            lines += ["", f"Per-point cost ratio (most ÷ fewest fences): {summary['per_point_cost_ratio']}."]
    lines.append("")
    for p, r in runs:
        lines += _provenance(p, r)
    return lines


def _core(runs: list[tuple[Path, dict]]) -> list[str]:
    """`herdfence bench core`: the process stage's computing core per step, no stack."""
    if not runs:
        return []
    from loadgen.bench_core import STEPS as steps
    lines = ["## The process stage's core, alone", "",
             "`herdfence bench core` (loadgen/bench_core.py): a simulated herd cut into micro-batches, each run "
             "through the job's own steps on one core with no Kafka, Spark or Redis (the state records encoded "
             "and decoded as the process stage does); the first batch warms up and is not counted. Seconds per "
             "100,000 points, and µs per device and batch, by step; events reconciled with the oracle.", "",
             "| tracks | fences | points | devices | batches | " + " | ".join(steps) + " | µs per device-batch "
             "(" + ", ".join(steps) + ") | points/s | events | lost | duplicated |",
             "|---|---|---|---|---|" + "---|" * len(steps) + "---|---|---|---|---|"]
    for _, r in runs:
        per, dev = r.get("seconds_per_100k_points") or {}, r.get("us_per_device_batch") or {}
        lines.append(f"| {r.get('tracks', 'dense')} | {_fmt(r.get('fences'))} | {_fmt(r.get('points'))} | "
                     f"{_fmt(r.get('devices'))} | {r.get('batches')} | "
                     + " | ".join(_fmt(per.get(s), 3) for s in steps)
                     + " | " + " / ".join(_fmt(dev.get(s), 1) for s in steps)
                     + f" | {_fmt(r.get('points_per_s'))} | {_fmt(r.get('events'))} | {r.get('lost')} | "
                     f"{r.get('duplicated')} |")
    lines.append("")
    for p, r in runs:
        lines += _provenance(p, r)
    return lines


def _elastic(runs: list[tuple[Path, dict]]) -> list[str]:
    if not runs:
        return []
    lines = ["## Elastic loop: a moving hot spot", "",
             "| partitions | steps to balance | max/mean before | after (p90) | reconfiguration stall (ms) | "
             "cross-node calls aligned / unaligned | query restarts | lost | duplicated | run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p, r in runs:
        lines.append(f"| {r.get('partitions')} | {r.get('steps_to_balance')} | {r.get('max_over_mean_before')} | "
                     f"{r.get('max_over_mean_after')} | {r.get('reconfig_stall_ms')} | "
                     f"{r.get('cross_shard_calls_aligned')} / {r.get('cross_shard_calls_unaligned')} | "
                     f"{r.get('query_restarts')} | {r.get('lost')} | {r.get('duplicated')} | {_date(p, r)} |")
    lines.append("")
    for p, r in runs:
        lines += _provenance(p, r)
        png = p.with_suffix(".png")
        if png.exists():
            lines += [f"![elastic {p.stem}]({png.name})", ""]
    return lines


def _soak(runs: list[tuple[Path, dict]]) -> list[str]:
    if not runs:
        return []
    lines = ["## Soak: reports through the API at 80% of capacity", "",
             "| seconds | devices | capacity (reports/s) | achieved (reports/s) | failed reports | request p50 / p99 (ms) | "
             "job RSS first → last (MB) | API RSS first → last (MB) | duplicate event ids | run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p, r in runs:
        lat, rss = r.get("request_latency_ms") or {}, r.get("rss_mb") or {}
        job, api = rss.get("job") or {}, rss.get("api") or {}
        lines.append(f"| {_fmt(r.get('seconds'), 0)} | {_fmt(r.get('devices'))} | {_fmt(r.get('capacity_points_per_s'))} | "
                     f"{_fmt(r.get('achieved_points_per_s'))} | {r.get('failed_reports')} | {lat.get('p50')} / {lat.get('p99')} | "
                     f"{_fmt(job.get('first'))} → {_fmt(job.get('last'))} | {_fmt(api.get('first'))} → {_fmt(api.get('last'))} | "
                     f"{r.get('duplicate_event_ids')} | {_date(p, r)} |")
    lines.append("")
    for p, r in runs:
        lines += _provenance(p, r)
    return lines


def _ab(runs: list[tuple[Path, dict]]) -> list[str]:
    """A/B runs (loadgen/bench_ab.py): both commits' runs side by side, interleaved, and their medians."""
    if not runs:
        return []
    lines = ["## A/B: this code against an earlier commit, in one sitting", "",
             "Absolute figures move 2–3x between days on this machine; a ratio measured in one sitting holds. "
             "Both commits run the same command, interleaved, and the medians are compared "
             "(`herdfence bench ab`).", ""]
    for p, r in runs:
        commits = r.get("commits") or {}
        lines += [f"### {commits.get('main')} against {commits.get('base')}, {r.get('date')}", "",
                  f"`{r.get('command')}`, then `herdfence bench ab --collect` ({p.name}).", "",
                  "| commit | round | points/s | producer (s) | drain points/s | lost | duplicated |",
                  "|---|---|---|---|---|---|---|"]
        for side in ("main", "base"):
            for run in sorted((r.get("runs") or {}).get(side, []), key=lambda x: x["round"]):
                lines.append(f"| {commits.get(side)} | {run['round']} | {_fmt(run.get('points_per_s'))} | "
                             f"{_fmt(run.get('producer_s'), 2)} | {_fmt(run.get('drain_points_per_s'))} | "
                             f"{run.get('lost')} | {run.get('duplicated')} |")
        medians = r.get("medians") or {}
        for side in ("main", "base"):
            m = medians.get(side) or {}
            lines.append(f"| {commits.get(side)} | median | {_fmt(m.get('points_per_s'))} | "
                         f"{_fmt(m.get('producer_s'), 2)} | {_fmt(m.get('drain_points_per_s'))} | | |")
        lines += ["", f"Ratio of the medians, points/s: **{_fmt(r.get('ratio'), 2)}**."]
        by_round = r.get("round_ratios") or {}
        if by_round:     # each round's own ratio: a drift through the sitting shows here
            lines.append("Each round's ratio: " + ", ".join(f"{_fmt(float(v), 2)}" for _, v in
                                                            sorted(by_round.items(), key=lambda kv: int(kv[0]))) + ".")
        lines.append("")
    return lines


STAGE_STEPS = ("refresh", "match", "read_state", "advance", "write", "events")


def _stage(runs: list[tuple[Path, dict]]) -> list[str]:
    """`herdfence bench stage`: the process stage per step against a stack's Redis, CPU per device-batch."""
    if not runs:
        return []
    lines = ["## The process stage with its Redis reads and writes, per device and batch", "",
             "`herdfence bench stage` (loadgen/bench_stage.py): a simulated herd loaded into a stack, its reports "
             "cut into micro-batches and run through the process task's own code in one process, against the "
             "stack's Redis Cluster; the first batch warms up and is not counted. CPU µs of the task's thread per "
             "device and batch, by step (at a paced rate every batch touches every device, so this is most of a "
             "batch); events reconciled with the oracle.", "",
             "| tracks | fences | points | devices | batches | " + " | ".join(STAGE_STEPS)
             + " | CPU µs per device-batch | events made | lost | duplicated |",
             "|---|---|---|---|---|" + "---|" * len(STAGE_STEPS) + "---|---|---|---|"]
    for _, r in runs:
        cpu = r.get("cpu_us_per_device_batch") or {}
        lines.append(f"| {r.get('tracks', 'dense')} | {_fmt(r.get('fences'))} | {_fmt(r.get('points'))} | "
                     f"{_fmt(r.get('devices'))} | {r.get('batches')} | "
                     + " | ".join(_fmt(cpu.get(s), 1) for s in STAGE_STEPS)
                     + f" | {_fmt(r.get('cpu_us_per_device_batch_total'), 1)} | {_fmt(r.get('events'))} | "
                     f"{r.get('lost')} | {r.get('duplicated')} |")
    lines.append("")
    for p, r in runs:
        lines += _provenance(p, r)
    return lines


def write_report(docs: Path) -> Path:
    pushes, pulls = _load(docs, "push"), _load(docs, "pull")
    lines = ["# herdfence benchmarks", "",
             "Generated by `herdfence bench report` from the result files in this directory. Every figure "
             "was measured by the command shown, on the machine shown, in one run, on the date shown. "
             "Everything of a run (broker, Redis Cluster, Spark job, API, load generator) shares that one "
             "machine.", ""]
    lines += _summary(pushes, pulls)
    lines += _ab(_load_one(docs, "ab-*.json"))
    lines += _push(pushes)
    lines += _pull(pulls)
    lines += _core(_load_one(docs, "bench-core*.json"))
    lines += _stage(_load_one(docs, "bench-stage*.json"))
    lines += _failover(_load_one(docs, "bench-failover*.json"))
    lines += _devices(_load_one(docs, "bench-devices.json"))
    lines += _fences(_load_one(docs, "bench-fences.json"))
    lines += _elastic(_load_one(docs, "elastic-skew*.json"))
    lines += _soak(_load_one(docs, "soak-*.json"))
    lines += ["## Reproduce", "",
              "On a running stack (`herdfence up --detach`) the benches use it; otherwise they start a private "
              "stack in a temporary HERDFENCE_HOME and stop it after. Write the result into `docs/` with "
              "`--json docs/<name>.json`, then `herdfence bench report` rewrites this file. To compare with an "
              "earlier commit in one sitting: `git worktree add ../base <commit> && make -C ../base venv`, then "
              "`herdfence bench ab --base ../base --rounds 3 --json docs/ab-<commit>.json -- <bench push "
              "arguments>`.", ""]
    out = docs / "benchmarks.md"
    out.write_text("\n".join(lines))
    return out
