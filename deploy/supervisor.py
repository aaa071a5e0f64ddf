"""Restart crashed components with bounded retries and exponential backoff: the broker's object
store, the broker, every Redis node, the job and the API, in that order (what a later one needs
comes back first).

Runs inside `herdfence up` (foreground) or as its own detached process (`python -m deploy.supervisor`,
pid-filed as component "supervisor") for `up --detach`. It restarts from the component's JSON
record, so it needs no knowledge of what it restarts; the restart count is written back into that
record (HERDFENCE_HOME/run/<name>.json), where `status` reads it.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil

from deploy import broker, procs
from fencing.config import TUNING, Settings, load_settings

NAME = "supervisor"
JOBS = ("job", "job_standby")
LAST = (*JOBS, "api")
STANDBY_RESTART_DELAY_S = 8.0


def supervised(settings: Settings) -> tuple[str, ...]:
    """Every component `up` recorded, the stores first. Spark's standalone daemons are left out:
    the job's executors ride out a lost worker, and `up` restarts it."""
    names = procs.recorded_names(settings)
    first = [n for n in (broker.STORE, broker.NAME) if n in names]
    redis_nodes = sorted(n for n in names if n.startswith("redis_"))
    return (*first, *redis_nodes, *LAST)


@dataclass(frozen=True)
class RestartPolicy:
    # consecutive failed restarts before giving up: ~15 minutes of tries at the capped delay, so a
    # job that cannot start while Redis or the broker is away comes back when they do
    max_attempts: int = 20
    base_delay_s: float = 1.0      # 1, 2, 4, 8, ... seconds
    max_delay_s: float = 45.0
    healthy_after_s: float = 120.0  # a process that ran this long resets the attempt budget


@dataclass
class _Track:
    attempts: int = 0
    next_try: float | None = None
    started_pid: int | None = None   # the pid this supervisor started last


@dataclass
class Supervisor:
    settings: Settings
    names: tuple[str, ...] | None = None      # None: `supervised(settings)`, read at every pass
    policy: RestartPolicy = RestartPolicy()
    log: callable = field(default=lambda msg: print(f"herdfence supervisor: {msg}", file=sys.stderr,
                                                    flush=True))
    _tracks: dict[str, _Track] = field(default_factory=dict)
    standby: bool = field(default_factory=lambda: TUNING.job_standby)     # a hot standby job runs

    def step(self, now: float | None = None) -> None:
        """One pass: restart what crashed and is due. Components without a record are not ours."""
        now = time.monotonic() if now is None else now
        for name in self._names():
            rec = procs.read_record(self.settings, name)
            if rec is None or rec.gave_up:
                continue
            track = self._tracks.setdefault(name, _Track())
            if procs.record_alive(rec):
                # healthy for a while, or (re)started by someone else (`herdfence up`): a fresh budget
                if time.time() - rec.started_at > self.policy.healthy_after_s or rec.pid != track.started_pid:
                    track.attempts = 0
                track.next_try = None
                continue
            if track.attempts >= self.policy.max_attempts:
                rec.gave_up = True
                procs.write_record(self.settings, rec)
                self.log(f"{name} crashed {track.attempts} times in a row; giving up "
                         f"(log: {procs.log_path(self.settings, name)})")
                continue
            if track.next_try is None:
                delay = min(self.policy.base_delay_s * 2 ** track.attempts, self.policy.max_delay_s)
                if name in JOBS and self.standby and track.attempts == 0:
                    # the other job process is taking over: its first batches get the cores before
                    # this one starts a JVM to become the next standby
                    delay = max(delay, STANDBY_RESTART_DELAY_S)
                track.next_try = now + delay
                self.log(f"{name} (pid {rec.pid}) is not running; restarting in {delay:.0f} s")
            if now >= track.next_try:
                track.attempts += 1
                track.next_try = None
                procs.kill_leftovers(rec.pid)
                try:
                    asked = time.time()
                    new = procs.start(self.settings, rec.spec, restarts=rec.restarts + 1)
                    if new.started_at < asked:      # `herdfence up` started it meanwhile
                        self.log(f"{name} is running again (pid {new.pid}, started by another herdfence process)")
                        continue
                    track.started_pid = new.pid
                    self.log(f"restarted {name} as pid {new.pid} (restart #{new.restarts})")
                except procs.DeployError as e:     # e.g. its port is still taken: try again later
                    self.log(f"cannot restart {name}: {e}")

    def _names(self) -> tuple[str, ...]:
        return self.names if self.names is not None else supervised(self.settings)

    def has_work(self) -> bool:
        return any(procs.read_record(self.settings, n) is not None for n in self._names())

    def run(self, stop: threading.Event, interval_s: float = 1.0) -> None:
        idle_since = None
        while not stop.is_set():
            self.step()
            # Everything was stopped behind our back (records removed): nothing left to do.
            if self.has_work():
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > 5:
                return
            stop.wait(interval_s)


def owner_gone(owner_pid: int) -> bool:
    """HERDFENCE_OWNER_PID names the process a stack belongs to (a benchmark's or a test session's
    private stack); 0: none."""
    if not owner_pid:
        return False
    try:
        return psutil.Process(owner_pid).status() in procs.GONE
    except psutil.NoSuchProcess:
        return True


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    settings = load_settings()
    owner_left = threading.Event()
    if TUNING.owner_pid:
        # a private stack dies with its owner (an OOM-killed benchmark left one running before)
        def watch_owner() -> None:
            while not stop.wait(1.0):
                if owner_gone(TUNING.owner_pid):
                    print(f"herdfence supervisor: owner pid {TUNING.owner_pid} is gone; stopping the stack",
                          file=sys.stderr, flush=True)
                    owner_left.set()
                    stop.set()
        threading.Thread(target=watch_owner, name="owner", daemon=True).start()
    Supervisor(settings).run(stop)
    if owner_left.is_set():
        # From the main thread: a daemon thread's Popen can lose the race with interpreter exit, and
        # then nothing stops the stack. `down` stops this supervisor too (it is exiting anyway), then
        # everything else; its output goes into the supervisor's log.
        subprocess.Popen([sys.executable, "-m", "deploy.cli", "down"], start_new_session=True,
                         stdout=sys.stderr, stderr=sys.stderr)


if __name__ == "__main__":
    main()
