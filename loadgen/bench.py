"""`herdfence bench push | pull | ingest | fences | ab | report` (see ../shared/CONTRACT.md, "Benchmarks").

push: N fences (bulk-loaded), D devices, M simulated points streamed into gps.reports as fast as
  possible through the real job; sustained points/s end to end (first report produced → the job's
  heartbeat counts all M), event latency (Redis stream id of the event = when it became visible,
  minus the wall time its confirming report was produced), the vectorized limit of the same
  membership work in this process, and lost/duplicated events against the oracle (loadgen.reference:
  inferred and late events included).
pull: concurrent keep-alive clients on GET /v1/fences/{id}/devices and POST /v1/query/within.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from loadgen import bench_memory
from loadgen.herd import TRACKS
from loadgen.bench_stack import bench_stack, machine, say

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _png_for(json_path: str | Path) -> Path:
    p = Path(json_path)
    return p.with_suffix(".png") if p.suffix == ".json" else p.with_name(p.name + ".png")


def _write_json(path: str | Path, out: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1) + "\n")


def _command(argv: list[str]) -> str:
    return "herdfence bench " + " ".join(shlex.quote(a) for a in argv)


# --- the vectorized limit -------------------------------------------------------------------------
def vectorized_limit_points_per_s(fences, lon: np.ndarray, lat: np.ndarray, repeat: int = 2) -> tuple[float, int]:
    """The same membership work in one process: H3 cell of every point + plain vectorized shapely
    (STRtree over the fences, one bulk `intersects` query). Best of `repeat` runs. Returns (points/s,
    matched pairs)."""
    from fencing.model.h3util import cells_for_points
    from fencing.model.keys import FENCE_RES
    from fencing.model.membership import vectorized_limit

    geoms = [f.geometry for f in fences]
    best, pairs = float("inf"), 0
    for _ in range(repeat):
        t = time.perf_counter()
        cells_for_points(lat, lon, FENCE_RES)
        point, _fence = vectorized_limit(geoms, lon, lat)
        best = min(best, time.perf_counter() - t)
        pairs = len(point)
    return len(lon) / best, pairs


# --- push -----------------------------------------------------------------------------------------
# Unmeasured reports (of other device ids) before the measured run, so that it meets a job that has
# been running: each Python worker has loaded the fences, and the JVM has compiled its hot paths
# (with 2 reports per device, the JIT compiler threads still took ~1/3 of the JVM's CPU in the run).
WARMUP_REPORTS_PER_DEVICE = 20
WARMUP_MAX_REPORTS = 200_000     # enough to warm every worker; more only doubles a big run (issue 23)


def push(fences: int, points: int, devices: int, json_path: str, seed: int = 0, fences_per_farm: int = 12,
         progress: bool = True, plot: bool = True, command: str = "", keep_stack: bool = False,
         rate: float | None = None, tracks: str = "dense", ports: dict[str, str] | None = None,
         drain: bool = True) -> dict:
    """`rate`: reports/s offered to Kafka (None: as fast as the producer can). Flooded, points/s is the
    end-to-end rate with the producer on the same cores, and the latency is mostly queueing behind the
    backlog; paced below it, the latency is the job's own (report sent → event visible). `drain`: a
    flood on a private stack is followed by the backlog drain (loadgen.bench_drain)."""
    from loadgen import plots
    from loadgen.bench_cpu import CpuSampler
    from loadgen import bench_drain
    from loadgen.bench_load import batch_summary, handled, load_simulation, read_events, register_devices, \
        stream_and_wait, wait_until_warm
    from loadgen.herd import SimConfig, simulate
    from loadgen.reference import expected_events
    from loadgen.truth import reconcile

    t = time.perf_counter()
    say(f"simulating {fences} fences, {devices} devices, {points} points, {tracks} tracks (seed {seed})")
    sim = simulate(SimConfig.for_totals(fences, points, devices, seed=seed, fences_per_farm=fences_per_farm,
                                        **TRACKS[tracks]))
    sim_s = time.perf_counter() - t
    lon, lat = sim.reports["lon"].to_numpy(float), sim.reports["lat"].to_numpy(float)
    say("measuring the vectorized limit (H3 + STRtree/shapely, one process)")
    limit, limit_pairs = vectorized_limit_points_per_s(sim.fences, lon, lat)
    say(f"vectorized limit: {limit:,.0f} points/s")

    warm_n = min(len(sim.reports), max(2_000, min(WARMUP_MAX_REPORTS, WARMUP_REPORTS_PER_DEVICE * devices)))
    # spread over the whole run, not its first reports: the warm-up then meets every area (fence group)
    # the run will, as a job that has been running has (the first 200k of 1M reports touched 54% of
    # 100k fences, and the measured run's first batch loaded the rest: ~2.5 s of a 17 s run)
    warm_rows = np.unique(np.linspace(0, len(sim.reports) - 1, warm_n).astype(np.int64))
    with bench_stack(ports, keep=keep_stack) as stack:
        redis = stack.redis
        memory = bench_memory.MemorySampler(stack.settings)
        memory.start()
        redis_bytes = {"start": bench_memory.masters_used_memory(redis)}
        t = time.perf_counter()
        loaded = load_simulation(redis, sim, progress=progress,
                                 warm_devices=pd.unique(sim.reports["device_id"].iloc[warm_rows]))
        load_s = time.perf_counter() - t
        redis_bytes["loaded"] = bench_memory.masters_used_memory(redis)
        say(f"loaded {len(sim.fences)} fences, {len(sim.device_ids)} devices in {load_s:.1f} s {loaded.seconds}")
        warm = sim.reports.iloc[warm_rows].copy()
        warm["device_id"] = loaded.warmup_prefix + warm["device_id"].astype(str)
        say(f"warm-up: {len(warm)} reports of warm-up devices (the workers' fence caches, the JVM's JIT)")
        t = time.perf_counter()
        stream_and_wait(stack, warm, progress=progress)
        warm_s = time.perf_counter() - t
        del warm
        say("waiting for the keep-warm runs to find every fence cached in every Python worker")
        warm_wait = wait_until_warm(redis, len(sim.fences), since=time.time())
        say(f"workers warm: {warm_wait['warm']} after {warm_wait['seconds']:.1f} s")
        redis_bytes["warm"] = bench_memory.masters_used_memory(redis)
        reports = sim.reports.copy()
        reports["device_id"] = loaded.device_prefix + reports["device_id"].astype(str)
        cpu = CpuSampler(stack.settings)          # the measured run only: its roles resolved first
        cpu.resolve()
        cpu.start()
        # a batch of up to 1M reports (HERDFENCE_MAX_OFFSETS_PER_TRIGGER) beats once, after minutes on a
        # busy 2-core machine: no heartbeat for 180 s is not a stall in a run of millions (issue 23)
        wstats, t_first, t_done, sampler, base = stream_and_wait(stack, reports, progress=progress, rate=rate,
                                                                 stall_timeout_s=max(180.0, len(reports) / 2_000))
        cpu.stop()
        redis_bytes["run"] = bench_memory.masters_used_memory(redis)
        mem = memory.stop()
        observed = read_events(redis, sorted(set(loaded.farm_of.values())))
        mem["redis"] = bench_memory.redis_summary(redis, redis_bytes, devices, loaded)
        stack_info = stack.describe()
        if drain and rate is None and t_done:      # a flood that did not finish would leak into it
            drained = bench_drain.drain(stack, sim.reports, "d" + loaded.device_prefix,
                                        lambda prefix: register_devices(redis, sim, loaded.farm_of, prefix),
                                        progress=progress)
            say(f"drain: {drained}")
        else:
            drained = {"skipped": "paced run" if rate is not None else "--no-drain" if not drain
                       else "the flood did not finish"}

    seconds = (t_done - t_first) if t_done else None
    processed = (handled(sampler.beats[-1]) - base) if sampler.beats else 0
    shed = sum(b.shed for b in sampler.beats)     # dropped by load shedding (never event-relevant)
    pps = points / seconds if seconds else 0.0

    # latency: match each event to the report that confirmed it (device, ts)
    sent = pd.DataFrame({"device_id": reports["device_id"].to_numpy(), "ts": reports["ts"].to_numpy(),
                         "sent_ms": wstats.sent_at_ms})
    sent = sent.drop_duplicates(["device_id", "ts"])
    lat_ms = np.empty(0)
    if len(observed):
        m = observed.merge(sent, on=["device_id", "ts"], how="left")
        lat_ms = (m["visible_ms"] - m["sent_ms"]).dropna().to_numpy(float)

    # correctness: back to simulator ids, against the oracle
    say("reconciling events with the oracle (loadgen.reference)")
    t = time.perf_counter()
    expected = expected_events(sim.reports, sim.fences, sim.device_farm)
    truth_s = time.perf_counter() - t
    observed = observed[observed["device_id"].str.startswith(loaded.device_prefix)] if len(observed) else observed
    obs = observed.copy()
    if len(obs):
        obs["device_id"] = obs["device_id"].str.slice(len(loaded.device_prefix))
        obs["fence_id"] = [loaded.fence_sim.get((f, i), f"?{i}") for f, i in zip(obs["farm"], obs["fence_id"])]
    else:
        obs = pd.DataFrame(columns=["device_id", "fence_id", "type", "ts"])
    rec = reconcile(expected, obs)

    beats = sampler.beats
    in_run = [b for b in beats if b.points > 0]
    out = {
        "fences": fences, "points": points, "devices": devices,
        "points_per_s": round(pps, 1),
        # the same reports as a backlog processed with no producer running (loadgen.bench_drain);
        # None when it was skipped ("drain" says why)
        "drain_points_per_s": drained.get("points_per_s"),
        "drain": drained,
        "offered_rate": rate,           # reports/s the producer was paced at (None: flooded)
        "event_latency_ms": {"p50": round(float(np.percentile(lat_ms, 50)), 1) if len(lat_ms) else None,
                             "p99": round(float(np.percentile(lat_ms, 99)), 1) if len(lat_ms) else None},
        "vectorized_limit_points_per_s": round(limit, 1),
        "ratio_to_limit": round(pps / limit, 4) if limit else None,
        "events": rec["events"], "lost": rec["lost"], "duplicated": rec["duplicated"],
        "tracks": tracks,
        "expected_inferred": int(expected["inferred"].sum()), "expected_late": int(expected["late"].sum()),
        # beyond the contract
        "observed_events": rec["observed"], "unexpected_events": rec["unexpected"],
        "latency_matched_events": int(len(lat_ms)),
        "processed_points": int(processed), "shed_points": shed, "seconds": round(seconds, 3) if seconds else None,
        "completed": t_done is not None,
        "produce": {k: v for k, v in wstats.as_dict().items()},
        "batches": len(in_run),
        "batch_seconds": batch_summary(in_run),
        # the active job's longest time between two lease renewals: how near it came to being replaced
        "lease_gap_ms_max": max((b.lease_gap_ms for b in beats), default=None),
        "warmup_points": warm_n,
        "setup_seconds": {"simulate": round(sim_s, 2), "load": round(load_s, 2), **loaded.seconds,
                          "warmup": round(warm_s, 2), "workers_warm": warm_wait["seconds"],
                          "oracle": round(truth_s, 2)},
        "workers_warm": warm_wait["warm"],
        "vectorized_limit_pairs": int(limit_pairs),
        "memory": mem,
        # core-seconds per part of the stack over the measured window (loadgen.bench_cpu)
        "cpu": cpu.window(t_first, t_done) if t_done else {},
        "stack": stack_info, "machine": machine(), "command": command,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _write_json(json_path, out)
    if plot:
        pt, pn = plots.produce_curve(wstats.sent_at_ms)
        plots.push_plot(_png_for(json_path), beats, t_first, base, lat_ms, (pt, pn),
                        f"herdfence push: {fences:,} fences, {devices:,} devices, {points:,} points — "
                        f"{pps:,.0f} points/s{f' (paced at {rate:,.0f}/s)' if rate else ''}, "
                        f"p99 {out['event_latency_ms']['p99']} ms "
                        f"({machine()['cores']} cores)")
        # heartbeats, for profiling (per-partition stats per batch)
        Path(_png_for(json_path).with_suffix(".beats.json")).write_text(json.dumps([b.to_dict() for b in beats]))
    return out


# --- pull -----------------------------------------------------------------------------------------
def pull(fences: int, devices: int, seconds: float, json_path: str, seed: int = 0, connections: int = 32,
         fences_per_farm: int = 12, client: str = "auto", progress: bool = True, plot: bool = True,
         command: str = "", keep_stack: bool = False, reports_per_device: int = 3, streams: int = 0) -> dict:
    from loadgen import bench_pull, plots
    from loadgen.bench_load import load_simulation, stream_and_wait
    from loadgen.herd import SimConfig, simulate

    sim = simulate(SimConfig.for_totals(fences, reports_per_device * devices, devices, seed=seed,
                                        fences_per_farm=fences_per_farm))
    with bench_stack(keep=keep_stack) as stack:
        loaded = load_simulation(stack.redis, sim, progress=progress)
        reports = sim.reports.copy()
        reports["device_id"] = loaded.device_prefix + reports["device_id"].astype(str)
        say(f"placing {devices} devices: streaming {len(reports)} reports through the job")
        stream_and_wait(stack, reports, progress=progress)
        requests = bench_pull.build_requests(sim, loaded, seed=seed)
        # unmeasured warm-up: each API worker's first answer to each of the mix's requests reads Redis
        # (the same cold start a worker has after a restart); the measured runs are steady state
        warm_s = min(5.0, max(1.0, seconds / 4))
        say(f"warm-up: {warm_s:.0f} s of the same mix, not measured")
        bench_pull.run(stack.settings.api_url, requests, warm_s, connections, client, progress)
        live = None
        if streams:
            live = _open_maps(stack, sim, loaded, streams, seconds)
        result = bench_pull.run(stack.settings.api_url, requests, seconds, connections, client, progress)
        if live is not None:
            live = _close_maps(live)
        say("again with Cache-Control: no-cache (every answer read from Redis, as with a herd always moving)")
        uncached = bench_pull.run(stack.settings.api_url, requests, max(5.0, seconds / 2), connections, client,
                                  progress, no_cache=True)
        stack_info = stack.describe()
    out = {"fences": fences, "devices": devices, "queries_per_s": result["queries_per_s"],
           "latency_ms": {"p50": result["p50"], "p99": result["p99"]}, "errors": result["errors"],
           "client": result["client"], "connections": connections, "seconds": result["seconds"],
           "requests": result["requests"], "mix": "50% GET /v1/fences/{id}/devices, 50% POST /v1/query/within",
           "latency_percentiles_ms": result["percentiles"], "error_detail": result.get("error_detail"),
           "answer_cache": "each API worker keeps rendered answers until the job or an edit publishes a change "
                           "for the farm (api/answers.py); measured after an unmeasured warm-up pass of the "
                           "same mix; the `uncached` run bypasses the cache",
           "uncached": {"queries_per_s": uncached["queries_per_s"], "latency_ms": {"p50": uncached["p50"],
                        "p99": uncached["p99"]}, "errors": uncached["errors"], "seconds": uncached["seconds"],
                        "latency_percentiles_ms": uncached["percentiles"]},
           "stack": stack_info, "machine": machine(), "command": command,
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if live is not None:
        out["streams"] = live
    _write_json(json_path, out)
    if plot:
        plots.pull_plot(_png_for(json_path), {
            "as asked (answer cache)": (result["queries_per_s"],
                                                {float(k): v for k, v in result["percentiles"].items()}),
            "no-cache (Redis)": (uncached["queries_per_s"],
                                                          {float(k): v for k, v in uncached["percentiles"].items()})},
                        f"herdfence pull: {fences:,} fences, {devices:,} devices, {connections} connections "
                        f"({result['client']}) — {result['queries_per_s']:,.0f} q/s, p99 {result['p99']} ms")
    return out


def _open_maps(stack, sim, loaded, streams: int, seconds: float) -> dict:
    """`streams` live event streams spread over the farms, held by their own process while the pull
    mix runs, and one sentinel animal per streamed farm walking in and out of a fence (bench_sse)."""
    import threading

    import shapely

    from loadgen import bench_sse
    farms = sorted(loaded.farm_keys)[:streams]
    fence_of = {}
    for f in sim.fences:
        real_farm, _ = loaded.fence_real[f.fence_id]
        fence_of.setdefault(real_farm, f)
    sentinels, keys, stream_devices = [], [], {}
    for farm in farms:
        f = fence_of[farm]
        inside = shapely.get_coordinates(shapely.point_on_surface(f.geometry))[0]
        minx, miny, maxx, maxy = shapely.bounds(f.geometry).tolist()
        sentinels.append(bench_sse.Sentinel(loaded.farm_keys[farm], f"{loaded.device_prefix}sentinel-{farm[-6:]}",
                                            (float(inside[0]), float(inside[1])), (maxx + 0.01, maxy + 0.01)))
    by_farm = {farm: s for farm, s in zip(farms, sentinels)}
    for i in range(streams):
        farm = farms[i % len(farms)]
        keys.append(loaded.farm_keys[farm])
        stream_devices[i] = by_farm[farm].device_id
    say(f"opening {streams} live event streams over {len(farms)} farms")
    proc, first = bench_sse.start_holder(stack.settings.api_url, keys, seconds + 30)
    say(f"streams open: {first}")
    box: dict = {}
    walker = threading.Thread(target=lambda: box.update(posts=bench_sse.walk(stack.settings.api_url, sentinels,
                                                                               seconds)))
    walker.start()
    return {"proc": proc, "first": first, "walker": walker, "box": box, "stream_devices": stream_devices,
            "streams": streams, "farms": len(farms)}


def _close_maps(live: dict) -> dict:
    from loadgen import bench_sse
    live["walker"].join()
    received = bench_sse.collect(live["proc"])
    posts = live["box"].get("posts", [])
    result = bench_sse.delays(received, posts, live["stream_devices"])
    return {"streams": live["streams"], "farms": live["farms"], "opened": live["first"].get("open"),
            "refused": live["first"].get("failed"), "refusals": live["first"].get("reasons", {}),
            "sentinel_posts": len(posts), **result,
            "note": "delay = arrival at the stream − the POST of the reports that caused the event "
                    "(the job's micro-batch included)"}


# --- command line ----------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="herdfence bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    ps = sub.add_parser("push", help="push benchmark (stream processing end to end)")
    ps.add_argument("--fences", type=int, required=True)
    ps.add_argument("--points", type=int, required=True)
    ps.add_argument("--devices", type=int, default=10_000)
    ps.add_argument("--json", required=True, metavar="FILE")
    ps.add_argument("--seed", type=int, default=0)
    ps.add_argument("--fences-per-farm", type=int, default=12)
    ps.add_argument("--no-plot", action="store_true")
    ps.add_argument("--keep-stack", action="store_true", help="leave a private stack running")
    ps.add_argument("--rate", type=float, default=None, metavar="R",
                    help="pace the producer at R reports/s (default: as fast as it can, a flood)")
    ps.add_argument("--tracks", choices=sorted(TRACKS), default="dense",
                    help="dense: a fix every ~30 s; sparse: every 5-15 min, 5%% uploaded late")
    ps.add_argument("--no-drain", action="store_true",
                    help="skip the backlog drain that follows a flood on a private stack")
    pl = sub.add_parser("pull", help="pull benchmark (API queries)")
    pl.add_argument("--fences", type=int, required=True)
    pl.add_argument("--devices", type=int, required=True)
    pl.add_argument("--seconds", type=float, required=True)
    pl.add_argument("--json", required=True, metavar="FILE")
    pl.add_argument("--connections", type=int, default=32)
    pl.add_argument("--client", choices=("auto", "wrk", "httpx"), default="auto")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--fences-per-farm", type=int, default=12)
    pl.add_argument("--no-plot", action="store_true")
    pl.add_argument("--keep-stack", action="store_true")
    pl.add_argument("--streams", type=int, default=0, metavar="N",
                    help="hold N live event streams (open maps) while the mix runs; report their event delays")
    sub.add_parser("ingest", help="Kafka source read benchmark (loadgen/bench_ingest.py)", add_help=False)
    sub.add_parser("devices", help="device scaling: per-point cost and memory at 10k..1M devices "
                                   "(loadgen/bench_devices.py)", add_help=False)
    sub.add_parser("fences", help="fence scaling: 10k vs 1M fences, per-point cost (loadgen/bench_fences.py)",
                   add_help=False)
    fo = sub.add_parser("failover", help="the push path's outage when the active job is killed or frozen "
                                         "(hot standby, loadgen/bench_failover.py)")
    fo.add_argument("--rate", type=float, default=2000.0, help="reports/s offered to Kafka")
    fo.add_argument("--devices", type=int, default=2000)
    fo.add_argument("--fences", type=int, default=1000)
    fo.add_argument("--steady-seconds", type=float, default=15.0)
    fo.add_argument("--json", metavar="FILE")
    fo.add_argument("--seed", type=int, default=0)
    fo.add_argument("--no-plot", action="store_true")
    sub.add_parser("ab", help="this checkout against another commit's, interleaved, medians (loadgen/bench_ab.py)",
                   add_help=False)
    sub.add_parser("core", help="the process stage's computing core per step, no stack (loadgen/bench_core.py)",
                   add_help=False)
    sub.add_parser("stage", help="the process stage per step against a stack's Redis Cluster, CPU per device "
                                 "and batch (loadgen/bench_stage.py)", add_help=False)
    rp = sub.add_parser("report", help="write docs/benchmarks.md from the JSON results under docs/")
    rp.add_argument("--docs", default=str(DOCS))
    if argv and argv[0] == "devices":
        from loadgen import bench_devices
        return bench_devices.main(argv[1:])
    if argv and argv[0] == "core":
        from loadgen import bench_core
        return bench_core.main(argv[1:])
    if argv and argv[0] == "stage":
        from loadgen import bench_stage
        return bench_stage.main(argv[1:])
    if argv and argv[0] == "ab":
        from loadgen import bench_ab
        return bench_ab.main(argv[1:])
    if argv and argv[0] == "fences":
        from loadgen import bench_fences
        return bench_fences.main(argv[1:])
    if argv and argv[0] == "ingest":
        from loadgen import bench_ingest as ingest_bench
        if hasattr(ingest_bench, "main"):
            return int(ingest_bench.main(argv[1:]) or 0)
        ia = argparse.ArgumentParser(prog="herdfence bench ingest")
        ia.add_argument("--records", type=int, default=200_000)
        ia.add_argument("--json", metavar="FILE")
        a = ia.parse_args(argv[1:])
        print(json.dumps(ingest_bench.run(a.records, a.json)))
        return 0
    args = p.parse_args(argv)
    cmd = _command(argv)
    if args.what == "push":
        out = push(args.fences, args.points, args.devices, args.json, seed=args.seed,
                   fences_per_farm=args.fences_per_farm, plot=not args.no_plot, command=cmd,
                   keep_stack=args.keep_stack, rate=args.rate, tracks=args.tracks, drain=not args.no_drain)
    elif args.what == "failover":
        from loadgen.bench_failover import failover
        out = failover(args.rate, args.devices, args.fences, args.json, steady_s=args.steady_seconds,
                       seed=args.seed, plot=not args.no_plot, command=cmd)
    elif args.what == "pull":
        out = pull(args.fences, args.devices, args.seconds, args.json, seed=args.seed,
                   connections=args.connections, client=args.client, fences_per_farm=args.fences_per_farm,
                   plot=not args.no_plot, command=cmd, keep_stack=args.keep_stack, streams=args.streams)
    else:
        from loadgen.bench_report import write_report
        path = write_report(Path(args.docs))
        print(path)
        return 0
    print(json.dumps({k: out[k] for k in out if k not in ("machine", "stack", "produce")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
