"""Where a benchmark's memory goes (issue 23): resident memory of the active job's driver (its Python
process and its JVM, which in local mode also runs the executor), its Python workers, the Redis
masters and the bench itself, sampled (psutil) while the run goes; and Redis bytes per device, from
INFO memory of the masters and MEMORY USAGE of sample keys of each key family the job writes."""
from __future__ import annotations

import itertools
import os
import resource
import threading
import time

import psutil

MB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:                          # gone, a zombie, or not ours to read
        return 0


def cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def children_by_parent() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):       # a process gone meanwhile is left out
        if proc.info["ppid"] is not None:
            out.setdefault(proc.info["ppid"], []).append(proc.pid)
    return out


def descendants(root: int, tree: dict[int, list[int]]) -> list[int]:
    """`root` and every process under it (`tree`: children_by_parent())."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += tree.get(pid, [])
    return out


def job_processes(job_pid: int) -> dict[str, list[int]]:
    """The job's process tree by role: `driver` (the job's Python process), `jvm` (its Spark JVM),
    `workers` (every Python process under the JVM: the pyspark daemon, its workers, the data source's
    runner)."""
    roles: dict[str, list[int]] = {"driver": [job_pid], "jvm": [], "workers": []}
    for pid in descendants(job_pid, children_by_parent())[1:]:
        cmd = cmdline(pid)
        if "java" in cmd.split(" ", 1)[0]:
            roles["jvm"].append(pid)
        elif "python" in cmd:
            roles["workers"].append(pid)
    return roles


def stack_pids(settings) -> tuple[int | None, list[int]]:
    """(the active job's pid, the Redis masters' pids) of a running embedded stack."""
    from deploy import stack as deploy_stack
    comps = deploy_stack.status(settings)["components"]
    nodes = (comps.get("redis") or {}).get("nodes") or {}
    masters = [int(n["pid"]) for n in nodes.values() if n.get("pid") and n.get("started_as") == "master"]
    return (comps.get("job") or {}).get("pid"), masters


class MemorySampler(threading.Thread):
    """Samples every `every_s`: peak and last RSS (MB) of driver, jvm, each worker (max and sum), the
    Redis masters (sum) and this process. The job's pid is looked up again every `resolve_s` (a
    take-over by the standby changes it)."""

    def __init__(self, settings, every_s: float = 1.0, resolve_s: float = 15.0):
        super().__init__(name="memory-sampler", daemon=True)
        self.settings, self.every_s, self.resolve_s = settings, every_s, resolve_s
        self.peak: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.samples = 0
        self._halt = threading.Event()

    def sample(self, job_pid: int | None, redis_pids: list[int],
               roles: dict[str, list[int]] | None = None) -> dict[str, float]:
        """`roles`: job_processes(job_pid), when the caller has them (looked up at each call else)."""
        now: dict[str, float] = {"bench": rss_bytes(os.getpid()) / MB}
        if job_pid:
            roles = roles or job_processes(job_pid)
            now["driver"] = sum(rss_bytes(p) for p in roles["driver"]) / MB
            now["jvm"] = sum(rss_bytes(p) for p in roles["jvm"]) / MB
            workers = [rss_bytes(p) / MB for p in roles["workers"]]
            now["worker_max"] = max(workers, default=0.0)
            now["workers_sum"] = sum(workers)
        if redis_pids:
            now["redis_masters"] = sum(rss_bytes(p) for p in redis_pids) / MB
        return now

    def run(self) -> None:
        job_pid, redis_pids, roles, resolved = None, [], None, 0.0
        while not self._halt.is_set():
            if time.monotonic() - resolved > self.resolve_s:
                try:
                    job_pid, redis_pids = stack_pids(self.settings)
                except Exception:  # noqa: BLE001 - a restart in progress: try again later
                    pass
                # the job's process tree with it, not every second: walking every process's parent
                # and command line each time took ~2% of a core of the machine the run is measured on
                roles = job_processes(job_pid) if job_pid else None
                resolved = time.monotonic()
            now = self.sample(job_pid, redis_pids, roles)
            self.last = now
            for k, v in now.items():
                self.peak[k] = max(self.peak.get(k, 0.0), v)
            self.samples += 1
            self._halt.wait(self.every_s)

    def stop(self) -> dict:
        self._halt.set()
        self.join(10)
        return self.summary()

    def summary(self) -> dict:
        return {"peak_mb": {k: round(v, 1) for k, v in self.peak.items()},
                "last_mb": {k: round(v, 1) for k, v in self.last.items()},
                "bench_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "samples": self.samples, "every_s": self.every_s}


# --- Redis --------------------------------------------------------------------------------------
def masters_used_memory(redis) -> int:
    """INFO memory used_memory summed over the masters (bytes)."""
    import redis as redis_mod

    from fencing.stream.routing import slot_map
    total = 0
    for node in slot_map(redis)[1]:
        host, _, port = node.rpartition(":")
        total += int(redis_mod.Redis(host=host, port=int(port), socket_timeout=30).info("memory")["used_memory"])
    return total


def _usage(redis, key: str) -> int:
    return int(redis.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)


def key_families(redis, farm_ids: list[str], fence_keys: list[tuple[str, str]], sample: int = 20) -> dict:
    """Bytes per entry of each per-device key family, from MEMORY USAGE (all fields counted) of up to
    `sample` keys of it: device state (per cell group), device locations (buckets), positions and
    last-seen (per farm), the position index (per farm and cell), fence members, the device registry
    and the farms' device records. Returns {family: {"keys", "entries", "bytes", "bytes_per_entry"}}."""
    from fencing.model import keys

    out: dict[str, dict] = {}

    def add(family: str, key: str, entries: int) -> None:
        if not entries:
            return
        row = out.setdefault(family, {"keys": 0, "entries": 0, "bytes": 0})
        row["keys"] += 1
        row["entries"] += int(entries)
        row["bytes"] += _usage(redis, key)

    farms = farm_ids[:sample]
    groups = sorted(redis.smembers(keys.FENCE_GROUPS))[:sample]
    for g in groups:
        add("state", keys.group_state(g), redis.hlen(keys.group_state(g)))
    for b in range(0, keys.LOCATION_BUCKETS, max(1, keys.LOCATION_BUCKETS // sample)):
        key = f"dloc:{{{b}}}"
        add("device_location", key, redis.hlen(key))
    for farm in farms:
        add("positions", keys.positions(farm), redis.hlen(keys.positions(farm)))
        add("last_seen", keys.last_seen(farm), redis.zcard(keys.last_seen(farm)))
        add("device_record", keys.farm_devices(farm), redis.hlen(keys.farm_devices(farm)))
        add("event_data", keys.event_data(farm), redis.hlen(keys.event_data(farm)))
        add("event_index", keys.events(farm), redis.zcard(keys.events(farm)))
        # its entries hold one write's events each: counted by events, which are the log's (until trimmed)
        add("event_stream", keys.event_stream(farm), redis.hlen(keys.event_data(farm)))
        node = redis.get_node_from_key(keys.events(farm))
        for family, pattern in (("event_fence_index", keys.fence_events(farm, "*")),
                                ("event_device_index", keys.device_events(farm, "*"))):
            for key in itertools.islice(redis.scan_iter(match=pattern, count=1000, target_nodes=node), sample):
                add(family, key, redis.zcard(key))      # a sample of a farm's (many) device indexes
        cells = [k for k in redis.scan_iter(match=keys.position_cell(farm, "*"), count=1000,
                                            target_nodes=redis.get_node_from_key(keys.positions(farm)))]
        for key in cells:
            add("position_index", key, redis.scard(key))
    for farm, fence in fence_keys[:sample * 5]:
        add("members", keys.members(farm, fence), redis.hlen(keys.members(farm, fence)))
    n = redis.hlen(keys.DEVICE_REGISTRY)
    if n:   # one big hash: MEMORY USAGE samples its fields
        row = out.setdefault("registry", {"keys": 1, "entries": n, "bytes": 0})
        row["bytes"] = int(redis.execute_command("MEMORY", "USAGE", keys.DEVICE_REGISTRY, "SAMPLES", "2000") or 0)
    for row in out.values():
        row["bytes_per_entry"] = round(row["bytes"] / row["entries"], 1) if row["entries"] else None
    return out


PER_EVENT = ("event_data", "event_index", "event_stream", "event_fence_index", "event_device_index")
PER_DEVICE = ("state", "device_location", "positions", "last_seen", "position_index", "registry", "device_record")


def redis_summary(redis, used: dict[str, int], devices: int, loaded) -> dict:
    """Redis bytes per device of a push run. `used`: masters' used_memory at "start", after "loaded"
    (fences + device registration), after "warm" (the warm-up's devices) and after the "run" (the
    measured devices' live state and their events; `event_bytes`: one event's bytes in the event
    keys of its farm: log, time index, stream, fence and device index). The per-family figures
    (MEMORY USAGE of sample keys) say where the bytes of one device go."""
    families = key_families(redis, sorted(set(loaded.farm_of.values())), list(loaded.fence_real.values()))
    per_device = {f: families[f]["bytes_per_entry"] for f in PER_DEVICE if f in families}
    per_event = sum(families[f]["bytes_per_entry"] or 0 for f in PER_EVENT if f in families)
    return {"used_memory": used, "event_bytes": round(per_event, 1),
            "run_bytes_per_device": round((used["run"] - used["warm"]) / devices, 1) if devices else None,
            "total_bytes_per_device": round((used["run"] - used["start"]) / devices, 1) if devices else None,
            "families": families,
            "family_bytes_per_device": per_device,
            "family_sum_per_device": round(sum(v for v in per_device.values() if v), 1)}
