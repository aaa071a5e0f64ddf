"""The elastic loop: monitor → analyze → plan → execute, inside the running query (never stopped).

* Monitor: the job calls the controller (BatchProcessor observer) after every micro-batch with its
  heartbeat: per partition points, time, per cell group points, per group per device bucket points
  (attributed as routed: all of a device's reports to the group of its last report), local vs
  cross-node Redis calls, shed reports, and the source lag.
* Analyze: beats are aggregated into windows of >= `min_points` points; the imbalance of a window is
  max/mean of the partitions' points. Hysteresis: act only when the imbalance exceeds `trigger` in
  `confirm` consecutive windows and `cooldown` windows have passed since the last action; the plan
  aims at `settle` (< trigger) so a balanced table is not re-planned on noise.
* Plan: items are cell groups, and the device buckets of split groups (fencing.elastic.routing.SPLIT_BUCKETS).
  A group alone above `split_share` of a partition's fair share is split (its buckets become items); a
  split group that went cold is merged back. Then either pairwise balancing (Borealis: repeatedly move
  the item that best evens the most and least loaded partitions) or bin-packing (HarmonicIO IRM:
  first-fit decreasing into bins of capacity settle x mean, keeping an item in its bin when it fits).
* Execute: move the Redis slots of moved (whole) groups to the master aligned with their new partition
  (fencing.elastic.slots: whole-slot live migration), then publish routing version v+1 with the `moved` groups;
  the next micro-batch routes by it and its tasks drop exactly the moved groups from their caches.
  The controller runs on the driver between two micro-batches, so no task runs during a migration.
* Load shedding (Borealis, semantic): when the source lag exceeds `shed_lag`, routing.shed is set and
  tasks drop reports that provably cannot change any fence state (see `shed_reports`). `shed` in the
  config forces it ("on"/"off"; default "auto").
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass, field, fields

import numpy as np
import orjson
import pyarrow as pa

from fencing.model import keys
from fencing.model.heartbeat import Heartbeat, PartitionStats
from fencing.elastic import routing, slots
from fencing.config import TUNING

MIGRATE_SLOTS = TUNING.migrate_slots
log = logging.getLogger("herdfence.elastic")

STATUS_KEY = "elastic:status"        # JSON: routing version, last window, decisions, totals
HISTORY_KEY = "elastic:history"      # list of JSON windows (newest first), for plots and the scenario
CONFIG_KEY = "elastic:config"        # JSON overrides of ElasticConfig (e.g. {"enabled": false})
DECISIONS_KEY = "elastic:decisions"  # list of JSON decisions (newest first), all of them (status: last 20)
STALLS_KEY = "elastic:stalls"        # hash: routing version → measured reconfiguration stall (ms)
HISTORY_MAX = 5000


@dataclass
class ElasticConfig:
    enabled: bool = True
    planner: str = "binpack"         # "binpack" (HarmonicIO IRM) or "pairwise" (Borealis): docs/architecture.md
    min_points: int = 1500           # a window closes once it has this many points ...
    max_beats: int = 8               # ... or this many beats
    # hysteresis band: act when max/mean exceeds `trigger` (below the 1.3 bar, so a drifting hot spot is
    # re-balanced before it crosses it) and plan down to `settle`; inside the band nothing moves
    trigger: float = 1.2             # act when max/mean exceeds this ...
    confirm: int = 1                 # ... in this many consecutive windows
    settle: float = 1.05             # the plan aims at max/mean <= settle
    cooldown: int = 0                # windows to wait after an action (0: the next window may act)
    split_share: float = 0.9         # split a group whose load exceeds this fraction of the fair share
    merge_share: float = 0.25        # merge a split group back when it falls under this fraction
    max_moves: int = 128             # moves per step (bucket moves are cheap: no slot migration)
    shed: str = "auto"               # "auto": by lag; "on"/"off": forced (tests, operators)
    shed_lag: int = 200_000          # shed when the source lag (records) exceeds this
    unshed_lag: int = 50_000         # stop shedding under this
    # auto: shedding costs the tasks a state read and a cell test per report (~9% of their CPU in a
    # flood); when a window sheds less than this share of its reports that costs more than it saves,
    # so it is switched off and not retried for `shed_holdoff` windows (a herd that moves a lot)
    shed_min_yield: float = 0.05
    shed_holdoff: int = 30

    @classmethod
    def load(cls, redis) -> "ElasticConfig":
        raw = redis.get(CONFIG_KEY)
        cfg = cls()
        if raw:
            for k, v in orjson.loads(raw).items():
                if hasattr(cfg, k):
                    setattr(cfg, k, type(getattr(cfg, k))(v))
        return cfg


# --- plan ------------------------------------------------------------------------------------------
@dataclass
class Plan:
    routes: dict[str, int]
    splits: dict[str, dict[str, int]]
    moves: list[dict] = field(default_factory=list)         # {"item", "from", "to", "load"}
    split: list[str] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    predicted: list[float] = field(default_factory=list)    # partition loads after the plan

    @property
    def moved_groups(self) -> list[str]:
        return sorted({m["item"].partition("/")[0] for m in self.moves} | set(self.split) | set(self.merged))


def current_items(table: routing.RoutingTable, group_load: dict[str, float],
                  child_load: dict[str, dict[str, float]]) -> dict[str, tuple[float, int]]:
    """item → (load, partition). Items: 'group' or 'group/bucket' for split groups."""
    items: dict[str, tuple[float, int]] = {}
    for g, load in group_load.items():
        if g in table.splits:
            children = child_load.get(g) or {}
            rest = load - sum(children.values())
            for c, x in children.items():
                items[f"{g}/{c}"] = (x, table.partition_of_child(g, c))
            if rest > 0:
                items[g] = (rest, table.partition_of(g))
        else:
            items[g] = (load, table.partition_of(g))
    return items


def plan(table: routing.RoutingTable, group_load: dict[str, float], child_load: dict[str, dict[str, float]],
         cfg: ElasticConfig) -> Plan:
    """Split hot groups, merge cold ones, then balance with the configured planner."""
    n = table.partitions
    total = sum(group_load.values())
    fair = total / n if n else 0.0
    routes = dict(table.routes)
    splits = {g: dict(c) for g, c in table.splits.items()}
    result = Plan(routes, splits)
    for g, load in group_load.items():
        if g not in splits and load > cfg.split_share * fair and len(child_load.get(g) or {}) > 1:
            home = table.partition_of(g)
            splits[g] = {c: home for c in child_load[g]}
            result.split.append(g)
    for g in list(splits):
        if group_load.get(g, 0.0) < cfg.merge_share * fair:
            del splits[g]
            result.merged.append(g)
    work = table.evolve(routes=routes, splits=splits)
    items = current_items(work, group_load, child_load)
    loads = np.zeros(n)
    for x, p in items.values():
        loads[p] += x
    assign = {k: p for k, (_, p) in items.items()}
    weight = {k: x for k, (x, _) in items.items()}
    if cfg.planner == "binpack":
        _binpack(assign, weight, loads, fair * cfg.settle, cfg.max_moves)
    else:
        _pairwise(assign, weight, loads, fair * cfg.settle, cfg.max_moves)
    for k, p in assign.items():
        if p != items[k][1]:
            result.moves.append({"item": k, "from": items[k][1], "to": p, "load": round(weight[k], 1)})
            g, _, c = k.partition("/")
            if c:
                splits[g][c] = p
            else:
                routes[g] = p
    result.predicted = loads.round(1).tolist()
    return result


def _pairwise(assign, weight, loads, target, max_moves) -> None:
    """Borealis-style pairwise: move from the most to the least loaded partition the item that best
    evens the pair, until the maximum is under target or no move helps. (Trying other targets adds
    nothing: an item that fits the gap to any partition fits the larger gap to the least loaded one.
    What makes pairwise converge is items small enough — hence device buckets for hot groups.)"""
    for _ in range(max_moves):
        hi, lo = int(np.argmax(loads)), int(np.argmin(loads))
        if loads[hi] <= target:
            return
        gap = loads[hi] - loads[lo]
        best, best_after = None, loads[hi]
        for k, p in assign.items():
            x = weight[k]
            if p != hi or x <= 0 or x >= gap:
                continue
            after = max(loads[hi] - x, loads[lo] + x)
            if after < best_after - 1e-9:
                best, best_after = k, after
        if best is None:
            return
        x = weight[best]
        loads[hi] -= x
        loads[lo] += x
        assign[best] = lo


def _binpack(assign, weight, loads, capacity, max_moves) -> None:
    """HarmonicIO-IRM-style first-fit decreasing into bins of `capacity`, sticky: an item stays in its
    current bin when it fits there; otherwise it goes to the least loaded bin."""
    n = len(loads)
    new = np.zeros(n)
    moves = 0
    for k in sorted(assign, key=lambda k: -weight[k]):
        x, p = weight[k], assign[k]
        if new[p] + x <= capacity or moves >= max_moves:
            new[p] += x
            continue
        q = int(np.argmin(new))
        if new[q] + x < new[p] + x:
            assign[k] = q
            moves += 1
            new[q] += x
        else:
            new[p] += x
    loads[:] = new


# --- the controller ----------------------------------------------------------------------------------
@dataclass
class Window:
    start_batch: int
    end_batch: int
    time: float
    points: int
    partition_points: list[int]
    partition_seconds: list[float]
    groups: dict[str, float]
    children: dict[str, dict[str, float]]
    routing_version: int
    redis_local: int
    redis_cross: int
    shed: int
    lag: int
    first_routing_version: int = 0       # the oldest routing version a beat of the window ran with

    @property
    def imbalance(self) -> float:
        mean = sum(self.partition_points) / max(1, len(self.partition_points))
        return max(self.partition_points) / mean if mean else 0.0


class Controller:
    """The BatchProcessor observer. Call with each heartbeat; acts between micro-batches."""

    def __init__(self, redis, config: ElasticConfig | None = None):
        self.redis = redis
        self.fixed_config = config
        self.beats: list[Heartbeat] = []
        self.over = 0
        self.since_action = 10 ** 6
        self.steps = 0
        self.decisions: deque = deque(maxlen=20)
        self.shed_total = 0
        self.shed_holdoff = 0            # windows left before auto shedding may switch on again
        self.shed_from_version = 0       # routing version that switched shedding on
        self.last_window: Window | None = None
        self.pending_stall: dict | None = None
        self.batch_seconds: deque = deque(maxlen=20)

    def config(self) -> ElasticConfig:
        return self.fixed_config or ElasticConfig.load(self.redis)

    def __call__(self, beat: Heartbeat) -> None:
        try:
            self.observe(beat)
        except Exception:   # noqa: BLE001 - the controller must never fail the query
            log.exception("elastic controller step failed")

    def observe(self, beat: Heartbeat) -> None:
        cfg = self.config()
        self.shed_total += sum(p.shed for p in beat.partitions)
        if self.pending_stall is not None and beat.routing_version == self.pending_stall["version"]:
            # the first batch on the new routing. Stall = the controller's execute time (no batch runs
            # meanwhile) + the slowest task's reload of the moved groups' fences (measured in the task).
            # For comparison, the batch-level estimate: its extra time over the median batch (noisy on a
            # shared machine: it includes ordinary batch-to-batch variation)
            reload_s = max((p.reload_s for p in beat.partitions), default=0.0)
            normal = float(np.median(self.batch_seconds)) if self.batch_seconds else 0.0
            extra = max(0.0, beat.duration_s - normal)
            self.pending_stall["stall_ms"] = round(self.pending_stall["execute_ms"] + 1000 * reload_s, 1)
            self.pending_stall["stall_ms_batch"] = round(self.pending_stall["execute_ms"] + 1000 * extra, 1)
            self.redis.hset(STALLS_KEY, str(self.pending_stall["version"]), orjson.dumps(
                {"stall_ms": self.pending_stall["stall_ms"], "stall_ms_batch": self.pending_stall["stall_ms_batch"]}))
            self.pending_stall = None
        elif beat.points:
            self.batch_seconds.append(beat.duration_s)
        if beat.points:
            self.beats.append(beat)
        pts = sum(b.points for b in self.beats)
        if pts < cfg.min_points and len(self.beats) < cfg.max_beats:
            self._status(cfg)
            return
        if not self.beats:
            self._status(cfg)
            return
        window = self._window(self.beats, beat)
        self.beats = []
        self.last_window = window
        decision = self.analyze_and_act(window, cfg)
        # the window's fields without its per-group counts (not copied first: thousands of groups)
        record = {f.name: getattr(window, f.name) for f in fields(window) if f.name not in ("groups", "children")}
        record.update(imbalance=round(window.imbalance, 3), step=self.steps, action=bool(decision))
        self.redis.lpush(HISTORY_KEY, orjson.dumps(record))
        self.redis.ltrim(HISTORY_KEY, 0, HISTORY_MAX - 1)
        self._status(cfg)

    def _window(self, beats: list[Heartbeat], last: Heartbeat) -> Window:
        n = max((len(b.partitions) for b in beats), default=0)
        pts, secs = [0] * n, [0.0] * n
        groups: dict[str, float] = {}
        children: dict[str, dict[str, float]] = {}
        local = cross = shed = 0
        for b in beats:
            for s in b.partitions:
                p = s.partition
                if p < n:
                    pts[p] += s.points
                    secs[p] += s.seconds
                # group loads as routed (a device's reports count for the group of its last report)
                for g, x in (s.route_groups or s.groups).items():
                    groups[g] = groups.get(g, 0.0) + x
                for g, ch in s.children.items():
                    into = children.setdefault(g, {})
                    for c, x in ch.items():
                        into[c] = into.get(c, 0.0) + x
                local += s.redis_local
                cross += s.redis_cross
                shed += s.shed
        return Window(beats[0].batch_id, beats[-1].batch_id, last.time or time.time(),
                      sum(pts), pts, [round(x, 3) for x in secs], groups, children,
                      last.routing_version, local, cross, shed, last.lag,
                      min(b.routing_version for b in beats))

    def analyze_and_act(self, window: Window, cfg: ElasticConfig) -> dict | None:
        self.since_action += 1
        table = routing.load(self.redis)
        shed, why = self._shed_wanted(table, window, cfg)
        imbalance = window.imbalance
        self.over = self.over + 1 if imbalance > cfg.trigger else 0
        act = (cfg.enabled and self.over >= cfg.confirm and self.since_action > cfg.cooldown
               and len(window.partition_points) == table.partitions)
        if not act:
            self._set_shed(table, shed, why)
            return None
        result = plan(table, window.groups, window.children, cfg)
        predicted = (max(result.predicted) / (sum(result.predicted) / len(result.predicted))
                     if result.predicted and sum(result.predicted) else imbalance)
        if (not result.moves and not result.split and not result.merged) or \
                (not result.moves and predicted > imbalance * 0.95):
            self._set_shed(table, shed, why)
            return None
        return self.execute(table, result, imbalance, predicted, shed, window.end_batch)

    def _shed_wanted(self, table: routing.RoutingTable, window: Window, cfg: ElasticConfig) -> tuple[bool, str]:
        """(shedding on?, why) for this window: forced by config, else by lag and by what it yields."""
        if cfg.shed in ("on", "off"):
            return cfg.shed == "on", f"config shed={cfg.shed}"
        seen = window.points + window.shed
        judged = table.shed and window.first_routing_version >= self.shed_from_version   # every beat shed
        if judged and seen >= cfg.min_points and window.shed < cfg.shed_min_yield * seen:
            self.shed_holdoff = cfg.shed_holdoff
            return False, f"shed {window.shed} of {seen} reports (< {cfg.shed_min_yield:.0%})"
        if self.shed_holdoff > 0:
            self.shed_holdoff -= 1
            return False, "low yield, holding off"
        if window.lag > cfg.shed_lag:
            return True, f"lag {window.lag}"
        if window.lag < cfg.unshed_lag:
            return False, f"lag {window.lag}"
        return table.shed, f"lag {window.lag}"

    def _set_shed(self, table: routing.RoutingTable, shed: bool, why: str) -> None:
        if shed != table.shed:
            routing.publish(self.redis, table.evolve(shed=shed))
            if shed:
                self.shed_from_version = table.version + 1
            self._decide({"why": f"{why} → shed={shed}", "version": table.version + 1})

    def execute(self, table: routing.RoutingTable, result: Plan, imbalance: float, predicted: float,
                shed: bool, batch_id: int | None = None) -> dict:
        started = time.perf_counter()
        # whole groups moved to another partition: their slot goes to the master aligned with it
        slot_moves: dict[int, str] = {}
        for m in result.moves:
            g, _, child = m["item"].partition("/")
            if child or not table.aligned:
                continue
            target = table.nodes[m["to"] % len(table.nodes)]
            slot = routing.group_slot(g)
            if table.nodes[int(table.slot_node[slot])] != target:
                slot_moves[slot] = target
        # Live slot migration (HERDFENCE_MIGRATE_SLOTS=0 turns it off: routing-only moves, the moved groups
        # then cost cross-node calls). A failed move leaves its slot consistent (fencing.elastic.slots), so the
        # routing is published anyway: routing does not depend on where a slot lives.
        migrated, slot_error = [], None
        if MIGRATE_SLOTS:
            try:
                migrated = slots.migrate_slots(self.redis, slot_moves)
            except slots.SlotMigrationError as exc:
                slot_error = str(exc)
                log.warning("elastic: slot migration stopped: %s", exc)
        new = table.evolve(routes=result.routes, splits=result.splits, moved=result.moved_groups, shed=shed)
        routing.publish(self.redis, new)
        if shed and not table.shed:
            self.shed_from_version = new.version
        execute_ms = round(1000 * (time.perf_counter() - started), 1)
        self.steps += 1
        self.since_action = 0
        self.over = 0
        decision = {"step": self.steps, "version": new.version, "time": time.time(), "batch_id": batch_id,
                    "why": f"max/mean {imbalance:.2f} > {self.config().trigger}",
                    "imbalance": round(imbalance, 3), "predicted": round(predicted, 3),
                    "planner": self.config().planner, "moves": result.moves[:100], "n_moves": len(result.moves),
                    "split": result.split, "merged": result.merged, "slots": migrated, "slot_error": slot_error,
                    "execute_ms": execute_ms, "stall_ms": None}
        self.pending_stall = decision       # stall_ms is filled in by the next beat (see observe)
        self._decide(decision)
        log.info("elastic step %d: v%d %s moves=%d split=%s slots=%d in %.0f ms", self.steps, new.version,
                 decision["why"], len(result.moves), result.split, len(migrated), execute_ms)
        return decision

    def _decide(self, decision: dict) -> None:
        self.decisions.append(decision)
        self.redis.lpush(DECISIONS_KEY, orjson.dumps(decision))
        self.redis.ltrim(DECISIONS_KEY, 0, HISTORY_MAX - 1)

    def _status(self, cfg: ElasticConfig) -> None:
        w = self.last_window
        status = {"time": time.time(), "enabled": cfg.enabled, "planner": cfg.planner, "steps": self.steps,
                  "shed_total": self.shed_total, "decisions": list(self.decisions),
                  "window": None if w is None else {
                      "batches": [w.start_batch, w.end_batch], "partition_points": w.partition_points,
                      "partition_seconds": w.partition_seconds, "imbalance": round(w.imbalance, 3),
                      "routing_version": w.routing_version, "lag": w.lag,
                      "hot_groups": sorted(w.groups.items(), key=lambda kv: -kv[1])[:5]}}
        self.redis.set(STATUS_KEY, orjson.dumps(status))


# --- task side (runs inside the Spark Python workers) ------------------------------------------------
_SEEN_VERSION = {"v": None}


def on_task_routing(table: routing.RoutingTable) -> list[str]:
    """Drop exactly the groups moved by this routing version from this worker's fence cache."""
    from fencing.stream.fence_cache import process_cache
    if _SEEN_VERSION["v"] == table.version:
        return []
    _SEEN_VERSION["v"] = table.version
    if table.moved:
        process_cache().invalidate(list(table.moved))
    return list(table.moved)


