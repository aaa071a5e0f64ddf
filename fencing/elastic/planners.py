"""The elastic controller's planners: given the routing table and a window's loads per cell group
(and per device bucket of split groups), where each item should go.

Items are cell groups, and the device buckets of split groups (fencing.stream.routing.SPLIT_BUCKETS).
A group alone above `split_share` of a partition's fair share is split (its buckets become items); a
split group that went cold is merged back. Then either pairwise balancing (Borealis: repeatedly move
the item that best evens the most and least loaded partitions) or bin-packing (HarmonicIO IRM:
first-fit decreasing into bins of capacity settle x mean, keeping an item in its bin when it fits).
Pure functions: no Redis, no Spark (the controller, fencing.elastic.controller, runs them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fencing.stream import routing

if TYPE_CHECKING:
    from fencing.elastic.controller import ElasticConfig


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


