"""`herdfence elastic status` and `herdfence elastic skew --json FILE` (the elastic loop's scenario).

skew: a private embedded stack (own HERDFENCE_HOME and ports), a simulated farm region whose herd
gathers at a hot spot that moves between farms, streamed into gps.reports while the controller acts;
then the same load twice more with the controller paused, once with aligned and once with unaligned
routing, to count cross-node Redis calls. Every figure in the JSON is measured from the job's
heartbeats, the controller's windows and the events in Redis, reconciled with loadgen.truth.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from fencing.model.heartbeat import Heartbeat, read_heartbeat, recent_heartbeats

# Redis 16101-16103 (cluster bus +10000 = 26101-26103): clear of `bench fences` (11101.., bus 21101..) and
# below the ephemeral range, so neither can take the other's port.
SKEW_PORTS = {"HERDFENCE_EMBEDDED_KAFKA_PORT": "21092", "HERDFENCE_EMBEDDED_REDIS_PORT": "16101",
              "HERDFENCE_API_PORT": "21800"}


def _say(msg: str) -> None:
    print(f"elastic: {msg}", file=sys.stderr, flush=True)


# --- status ----------------------------------------------------------------------------------------
def status(redis) -> dict:
    from fencing.elastic import controller as elastic
    from fencing.stream import routing
    table = routing.load(redis)
    raw = redis.get(elastic.STATUS_KEY)
    beat = read_heartbeat(redis) or Heartbeat(batch_id=-1, time=0.0)
    return {"routing": {**table.spec(), "nodes": list(table.nodes)},
            "controller": orjson.loads(raw) if raw else None,
            "last_batch": {k: getattr(beat, k) for k in ("batch_id", "points", "duration_s", "lag", "shed_total",
                                                         "routing_version")},
            "partition_points": [p.points for p in beat.partitions]}


# --- the scenario ----------------------------------------------------------------------------------
def sim_config(devices: int, steps: int, seed: int = 7):
    from loadgen.herd import SimConfig
    # 9 farms 4 km apart spread over several res-6 cell groups; 45% of the animals are driven to a hot
    # spot (spread over ~1.5 km, i.e. a few res-7 cells) that moves to another farm every 20 minutes
    return SimConfig(seed=seed, farms=9, fences_per_farm=4, devices=devices, steps=steps, skew=0.45,
                     farm_spacing_m=4000.0, hotspot_radius_m=1500.0, hotspot_leg_s=1200.0,
                     silent_fraction=0.0)


def setup_farms(redis, sim, prefix: str) -> tuple[dict[str, str], list]:
    """Farms, fences and devices straight into Redis (api.tenancy / fencing.model.fence_store).
    Returns sim farm id → real farm id and the fences with their real farm ids."""
    from dataclasses import replace

    from api.tenancy import create_farm
    from fencing.model.fence_store import save_fence, validate_feature
    farm_ids = {}
    for farm in sim.farms:
        farm_ids[farm.farm_id], _ = create_farm(redis, f"{prefix} {farm.name}")
    fences = []
    for f in sim.fences:
        save_fence(redis, farm_ids[f.farm_id], f.fence_id, validate_feature(f.geojson))
        fences.append(replace(f, farm_id=farm_ids[f.farm_id]))
    return farm_ids, fences


def register(redis, devices: dict[str, str]) -> None:
    from fencing.model import keys
    pipe = redis.pipeline()
    for device, farm_id in devices.items():
        pipe.hset(keys.farm_devices(farm_id), device, orjson.dumps({"herd": "skew", "created": 0}))
        pipe.hset(keys.DEVICE_REGISTRY, device, farm_id)
    pipe.execute()


def beats_since(redis, batch_id: int) -> list[Heartbeat]:
    return sorted((b for b in recent_heartbeats(redis) if b.batch_id > batch_id), key=lambda b: b.batch_id)


def last_beat(redis) -> Heartbeat:
    return read_heartbeat(redis) or Heartbeat(batch_id=-1, time=0.0)


def stream_and_wait(redis, bootstrap: str, df: pd.DataFrame, rate: float, timeout: float) -> tuple[Heartbeat, Heartbeat]:
    """Produce df at `rate` rows/s and wait until the job processed all of it; (beat before, after)."""
    from loadgen.kafka_writer import write_reports
    before = last_beat(redis)
    result = {}
    writer = threading.Thread(target=lambda: result.setdefault(
        "stats", write_reports(bootstrap, df, rate=rate, progress=False)), daemon=True)
    writer.start()
    want = before.handled_total + len(df)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        beat = last_beat(redis)
        if not writer.is_alive() and beat.handled_total >= want:
            return before, beat
        time.sleep(0.5)
    raise RuntimeError(f"the job did not process the {len(df)} reports within {timeout:.0f} s")


def observed_events(redis, farm_ids) -> pd.DataFrame:
    from fencing.model import keys
    rows = []
    for farm_id in farm_ids:
        for raw in redis.hvals(keys.event_data(farm_id)):
            e = orjson.loads(raw)
            rows.append({k: e.get(k) for k in ("device_id", "fence_id", "type", "ts")})
    return pd.DataFrame(rows, columns=["device_id", "fence_id", "type", "ts"])


BAR = 1.3

DEFINITIONS = {
    "window": "the controller's analysis unit: consecutive micro-batches until >= min_points points "
              "(one micro-batch of ~3-4k points in this scenario); max/mean = the most loaded partition's "
              "points over the mean of the partitions' points in the window",
    "max_over_mean_before": "max/mean of the window that triggered the first controller step",
    "steps_to_balance": "controller steps executed, counting the first, before the first window whose "
                        "max/mean <= 1.3 (the step number in force during that window); null if never",
    "max_over_mean_after": "p90 of max/mean over ALL windows strictly after that first balanced window, to "
                           "the end of the skewed stream, while the hot spot keeps moving (not the first "
                           "good window); see also _median, _max and windows_after_over_bar",
    "reconfig_stall_ms": "worst step: controller execute time (plan, slot migration, publish: no batch "
                         "runs meanwhile) plus the slowest task's reload of the moved groups' fences in the "
                         "first micro-batch on the new routing (timed in the task)",
    "reconfig_stall_ms_batch_estimate": "worst step: execute time plus the first micro-batch's duration on the "
                                        "new routing over the median of the last 20 batches; includes "
                                        "ordinary batch-to-batch noise (compare batch_seconds_median/p90)",
    "cross_shard_calls_*": "Redis commands on group keys sent to a master other than the one aligned with "
                           "the task's partition, same 20k-report load, controller paused, no splits",
    "moves_reverted": "moves that put an item back on the partition it left in the previous step (flapping)",
}


def summarize(windows: list[dict], decisions: list[dict], trigger: float = BAR) -> dict:
    """The scenario's balance figures from the controller's windows (oldest first); see DEFINITIONS."""
    imb = [w["imbalance"] for w in windows]
    acted = [w for w in windows if w.get("action")]
    out = {"steps_to_balance": None, "max_over_mean_before": max(imb, default=None),
           "max_over_mean_after": None, "max_over_mean_after_median": None, "max_over_mean_after_max": None,
           "windows_after": 0, "windows_after_over_bar": 0, "balanced_at_window": None}
    if not acted:
        return out
    first = acted[0]
    out["max_over_mean_before"] = first["imbalance"]
    later = [w for w in windows if w["end_batch"] > first["end_batch"]]
    balanced = next((w for w in later if w["imbalance"] <= trigger), None)
    if balanced is None:
        out["max_over_mean_after"] = later[-1]["imbalance"] if later else None
        return out
    # the step in force during the balanced window = steps taken up to the window before it
    out["steps_to_balance"] = max(w["step"] for w in windows if w["end_batch"] < balanced["end_batch"]) \
        - first["step"] + 1
    out["balanced_at_window"] = balanced["end_batch"]
    after = [w["imbalance"] for w in windows if w["end_batch"] > balanced["end_batch"]]
    if after:
        out["max_over_mean_after"] = round(float(np.percentile(after, 90)), 3)
        out["max_over_mean_after_median"] = round(float(np.median(after)), 3)
        out["max_over_mean_after_max"] = round(max(after), 3)
        out["windows_after"] = len(after)
        out["windows_after_over_bar"] = sum(x > trigger for x in after)
    else:
        out["max_over_mean_after"] = balanced["imbalance"]
    return out


def moves_reverted(decisions: list[dict]) -> int:
    """Moves of step k+1 that send an item back where step k took it from (flapping)."""
    reverted = 0
    for prev, cur in zip(decisions, decisions[1:]):
        left = {m["item"]: m["from"] for m in prev.get("moves") or []}
        reverted += sum(1 for m in cur.get("moves") or [] if left.get(m["item"]) == m["to"])
    return reverted


def plot(windows: list[dict], decisions: list[dict], path: Path) -> None:
    from loadgen.plots import _plt
    plt = _plt() if windows else None
    if plt is None:
        return
    t0 = windows[0]["time"]
    t = [w["time"] - t0 for w in windows]
    loads = np.array([w["partition_points"] for w in windows if len(w["partition_points"])
                      == len(windows[0]["partition_points"])])
    t = [w["time"] - t0 for w in windows if len(w["partition_points"]) == len(windows[0]["partition_points"])]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    share = loads / np.maximum(loads.sum(axis=1, keepdims=True), 1)
    for p in range(loads.shape[1]):
        ax1.plot(t, share[:, p], label=f"partition {p}")
    ax1.set_ylabel("share of window points")
    ax1.legend(ncol=3, fontsize=8)
    ax2.plot(t, [w["imbalance"] for w in windows][:len(t)], color="k", label="max/mean")
    ax2.axhline(1.3, color="g", ls="--", lw=0.8)
    for d in decisions:
        ax2.axvline(d["time"] - t0, color="r", lw=0.8)
    ax2.set_ylabel("max/mean (red: controller steps)")
    ax2.set_xlabel("seconds")
    fig.suptitle("herdfence elastic skew: load per partition over time")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run_skew(out: Path, devices: int = 1000, steps: int = 80, rate: float = 3000.0,
             compare_points: int = 20_000, env_overrides: dict | None = None, private: bool = True,
             timeout: float = 240.0, planner: str = "binpack") -> dict:
    """The scenario. private=True: start and stop a private embedded stack; False: use the stack
    described by the current environment (the test suite's)."""
    from deploy import stack
    from deploy.procs import read_record
    from fencing.config import load_settings
    from fencing.elastic import controller as elastic
    from fencing.stream import routing
    from fencing.model.redis_conn import cluster
    from loadgen.herd import simulate
    from loadgen.reference import expected_events  # inferred and late events too
    from loadgen.truth import reconcile

    if private:
        home = Path(tempfile.mkdtemp(prefix="herdfence-elastic-"))
        os.environ.update({**SKEW_PORTS, "HERDFENCE_HOME": str(home), "HERDFENCE_TRIGGER": "300 milliseconds",
                           "HERDFENCE_MAX_OFFSETS_PER_TRIGGER": "4000", "HERDFENCE_ELASTIC": "1"})
        for var in ("HERDFENCE_KAFKA", "HERDFENCE_REDIS", "HERDFENCE_SPARK_MASTER"):
            os.environ.pop(var, None)
    os.environ.update(env_overrides or {})
    settings = load_settings()
    started = time.time()
    try:
        if private:
            _say(f"starting a private stack in {settings.home}")
            stack.up(settings, detach=True)
        redis = cluster(*settings.redis_node)
        redis.set(elastic.CONFIG_KEY, orjson.dumps({"enabled": True, "planner": planner}))
        sim = simulate(sim_config(devices, steps))
        prefix = f"e{int(time.time()) % 100000}-"
        farm_ids, fences = setup_farms(redis, sim, prefix)
        reports = sim.reports.copy()
        reports["device_id"] = prefix + reports["device_id"].astype(str)
        device_farm = {prefix + d: farm_ids[f] for d, f in sim.device_farm.items()}
        register(redis, device_farm)
        table = routing.load(redis)
        routing.publish(redis, table.evolve(routes={}, splits={}, aligned=True, shed=False))
        restarts0 = (read_record(settings, "job").restarts if read_record(settings, "job") else 0)
        _say(f"streaming {len(reports)} skewed reports at {rate:.0f}/s")
        main_before, main_after = stream_and_wait(redis, settings.kafka_bootstrap, reports, rate, timeout)
        windows = [orjson.loads(r) for r in redis.lrange(elastic.HISTORY_KEY, 0, -1)][::-1]
        windows = [w for w in windows if main_before.batch_id < w["end_batch"] <= main_after.batch_id]
        # decisions: the status holds the stall figures (filled in one beat later), the list holds them all
        ctl = orjson.loads(redis.get(elastic.STATUS_KEY) or b"{}")
        stall = {d["version"]: d.get("stall_ms") for d in ctl.get("decisions", []) if "step" in d}
        stall_batch = {}
        for v, raw in (redis.hgetall(elastic.STALLS_KEY) or {}).items():
            rec = orjson.loads(raw)
            stall[int(v)], stall_batch[int(v)] = rec["stall_ms"], rec["stall_ms_batch"]
        decisions = [orjson.loads(r) for r in redis.lrange(elastic.DECISIONS_KEY, 0, -1)][::-1]
        for d in decisions:
            if stall.get(d.get("version")) is not None:
                d["stall_ms"] = stall[d["version"]]
                d["stall_ms_batch"] = stall_batch.get(d["version"])
        decisions = [d for d in decisions if "step" in d
                     and main_before.batch_id < d.get("batch_id", main_before.batch_id + 1)]

        # aligned vs unaligned on the same load, controller paused
        redis.set(elastic.CONFIG_KEY, orjson.dumps({"enabled": False}))
        calls = {}
        compare = reports.iloc[:compare_points]
        all_reports, all_farm = [reports], dict(device_farm)
        for mode in ("aligned", "unaligned"):
            table = routing.load(redis)
            routing.publish(redis, table.evolve(routes={}, splits={}, aligned=(mode == "aligned")))
            load = compare.copy()
            load["device_id"] = load["device_id"] + f"-{mode[0]}"
            farms = {d + f"-{mode[0]}": all_farm[d] for d in compare["device_id"].unique()}
            register(redis, farms)
            all_farm.update(farms)
            all_reports.append(load)
            before, after = stream_and_wait(redis, settings.kafka_bootstrap, load, rate * 2, timeout)
            calls[mode] = {"local": after.redis_local_total - before.redis_local_total,
                           "cross": after.redis_cross_total - before.redis_cross_total}
        _say(f"redis calls {calls}")

        expected = expected_events(pd.concat(all_reports, ignore_index=True), fences, all_farm)
        observed = observed_events(redis, farm_ids.values())
        rec = reconcile(expected, observed)
        job_rec = read_record(settings, "job")
        restarts = (job_rec.restarts if job_rec else 0) - restarts0
        summary = summarize(windows, decisions)
        stalls = [d.get("stall_ms") if d.get("stall_ms") is not None else d.get("execute_ms") for d in decisions]
        stalls_batch = [d.get("stall_ms_batch") for d in decisions if d.get("stall_ms_batch") is not None]
        # context for the stall: how much micro-batch durations vary anyway on this machine
        durations = [b.duration_s for b in beats_since(redis, main_before.batch_id)
                     if b.batch_id <= main_after.batch_id and b.points]
        result = {
            "partitions": routing.load(redis).partitions,
            "steps_to_balance": summary["steps_to_balance"],
            "max_over_mean_before": summary["max_over_mean_before"],
            "max_over_mean_after": summary["max_over_mean_after"],
            "reconfig_stall_ms": max(stalls) if stalls else 0.0,
            "reconfig_stall_ms_median": float(np.median(stalls)) if stalls else 0.0,
            "reconfig_stall_ms_batch_estimate": max(stalls_batch) if stalls_batch else None,
            "execute_ms_max": max((d.get("execute_ms", 0.0) for d in decisions), default=0.0),
            "batch_seconds_median": round(float(np.median(durations)), 3) if durations else None,
            "batch_seconds_p90": round(float(np.percentile(durations, 90)), 3) if durations else None,
            "cross_shard_calls_aligned": calls["aligned"]["cross"],
            "cross_shard_calls_unaligned": calls["unaligned"]["cross"],
            "query_restarts": restarts,
            "lost": rec["lost"],
            "duplicated": rec["duplicated"],
            # context
            "events": rec["events"], "unexpected": rec["unexpected"], "points": int(len(reports)),
            "max_over_mean_after_median": summary["max_over_mean_after_median"],
            "max_over_mean_after_max": summary["max_over_mean_after_max"],
            "windows_after": summary["windows_after"],
            "windows_after_over_bar": summary["windows_after_over_bar"],
            "controller_steps": len(decisions), "planner": planner,
            "moves_total": sum(d.get("n_moves", 0) for d in decisions),
            "moves_reverted": moves_reverted(decisions),
            "slots_migrated": sum(len(d.get("slots", [])) for d in decisions),
            "redis_calls": calls, "shed_total": main_after.shed_total,
            "max_over_mean_timeline": [w["imbalance"] for w in windows],
            "step_timeline": [w["step"] for w in windows],
            "window_points": [w["points"] for w in windows],
            "definitions": DEFINITIONS,
            "decisions": [{k: d.get(k) for k in ("step", "version", "why", "imbalance", "predicted", "n_moves",
                                                 "split", "merged", "execute_ms", "stall_ms", "stall_ms_batch")}
                          | {"slots": len(d.get("slots", []))} for d in decisions],
            "seconds": round(time.time() - started, 1),
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        plot(windows, decisions, out.with_suffix(".png"))
        return result
    finally:
        if private:
            _say("stopping the private stack")
            stack.down(settings)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="herdfence elastic")
    sub = p.add_subparsers(dest="cmd", required=True)
    sk = sub.add_parser("skew", help="the skew scenario on a private stack")
    sk.add_argument("--json", required=True, type=Path)
    sk.add_argument("--devices", type=int, default=1000)
    sk.add_argument("--steps", type=int, default=80)
    sk.add_argument("--rate", type=float, default=3000.0)
    sk.add_argument("--planner", choices=("binpack", "pairwise"), default="binpack")
    st = sub.add_parser("status", help="routing version, per-partition load, last decisions")
    st.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "skew":
        result = run_skew(args.json, args.devices, args.steps, args.rate, planner=args.planner)
        print(json.dumps({k: result[k] for k in list(result)[:10]}))
        return 0
    from fencing.config import load_settings
    from fencing.model.redis_conn import cluster
    try:
        st = status(cluster(*load_settings().redis_node))
    except Exception as e:  # noqa: BLE001 - no stack: say so, no traceback
        print(f"herdfence elastic: cannot read the routing state ({e}); is the stack up?", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(st))
    else:
        r = st["routing"]
        print(f"routing v{r['version']}  partitions={r['partitions']}  aligned={r['aligned']}  shed={r['shed']}"
              f"  routes={len(r['routes'])}  splits={list(r['splits'])}")
        print(f"partition points (last batch): {st['partition_points']}")
        for d in ((st["controller"] or {}).get("decisions") or [])[-5:]:
            print(f"  step {d.get('step')} v{d.get('version')}: {d.get('why')} moves={d.get('n_moves')} "
                  f"split={d.get('split')} stall_ms={d.get('stall_ms')}")
    return 0