def child_counts(batches: list[pa.RecordBatch], split_groups=None) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Points per (group, device bucket), and per group, attributed as the router routes: all of a
    device's reports in the batch count for the group of its last report (arrival order, the same rule
    as fencing.stream.prepare). Returns (children, route_groups); the controller splits and moves by these."""
    reports = [b.filter(pa.array(b.column("kind").to_numpy(zero_copy_only=False) == 0)) for b in batches
               if b.num_rows]
    reports = [b for b in reports if b.num_rows]
    if not reports:
        return {}, {}
    table = pa.Table.from_batches(reports)
    devices = routing.device_runs(table.column("farm_id"), table.column("device_id"))
    groups = pa.chunked_array(table.column("grp")).combine_chunks().dictionary_encode()
    last_group = groups.indices.to_numpy(zero_copy_only=False)[devices.last]
    names = groups.dictionary.to_pylist()
    children: dict[str, dict[str, int]] = {}
    for g, bucket, k in zip(last_group.tolist(), routing.buckets_of(devices.keys), devices.count.tolist()):
        per_group = children.setdefault(names[g], {})
        per_group[bucket] = per_group.get(bucket, 0) + k
    route_groups = {name: sum(per.values()) for name, per in children.items()}
    return children, route_groups


def shed_reports(redis, table: routing.RoutingTable, batch: pa.Table, deleted: frozenset,
                 version: str = "") -> tuple[pa.Table, int]:
    """Drop the reports that cannot change any fence state (Borealis-style semantic shedding).

    A device's report is shed only if ALL of these hold, for it and every earlier report of the device
    in this batch: the device's stored state has no pending streak and no dwell still to come; the
    report's res-9 cell is a boundary cell of no fence (so membership is exact from the cells: inside
    the fences whose interior holds the cell, outside all others); that membership (the device's farm's
    fences) equals the confirmed inside set; no confirmed fence has warn_m or an active window; no late
    excursion waits for its return (`DeviceState.open`: the next fixes may be it); the
    report is newer than every earlier one (a late fix is replayed, never shed); and the segments from
    the last kept fix to it, from it to the next report, and from the last kept fix to the next report
    are all shorter than `crossings.MIN_SEGMENT_M`, so no segment with or without it implies a crossing. Such a report resets no streak and flips nothing, so its
    only effect would be the position, which the device's last report of the batch (never shed)
    overwrites. A report that could produce an event is never shed. Reports are taken in arrival order
    and the state before batch `version` ("<run id>:<batch id>", `ProcessContext.version`) is read with
    the process stage's own reader (transitions.state_before), so a replayed batch sheds exactly what
    it shed the first time."""
    from fencing.model.crossings import MIN_SEGMENT_M, segment_length_m
    from fencing.stream.fence_cache import process_cache
    from fencing.model.transitions import DeviceState, state_before
    if not batch.num_rows:
        return batch, 0
    frame = batch.select(["farm_id", "device_id", "ts", "cell", "grp", "lat", "lon"]).to_pandas()
    frame["dkey"] = frame["farm_id"] + "/" + frame["device_id"]
    frame["row"] = np.arange(len(frame))
    frame = frame.sort_values("dkey", kind="stable")        # per device, arrival order (as processed)
    cache = process_cache()
    groups = sorted(frame["grp"].unique())
    cache.refresh(redis, groups)
    boundary: set[int] = set()
    interior: dict[int, set[str]] = {}
    for g in groups:
        for uid, cells in cache.cells_of(g).items():
            boundary.update(cells[1].tolist())
            for c in cells[0].tolist():
                interior.setdefault(c, set()).add(uid)
    last = frame.groupby("dkey", sort=False).tail(1)
    homes = dict(zip(last["dkey"], last["grp"]))
    pipe = redis.pipeline()
    dkeys = list(homes)
    for d in dkeys:
        pipe.hget(keys.group_state(homes[d]), d)
    states = {}
    for d, raw in zip(dkeys, pipe.execute()):
        if raw:
            states[d] = state_before(orjson.loads(raw), version)
    last_rows = set(last["row"].tolist())
    drop = np.zeros(len(batch), dtype=bool)
    cells = frame["cell"].to_numpy().astype(np.int64).view(np.uint64).tolist()
    ts, lat, lon = frame["ts"].tolist(), frame["lat"].tolist(), frame["lon"].tolist()

    def short(a: int | None, b: int | tuple) -> bool:
        (la0, lo0), (la1, lo1) = (b if isinstance(b, tuple) else (lat[b], lon[b])), (lat[a], lon[a])
        return float(segment_length_m(lo0, la0, lo1, la1)) < MIN_SEGMENT_M

    for d, rows in frame.groupby("dkey", sort=False).indices.items():
        raw = states.get(d)
        if raw is None:
            continue
        state = DeviceState.from_dict(raw)
        confirmed = set(state.inside_fences())
        if any(s.streak for s in state.fences.values()) or confirmed & deleted or state.open:
            continue        # (open: a late excursion waits for its return among the next fixes)
        if any(cache.rules.get(u) and cache.rules[u].dwell_seconds and not state.fences[u].dwelled
               for u in confirmed):
            continue
        if any(cache.rules.get(u) and cache.rules[u].watched for u in confirmed):
            continue
        if state.last_ts is None or state.last_lat is None:
            continue
        kept, newest = (state.last_lat, state.last_lon), state.last_ts
        farm = d.partition("/")[0]
        for k, i in enumerate(rows):
            row = int(frame["row"].iat[i])
            if row in last_rows:
                break
            c = cells[i]
            if c in boundary:
                break
            member = {u for u in interior.get(c, ()) if cache.fence_farm.get(u) == farm}
            if member != confirmed:
                break
            following = rows[k + 1]            # exists: the device's last report is never shed
            if ts[i] <= newest or not (short(i, kept) and short(following, i) and short(following, kept)):
                break
            newest = ts[i]
            drop[row] = True
    shed = int(drop.sum())
    return (batch.filter(pa.array(~drop)) if shed else batch), shed


def elastic_process(ctx, batches, partition: int | None = None):
    """Wraps fencing.stream.process.process_partition: cache invalidation of moved groups, res-7 child load
    of every group, and load shedding when the routing table asks for it; adds them to the stats row.
    `partition`: as process_partition's."""
    from fencing.stream.process import OUT_KIND_STATS, process_partition
    from fencing.stream.fence_cache import process_cache
    from fencing.model.redis_conn import cluster
    moved = on_task_routing(ctx.routing)
    batches = [b for b in batches if b.num_rows]
    reload_s = 0.0
    if moved and batches:
        # reload the moved groups this task serves now (timed: it is the task's share of the stall)
        started = time.perf_counter()
        here = set()
        for b in batches:
            here.update(g for g in b.column("grp").to_pylist() if g)
        want = sorted(here & set(moved))
        if want:
            process_cache().refresh(cluster(ctx.redis_host, ctx.redis_port), want)
        reload_s = time.perf_counter() - started
    children, route_groups = child_counts(batches, ctx.routing.splits)
    shed = 0
    if ctx.routing.shed and batches:
        table = pa.Table.from_batches(batches)
        kinds = table.column("kind").to_numpy()
        reports = table.filter(pa.array(kinds == 0))
        side = table.filter(pa.array(kinds != 0))
        kept, shed = shed_reports(cluster(ctx.redis_host, ctx.redis_port), ctx.routing, reports, ctx.deleted,
                                  ctx.version)
        batches = pa.concat_tables([kept, side]).combine_chunks().to_batches()
    for out in process_partition(ctx, iter(batches), partition):
        kinds = out.column(0).to_numpy(zero_copy_only=False)
        stats_rows = np.flatnonzero(kinds == OUT_KIND_STATS)
        if len(stats_rows):
            payload = out.column(1).to_pylist()
            for i in stats_rows.tolist():
                stats = dataclasses.replace(PartitionStats.from_json(payload[i]), children=children,
                                            route_groups=route_groups, reload_s=round(reload_s, 4), shed=shed)
                payload[i] = stats.to_json()
            out = pa.RecordBatch.from_arrays([out.column(0), pa.array(payload, pa.string()), *out.columns[2:]],
                                             schema=out.schema)
        yield out
