"""Where a benchmark's CPU goes: core-seconds per part of the stack over the measured window, from
psutil (user + system time of every process, and the machine's busy time).

Why: on this shared 2-core VM the same code measures ±25% from one run to the next (the bench's own
producer took 5.3 core-s in one run and 8.2 in the next for the same records), so a points/s figure
alone cannot say whether a change made the job cheaper. The split says which process used the
machine, and `other` says how much went to processes that are not this stack or this bench."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil

from loadgen.bench_memory import children_by_parent, cmdline, descendants, job_processes, stack_pids

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
ROLES = ("workers", "jvm", "driver", "standby", "redis", "broker", "broker_store", "api", "stack_other", "bench",
         "other")


def cpu_ticks(pid: int) -> int:
    """utime + stime of `pid` (clock ticks; 0 when it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0
    return _ticks(times.user) + _ticks(times.system)


def _ticks(seconds: float) -> int:
    """psutil divides the kernel's clock ticks by the tick rate; this gives them back exactly."""
    return round(seconds / TICK_S)


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot (idle and iowait are not busy)."""
    t = psutil.cpu_times()
    values = [_ticks(v) for v in (t.user, t.nice, t.system, t.idle, t.iowait, t.irq, t.softirq, t.steal)]
    return sum(values) - values[3] - values[4], sum(values)


def _environ_home(pid: int) -> str:
    try:
        return psutil.Process(pid).environ().get("HERDFENCE_HOME", "")
    except psutil.Error:                          # gone, or another user's
        return ""


@dataclass
class Snapshot:
    time: float
    ticks: dict[int, int]           # pid → utime + stime
    machine_busy: int
    machine_total: int


class CpuSampler(threading.Thread):
    """Snapshots every process's CPU ticks every `every_s`; the roles of the stack's processes are
    looked up again when the active job's process is gone (a take-over swaps the active job and the
    standby), every `resolve_s`, and when the sampler stops (processes new since: a Python worker the
    pool added). A lookup costs ~0.2 core-s (the stack's status, every process's environment): every
    10 s it took ~2% of a core of the machine the run is measured on."""

    def __init__(self, settings, every_s: float = 1.0, resolve_s: float = 60.0):
        super().__init__(name="cpu-sampler", daemon=True)
        self.settings, self.every_s, self.resolve_s = settings, every_s, resolve_s
        self.snapshots: list[Snapshot] = []
        self.role_of: dict[int, str] = {}          # every pid ever seen in a role
        self._job_pid: int | None = None
        self._halt = threading.Event()

    def resolve(self) -> None:
        """Assign the stack's processes (and this bench's) to roles; anything else is `other`."""
        from deploy import stack as deploy_stack
        tree = children_by_parent()
        roles: dict[int, str] = {p: "bench" for p in descendants(os.getpid(), tree)}    # the stack's roles win
        try:
            job_pid, redis_pids = stack_pids(self.settings)
            comps = deploy_stack.status(self.settings)["components"]
        except Exception:  # noqa: BLE001 - a restart in progress: keep the roles known so far
            return
        self._job_pid = int(job_pid) if job_pid else None
        for pid in redis_pids:
            roles[pid] = "redis"
        for name, role in (("broker", "broker"), ("api", "api")):
            pid = (comps.get(name) or {}).get("pid")
            for p in descendants(int(pid), tree) if pid else ():
                roles[p] = role
        home = str(self.settings.home)
        for pid in psutil.pids():
            if _environ_home(pid) != home:
                continue
            cmd = cmdline(pid)
            if "fencing.stream.job" in cmd and pid != job_pid:
                for p in descendants(pid, tree):
                    roles[p] = "standby"
            elif "deploy.objectstore" in cmd:
                roles[pid] = "broker_store"
            else:
                roles.setdefault(pid, "stack_other")     # the supervisor, fork servers, ...
        if job_pid:
            for role, pids in job_processes(int(job_pid)).items():
                for p in pids:
                    roles[p] = role
        self.role_of.update(roles)

    def snapshot(self) -> Snapshot:
        ticks = {}
        for pid in psutil.pids():
            t = cpu_ticks(pid)
            if t:
                ticks[pid] = t
        busy, total = machine_ticks()
        return Snapshot(time.time(), ticks, busy, total)

    def run(self) -> None:
        resolved = time.monotonic() if self.role_of else 0.0
        while not self._halt.is_set():
            job_gone = self._job_pid is not None and not psutil.pid_exists(self._job_pid)
            if job_gone or time.monotonic() - resolved > self.resolve_s:
                self.resolve()
                resolved = time.monotonic()
            self.snapshots.append(self.snapshot())
            self._halt.wait(self.every_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
        if self.settings is not None:
            self.resolve()          # the processes that came up during the run

    def window(self, start: float, end: float) -> dict:
        """Core-seconds per role between the snapshots nearest `start` and `end` (epoch s)."""
        return cpu_window(self.snapshots, self.role_of, start, end)


def cpu_window(snapshots: list[Snapshot], role_of: dict[int, str], start: float, end: float) -> dict:
    """Core-seconds per role (a process that started inside the window counts from 0), the
    machine's busy cores on average, and the window actually covered by the snapshots."""
    if len(snapshots) < 2:
        return {}
    a = min(snapshots, key=lambda s: abs(s.time - start))
    b = min(snapshots, key=lambda s: abs(s.time - end))
    if b.time <= a.time:
        return {}
    used = dict.fromkeys(ROLES, 0.0)
    for pid, ticks in b.ticks.items():
        used[role_of.get(pid, "other")] += max(0, ticks - a.ticks.get(pid, 0)) * TICK_S
    seconds = b.time - a.time
    cores = os.cpu_count() or 1
    busy = (b.machine_busy - a.machine_busy) / max(1, b.machine_total - a.machine_total) * cores
    return {"window_s": round(seconds, 2), "cores": cores, "busy_cores": round(busy, 2),
            "core_seconds": {k: round(v, 2) for k, v in used.items()}}
