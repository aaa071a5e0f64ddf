"""The elastic loop: monitor → analyze → plan → execute, inside the running query (never stopped).

* Monitor: the job calls the controller (BatchProcessor observer) after every micro-batch with its
  heartbeat: per partition points, time, per cell group points, per group per device bucket points
  (attributed as routed: all of a device's reports to the group of its last report), local vs
  cross-node Redis calls, shed reports, and the source lag.
* Analyze: beats are aggregated into windows of >= `min_points` points; the imbalance of a window is
  max/mean of the partitions' points. Hysteresis: act only when the imbalance exceeds `trigger` in
  `confirm` consecutive windows and `cooldown` windows have passed since the last action; the plan
  aims at `settle` (< trigger) so a balanced table is not re-planned on noise.
* Plan: fencing.elastic.planners (split hot groups into device buckets, merge cold ones, then pairwise
  balancing or bin-packing).
* Execute: move the Redis slots of moved (whole) groups to the master aligned with their new partition
  (fencing.elastic.slots: whole-slot live migration), then publish routing version v+1 with the `moved` groups;
  the next micro-batch routes by it and its tasks drop exactly the moved groups from their caches.
  The controller runs on the driver between two micro-batches, so no task runs during a migration.
* Load shedding (Borealis, semantic): when the source lag exceeds `shed_lag`, routing.shed is set and
  tasks drop reports that provably cannot change any fence state (fencing.stream.shedding). `shed` in
  the config forces it ("on"/"off"; default "auto").
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, fields

import numpy as np
import orjson

from fencing.config import TUNING
from fencing.elastic import slots
from fencing.elastic.planners import Plan, plan
from fencing.model.heartbeat import Heartbeat
from fencing.stream import routing

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
