"""Process supervision helpers: detached components with a PID file, a JSON record and a log.

Each component `name` started by herdfence leaves, in HERDFENCE_HOME/run/:
  <name>.pid   the PID (plain text, for humans and shell scripts)
  <name>.json  the full record (ProcRecord): argv, env overrides, port, cmdline markers, restarts
  <name>.log   stdout + stderr of the process (appended across restarts)
The JSON record holds everything needed to start the component again, so the supervisor can restart
it without knowing what it is.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from fencing.config import DeployError, Settings  # noqa: F401 - DeployError is raised by every launcher




@dataclass(frozen=True)
class ProcSpec:
    """How to start one component."""
    name: str
    argv: list[str]
    # Substrings that must all appear in the process's cmdline: a reused PID is then not mistaken
    # for ours. Redis and Java rewrite their cmdline, so the caller picks markers that survive.
    markers: list[str]
    port: int | None = None
    port_env: str | None = None       # the variable that moves the port (for the "port taken" error)
    env: dict[str, str] = field(default_factory=dict)   # added to os.environ
    cwd: str | None = None


@dataclass
class ProcRecord:
    spec: ProcSpec
    pid: int
    started_at: float
    restarts: int = 0
    gave_up: bool = False             # the supervisor stopped restarting it

    def to_json(self) -> dict:
        d = asdict(self)
        d["port"] = self.spec.port    # flat copy: what `status` and humans look for first
        return d

    @classmethod
    def from_json(cls, d: dict) -> ProcRecord:
        return cls(spec=ProcSpec(**d["spec"]), pid=int(d["pid"]), started_at=float(d["started_at"]),
                   restarts=int(d.get("restarts", 0)), gave_up=bool(d.get("gave_up", False)))


# --- files ---------------------------------------------------------------------------------------
def _paths(settings: Settings, name: str) -> tuple[Path, Path, Path]:
    run = settings.run_dir
    return run / f"{name}.pid", run / f"{name}.json", run / f"{name}.log"


def log_path(settings: Settings, name: str) -> Path:
    return _paths(settings, name)[2]


def read_record(settings: Settings, name: str) -> ProcRecord | None:
    try:
        return ProcRecord.from_json(json.loads(_paths(settings, name)[1].read_text()))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def write_record(settings: Settings, rec: ProcRecord) -> None:
    pid_file, json_file, _ = _paths(settings, rec.spec.name)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = json_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rec.to_json(), indent=1))
    os.replace(tmp, json_file)        # atomic: the supervisor and `status` may read it concurrently
    pid_file.write_text(f"{rec.pid}\n")


def remove_record(settings: Settings, name: str) -> None:
    for p in _paths(settings, name)[:2]:
        p.unlink(missing_ok=True)


def recorded_names(settings: Settings) -> list[str]:
    if not settings.run_dir.is_dir():
        return []
    return sorted(p.stem for p in settings.run_dir.glob("*.json"))


def log_tail(settings: Settings, name: str, lines: int = 15) -> str:
    try:
        return "\n".join(log_path(settings, name).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


# --- liveness ------------------------------------------------------------------------------------
GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)   # exited, not reaped yet: not running


def _reap(pid: int) -> None:
    """Collect our own dead children (foreground mode, tests) so they do not linger as zombies."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def is_alive(pid: int | None, markers: list[str] | None = None) -> bool:
    """True when `pid` runs and its cmdline contains every marker (a reused PID does not count)."""
    if not pid:
        return False
    _reap(pid)
    try:
        proc = psutil.Process(pid)
        if proc.status() in GONE:
            return False
        cmdline = " ".join(proc.cmdline())
    except psutil.NoSuchProcess:                  # ZombieProcess included
        return False
    return all(m in cmdline for m in markers or [])


def record_alive(rec: ProcRecord | None) -> bool:
    return rec is not None and is_alive(rec.pid, rec.spec.markers)


def alive_record(settings: Settings, name: str) -> ProcRecord | None:
    rec = read_record(settings, name)
    return rec if record_alive(rec) else None


# --- ports ---------------------------------------------------------------------------------------
def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ensure_port_free(port: int, env_hint: str | None) -> None:
    """Refuse to start on a port someone else listens on (we would fail later, less clearly)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR, as servers set it: on Linux the bind then fails only when a socket is
        # bound or listening there, not because of leftover TIME_WAIT connections.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            hint = f"set {env_hint} or stop it" if env_hint else "stop it"
            raise DeployError(f"port {port} is in use by another process; {hint}") from None


def wait_for_port(port: int, timeout: float, rec: ProcRecord | None = None,
                  settings: Settings | None = None) -> None:
    """Wait until something accepts on 127.0.0.1:port; fail early if `rec`'s process dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(port):
            return
        # No cmdline markers here: right after fork, before exec, the child still shows our own
        # cmdline; only a process that is really gone counts as dead.
        if rec is not None and not is_alive(rec.pid):
            tail = log_tail(settings, rec.spec.name) if settings else ""
            raise DeployError(f"{rec.spec.name} exited before listening on port {port}:\n{tail}")
        time.sleep(0.1)
    raise DeployError(f"timed out after {timeout:.0f} s waiting for port {port}"
                      + (f" ({rec.spec.name})" if rec else ""))


