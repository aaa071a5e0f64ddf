"""The elastic loop: planner units, live slot migration on the fixture's Redis Cluster, and a small skew
scenario through the real job (routing versions published while the query keeps running)."""
from __future__ import annotations

import numpy as np
import orjson

from fencing.elastic import controller as elastic, slots
from fencing.stream import routing
from fencing.model import keys
from fencing.model.heartbeat import Heartbeat, PartitionStats
from fencing.elastic.controller import ElasticConfig
from fencing.elastic.planners import plan
from fencing.stream.shedding import shed_reports


def _table(partitions: int = 6, **kw) -> routing.RoutingTable:
    slot_node = np.zeros(16384, np.uint8)
    slot_node[5461:10923], slot_node[10923:] = 1, 2
    return routing.RoutingTable(0, partitions, slot_node, ("a:1", "b:2", "c:3"), **kw)


def _imbalance(loads) -> float:
    loads = np.asarray(loads, float)
    return loads.max() / loads.mean()


def test_pairwise_and_binpack_balance_groups():
    table = _table()
    groups = {f"g{i}": 100.0 for i in range(12)}
    routes = {g: 0 for g in groups}          # everything on partition 0: max/mean = 6
    table = table.evolve(routes=routes)
    for planner in ("pairwise", "binpack"):
        result = plan(table, groups, {}, ElasticConfig(planner=planner))
        assert _imbalance(result.predicted) <= 1.0 + 1e-9, (planner, result.predicted)
        assert {m["from"] for m in result.moves} == {0}


def test_hot_group_is_split_by_device_buckets_and_merged_back():
    table = _table()
    children = {f"#{i}": 50.0 for i in range(12)}
    groups = {"hot": 600.0, **{f"g{i}": 20.0 for i in range(5)}}
    result = plan(table, groups, {"hot": children}, ElasticConfig())
    assert result.split == ["hot"]
    assert _imbalance(result.predicted) <= 1.3
    parts = set(result.splits["hot"].values())
    assert len(parts) >= 5                   # the children spread over the partitions
    # routing by bucket: prepare uses partition_of_child(group, bucket_of(device key))
    split_table = table.evolve(splits=result.splits, routes=result.routes)
    assert split_table.partition_of_child("hot", "#0") == result.splits["hot"]["#0"]
    assert routing.bucket_of("farm/cow-1") == routing.bucket_of("farm/cow-1")
    assert len({routing.bucket_of(f"f/d{i}") for i in range(2000)}) == routing.SPLIT_BUCKETS
    # cold again: merged back, no flapping while balanced
    cold = plan(split_table, {"hot": 10.0, **{f"g{i}": 100.0 for i in range(5)}},
                {"hot": {"#0": 10.0}}, ElasticConfig())
    assert cold.merged == ["hot"] and "hot" not in cold.splits


def test_hysteresis_no_action_when_balanced(stack):
    ctl = elastic.Controller(stack.redis, ElasticConfig(enabled=True, min_points=10))
    table = routing.load(stack.redis)
    n = table.partitions
    beat = Heartbeat(batch_id=10 ** 9, time=0, points=60 * n, routing_version=table.version, duration_s=0.1,
                     partitions=[PartitionStats(p, points=60, groups={f"x{p}": 60}) for p in range(n)])
    ctl(beat)
    assert ctl.steps == 0 and routing.load(stack.redis).version == table.version


def test_slot_migration_moves_keys_live(stack):
    redis = stack.redis
    group = "86elastic-test"
    slot = routing.group_slot(group)
    redis.hset(keys.group_fences(group), "u1", "x")
    redis.hset(keys.group_state(group), "d1", "y")
    before = slots.owner(redis, slot)
    nodes = slots.masters(redis)
    target = next(a for a in sorted(nodes) if a != before.address)
    done = slots.migrate_slots(redis, {slot: target})
    assert done[0]["keys"] >= 2 and done[0]["to"] == target
    assert slots.owner(redis, slot).address == target
    assert redis.hget(keys.group_fences(group), "u1") == "x"
    assert redis.hget(keys.group_state(group), "d1") == "y"
    slots.migrate_slots(redis, {slot: before.address})    # and back
    assert slots.owner(redis, slot).address == before.address
    assert routing.slot_map(redis)[1] == routing.load(redis).nodes


def test_small_skew_through_the_real_job(stack, tmp_path):
    from loadgen.elastic_skew import run_skew
    redis = stack.redis
    v0 = routing.load(redis).version
    try:
        result = run_skew(tmp_path / "skew.json", devices=300, steps=40, rate=3000.0, compare_points=3000,
                          env_overrides=stack.env, private=False, timeout=90)
    finally:
        redis.set(elastic.CONFIG_KEY, orjson.dumps({"enabled": True}))
        table = routing.load(redis)
        routing.publish(redis, table.evolve(routes={}, splits={}, aligned=True, shed=False))
    assert routing.load(redis).version > v0 + 2         # routing changed while the query ran
    assert result["query_restarts"] == 0
    assert result["lost"] == 0 and result["duplicated"] == 0
    assert result["controller_steps"] >= 1
    assert result["cross_shard_calls_aligned"] <= result["cross_shard_calls_unaligned"] / 2
    assert (tmp_path / "skew.png").exists()


