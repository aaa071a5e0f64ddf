import numpy as np, orjson, pandas as pd
from collections import Counter
from fencing import elastic, keys, routing
from tests.test_elastic import _prepared


def test_debug(stack):
    from fencing.elastic_cli import register, setup_farms, stream_and_wait
    from fencing.fence_cache import process_cache
    from fencing.transitions import DeviceState
    from loadgen.herd import SimConfig, simulate
    redis = stack.redis
    sim = simulate(SimConfig(seed=11, farms=2, fences_per_farm=4, devices=200, steps=30, silent_fraction=0.0))
    prefix = "dbg-"
    farm_ids, fences = setup_farms(redis, sim, prefix)
    reports = sim.reports.copy()
    reports["device_id"] = prefix + reports["device_id"].astype(str)
    device_farm = {prefix + d: farm_ids[f] for d, f in sim.device_farm.items()}
    register(redis, device_farm)
    first = (reports["ts"] < reports["ts"].min() + 3 * 30_000).to_numpy()
    stream_and_wait(redis, stack.kafka_bootstrap, reports[first], None, 60)
    rest = reports[~first]
    batch = _prepared(rest, device_farm)
    frame = batch.to_pandas()
    frame["dkey"] = frame["farm_id"] + "/" + frame["device_id"]
    cache = process_cache()
    groups = sorted(frame["grp"].unique())
    cache.refresh(redis, groups)
    print("groups", groups, "cached uids", len(cache._cells), "rules", len(cache.rules))
    boundary, interior = set(), {}
    for uid, per_group in cache._cells.items():
        for g in groups:
            cells = per_group.get(g)
            if cells is None:
                continue
            boundary.update(cells[1].tolist())
            for c in cells[0].tolist():
                interior.setdefault(c, set()).add(uid)
    print("boundary", len(boundary), "interior", len(interior))
    cells = frame["cell"].to_numpy().astype(np.int64).view(np.uint64).tolist()
    print("sample cells", cells[:3], "sample interior keys", list(interior)[:3], list(boundary)[:3])
    reasons = Counter()
    for d, sub in frame.groupby("dkey"):
        raw = redis.hget(keys.group_state(sub["grp"].iloc[-1]), d)
        if raw is None:
            reasons["no state"] += 1
            continue
        rec = orjson.loads(raw)
        st = DeviceState.from_dict(rec.get("s"))
        confirmed = set(st.inside_fences())
        if any(s.streak for s in st.fences.values()):
            reasons["streak"] += 1
            continue
        c = int(np.int64(sub["cell"].iloc[0]).view(np.uint64))
        if c in boundary:
            reasons["boundary"] += 1
            continue
        farm = d.partition("/")[0]
        member = {u for u in interior.get(c, ()) if cache.fence_farm.get(u) == farm}
        if member != confirmed:
            reasons["member!=confirmed"] += 1
            if reasons["member!=confirmed"] < 4:
                print("mismatch", d, member, confirmed, list(st.fences)[:3], rec.get("s"))
            continue
        reasons["ok"] += 1
    print(reasons)
    kept, n = elastic.shed_reports(redis, routing.load(redis), batch, frozenset())
    print("shed", n)
    assert False