# --- start / stop --------------------------------------------------------------------------------
START_LOCK_WAIT_S = 60.0    # the longest `start` waits for another process starting the same component


def start(settings: Settings, spec: ProcSpec, restarts: int = 0) -> ProcRecord:
    """Start `spec` detached (own session: survives the terminal, killable as a group), unless its
    recorded process is alive: then that record. `herdfence up` and the supervisor may both find a
    component down at once; the start is one step per component across processes (a lock in the run
    directory), so the second finds the first one's process instead of starting another. Two starts
    of the API raced for its port: the loser's record could overwrite the winner's, and the winner ran
    on, unrecorded, past `down`."""
    with _start_lock(settings, spec.name):
        previous = read_record(settings, spec.name)
        if record_alive(previous):
            return previous
        if previous is not None:
            # A crashed leader may have left children behind (uvicorn workers holding the API port, a
            # JVM): its process group is ours alone, so reclaim it before starting again.
            kill_leftovers(previous.pid)
            _wait_group_gone(previous.pid)
        if spec.port is not None:
            ensure_port_free(spec.port, spec.port_env)
        _, _, log = _paths(settings, spec.name)
        with open(log, "ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {spec.name}: "
                      f"{' '.join(spec.argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=spec.cwd, env={**os.environ, **spec.env}, start_new_session=True,
                                    close_fds=True)
        rec = ProcRecord(spec=spec, pid=proc.pid, started_at=time.time(), restarts=restarts)
        write_record(settings, rec)
        # Until the child has exec'd, its cmdline is still ours: wait for it, so that marker-based
        # liveness checks right after a start never mistake a starting process for a dead one.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and is_alive(proc.pid) and not is_alive(proc.pid, spec.markers):
            time.sleep(0.01)
        return rec


@contextmanager
def _start_lock(settings: Settings, name: str):
    """An exclusive lock on run/<name>.lock, released when the holder exits however it ends (the
    kernel drops a dead process's flock). Waits START_LOCK_WAIT_S at most (a holder stopped with
    SIGSTOP holds it until resumed)."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.run_dir / f"{name}.lock", "a") as f:
        deadline = time.monotonic() + START_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DeployError(f"{name}: another herdfence process has been starting it for "
                                      f"{START_LOCK_WAIT_S:.0f} s (lock {f.name})") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _is_group_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _signal(pid: int, sig: int, group: bool) -> None:
    # Our components lead their own process group: signal the group so that children (the JVM a
    # PySpark driver launches, Java behind spark-class) go too.
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_pid(pid: int, markers: list[str], timeout: float = 10.0) -> bool:
    """SIGTERM, wait up to `timeout`, then SIGKILL. False when it was not running (or not ours)."""
    if not is_alive(pid, markers):
        return False
    group = _is_group_leader(pid)
    _signal(pid, signal.SIGTERM, group)
    deadline = time.monotonic() + timeout
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if is_alive(pid):
        _signal(pid, signal.SIGKILL, group)
        while is_alive(pid) and time.monotonic() < deadline + 5:
            time.sleep(0.05)
    if group:
        # The leader is gone but members may linger (e.g. a JVM child running its shutdown hooks):
        # give them a moment, then finish them.
        grace = time.monotonic() + 3
        while _group_exists(pid) and time.monotonic() < grace:
            time.sleep(0.05)
        _signal(pid, signal.SIGKILL, True)
    return True


def kill_leftovers(pid: int) -> None:
    """After a component leader died on its own: kill what is left of its group (e.g. the JVM of a
    crashed PySpark driver). Safe from PID reuse: Linux hands out no PID equal to a live group id."""
    if _group_exists(pid):
        _signal(pid, signal.SIGKILL, True)


def _wait_group_gone(pgid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while _group_exists(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes of a process group. killpg(pgid, 0) would also count zombies
    that another process (e.g. the pytest that started them) has not reaped yet."""
    out = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() not in GONE:
                out.append(pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue                              # gone meanwhile
    return out


def _group_exists(pgid: int) -> bool:
    return bool(group_members(pgid))


def stop(settings: Settings, name: str, timeout: float = 10.0) -> bool:
    """Stop component `name` by its recorded PID and remove its pid/json files."""
    rec = read_record(settings, name)
    stopped = stop_pid(rec.pid, rec.spec.markers, timeout) if rec else False
    remove_record(settings, name)
    return stopped


def stop_many(settings: Settings, names: list[str], timeout: float = 10.0) -> list[str]:
    """Stop several components in parallel (their shutdowns overlap); returns those that ran."""
    if not names:
        return []
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        ran = list(pool.map(lambda n: stop(settings, n, timeout), names))
    return [n for n, r in zip(names, ran) if r]