def _prepared(reports, device_farm):
    """The columns shed_reports reads, as the prepare stage makes them."""
    import pyarrow as pa

    from fencing.model.h3util import cells_for_points, cells_to_strs, parent
    cells = cells_for_points(reports["lat"].to_numpy(), reports["lon"].to_numpy(), keys.FENCE_RES)
    return pa.table({"farm_id": [device_farm[d] for d in reports["device_id"]],
                     "device_id": reports["device_id"].tolist(), "ts": reports["ts"].to_numpy(),
                     "lat": reports["lat"].to_numpy(float), "lon": reports["lon"].to_numpy(float),
                     "cell": cells.view(np.int64), "grp": cells_to_strs(parent(cells, keys.GROUP_RES))})


def test_shedding_never_drops_a_report_that_could_produce_an_event(stack):
    """Load shedding: (1) the predicate on real state (devices' states in Redis, the real fence cache): it
    sheds reports, and none of them is a report at which the simulated tracks produce an event; (2)
    shedding forced on (routing.shed + elastic config "shed": "on") through the real job: every expected
    event is still there exactly once (a shed report that could produce an event would show as lost)."""
    import pandas as pd

    from loadgen.elastic_skew import observed_events, register, setup_farms, stream_and_wait
    from loadgen.herd import SimConfig, simulate
    from loadgen.reference import expected_events
    from loadgen.truth import reconcile
    redis = stack.redis
    sim = simulate(SimConfig(seed=11, farms=2, fences_per_farm=4, devices=200, steps=30, silent_fraction=0.0))
    # The simulated paddocks are small (~0.15 km²): every animal grazes in a paddock's boundary cells, so
    # none of its reports is sheddable. Add what shedding is for: a perimeter fence around each farm, 1.5 km
    # wide of it, and 30 idle animals per farm standing ~0.6-1.3 km off the paddocks, inside the perimeter.
    from loadgen.herd import Fence
    idle = []
    t0 = int(sim.reports["ts"].min())
    for farm in sim.farms:
        mine = sim.reports[sim.reports["device_id"].map(sim.device_farm) == farm.farm_id]
        x0, y0 = float(mine["lon"].min()) - 0.02, float(mine["lat"].min()) - 0.015
        x1, y1 = float(mine["lon"].max()) + 0.02, float(mine["lat"].max()) + 0.015
        feature = {"type": "Feature", "properties": {"name": "perimeter"}, "geometry": {
            "type": "Polygon", "coordinates": [[[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]]}}
        sim.fences.append(Fence.from_feature(feature, f"perimeter-{farm.farm_id}", farm.farm_id))
        rng = np.random.default_rng(len(idle))
        for k in range(30):
            device = f"idle-{farm.farm_id}-{k}"
            sim.device_farm[device] = farm.farm_id
            lon = float(mine["lon"].max()) + 0.008 + 0.0003 * k
            lat = float(mine["lat"].mean())
            for step in range(30):
                idle.append({"device_id": device, "ts": t0 + step * 30_000 + 97 * k,
                             "lat": lat + rng.normal(0, 2e-5), "lon": lon + rng.normal(0, 2e-5), "battery": 90.0})
    prefix = "shed-"
    farm_ids, fences = setup_farms(redis, sim, prefix)
    reports = pd.concat([sim.reports, pd.DataFrame(idle)], ignore_index=True).sort_values("ts", kind="stable")
    reports["device_id"] = prefix + reports["device_id"].astype(str)
    device_farm = {prefix + d: farm_ids[f] for d, f in sim.device_farm.items()}
    register(redis, device_farm)
    expected = expected_events(reports, fences, device_farm)
    first = (reports["ts"] < reports["ts"].min() + 3 * 30_000).to_numpy()   # ~3 reports per device
    rest = reports[~first]
    try:
        redis.set(elastic.CONFIG_KEY, orjson.dumps({"enabled": False, "shed": "off"}))
        stream_and_wait(redis, stack.kafka_bootstrap, reports[first], None, 60)    # device states exist now

        # (1) the predicate, on the rest as one batch (many reports per device), against the real state
        table = routing.load(redis)
        prepared = _prepared(rest, device_farm)
        kept, n_shed = shed_reports(redis, table, prepared, frozenset())
        idle_rest = int(rest["device_id"].str.startswith(prefix + "idle-").sum())
        assert n_shed >= 0.8 * idle_rest, (n_shed, idle_rest)
        kept_keys = set(zip(kept.column("device_id").to_pylist(), kept.column("ts").to_pylist()))
        shed_keys = set(zip(rest["device_id"], rest["ts"].tolist())) - kept_keys
        event_keys = set(zip(expected["device_id"], expected["ts"].astype("int64").tolist()))
        assert len(event_keys & set(zip(rest["device_id"], rest["ts"].tolist()))) > 0
        assert not shed_keys & event_keys                             # no event-producing report shed
        last = rest.groupby("device_id")["ts"].max()
        assert not shed_keys & set(zip(last.index, last.tolist()))    # a device's last report is kept

        # (2) through the job, shedding forced on
        redis.set(elastic.CONFIG_KEY, orjson.dumps({"enabled": False, "shed": "on"}))
        routing.publish(redis, table.evolve(routes={}, splits={}, shed=True))
        before, after = stream_and_wait(redis, stack.kafka_bootstrap, rest, None, 60)
        assert routing.load(redis).shed
    finally:
        redis.set(elastic.CONFIG_KEY, orjson.dumps({"enabled": True}))
        table = routing.load(redis)
        routing.publish(redis, table.evolve(routes={}, splits={}, shed=False))
    shed_job = after.shed_total - before.shed_total
    print(f"shed: predicate {n_shed} of {len(rest)} reports (idle animals' {idle_rest}), job {shed_job}")
    rec = reconcile(expected, observed_events(redis, farm_ids.values()))
    assert rec["events"] > 0
    assert rec["lost"] == 0 and rec["duplicated"] == 0 and rec["unexpected"] == 0, (rec, shed_job)
    assert shed_job > 0, "the job shed nothing although routing.shed was on"


def test_shedding_that_yields_little_is_switched_off_and_held_off(stack):
    """Auto shedding: on by lag, off when a window where every batch shed dropped < shed_min_yield of
    its reports, and not back on (whatever the lag) for shed_holdoff windows."""
    redis = stack.redis
    cfg = ElasticConfig(enabled=False, min_points=100, shed_lag=1000, unshed_lag=10, shed_min_yield=0.05,
                        shed_holdoff=2)
    ctl = elastic.Controller(redis, cfg)
    start = routing.load(redis)
    routing.publish(redis, start.evolve(shed=False))

    def window(points: int, shed: int, lag: int) -> elastic.Window:
        v = routing.load(redis).version
        return elastic.Window(1, 1, 0.0, points, [points], [0.1], {}, {}, v, 0, 0, shed, lag, v)

    try:
        ctl.analyze_and_act(window(1000, 0, 5000), cfg)
        assert routing.load(redis).shed                                  # lag → on
        ctl.analyze_and_act(window(1000, 200, 5000), cfg)
        assert routing.load(redis).shed                                  # 17% shed: it pays, stays on
        ctl.analyze_and_act(window(1000, 10, 5000), cfg)
        assert not routing.load(redis).shed                              # 1%: off
        for _ in range(2):
            ctl.analyze_and_act(window(1000, 0, 5000), cfg)
            assert not routing.load(redis).shed                          # held off despite the lag
        ctl.analyze_and_act(window(1000, 0, 5000), cfg)
        assert routing.load(redis).shed                                  # hold-off over: on by lag again
    finally:
        routing.publish(redis, routing.load(redis).evolve(shed=False))


def test_a_replayed_batch_sheds_from_the_state_before_it(stack):
    """Shedding reads device state with the process stage's reader: on a replay of the batch that
    wrote a device's record, the state BEFORE that batch. Here the batch confirmed the cow inside the
    paddock; replayed, a report deep inside must not be shed (from the state before, it is the ENTER),
    while for any later batch the same report changes nothing and is shed."""
    import pandas as pd

    from fencing.model import keys as model_keys
    from tests.farmkit import Farm
    farm = Farm(stack, "replay shed")
    lon0, lat0 = 8.60, 47.20
    farm.fence({"type": "Polygon", "coordinates": [[[lon0, lat0], [lon0 + 0.02, lat0], [lon0 + 0.02, lat0 + 0.015],
                                                    [lon0, lat0 + 0.015], [lon0, lat0]]]})
    farm.device("rs-cow")
    centre = (lon0 + 0.01, lat0 + 0.0075)
    stamps = farm.report("rs-cow", centre, centre)                     # one batch: ENTER confirmed
    farm.wait_seen("rs-cow", stamps[-1])
    assert [e["type"] for e in farm.events(device_id="rs-cow")] == ["enter"]
    dkey = f"{farm.farm_id}/rs-cow"
    # two reports: a device's last report of a batch is never shed, the one before it may be
    report = pd.DataFrame({"device_id": ["rs-cow"] * 2, "ts": [stamps[-1] + 10_000, stamps[-1] + 20_000],
                           "lat": [centre[1]] * 2, "lon": [centre[0]] * 2})
    prepared = _prepared(report, {"rs-cow": farm.farm_id})
    grp = prepared.column("grp")[0].as_py()
    record = orjson.loads(stack.redis.hget(model_keys.group_state(grp), dkey))   # written by that batch
    assert record["s"] and record["b"].count(":") == 1, record
    table = routing.load(stack.redis)
    _, shed_on_replay = shed_reports(stack.redis, table, prepared, frozenset(), record["b"])
    _, shed_later = shed_reports(stack.redis, table, prepared, frozenset(), record["b"] + "0")
    assert (shed_on_replay, shed_later) == (0, 1)
