"""Shared fixtures: ONE embedded stack (broker, Redis Cluster, Spark job, API) per test session,
started through the real CLI (`herdfence up --detach`) on ports of its own, stopped at the end."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from hypothesis import settings as hypothesis_settings

# Property tests: a fast profile by default, the full one on request (HYPOTHESIS_PROFILE=full).
hypothesis_settings.register_profile("fast", max_examples=25, deadline=None)
hypothesis_settings.register_profile("full", max_examples=300, deadline=None)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

ROOT = Path(__file__).resolve().parents[1]
HERDFENCE = str(Path(sys.executable).parent / "herdfence")
# The test stack's ports; HERDFENCE_TEST_PORT_OFFSET shifts them so two suites can run side by side.
OFFSET = _OFFSET = int(os.environ.get("HERDFENCE_TEST_PORT_OFFSET", "0"))
TEST_PORTS = {"HERDFENCE_EMBEDDED_KAFKA_PORT": str(19092 + _OFFSET),
              "HERDFENCE_EMBEDDED_REDIS_PORT": str(17101 + _OFFSET), "HERDFENCE_API_PORT": str(18000 + _OFFSET)}


@dataclass
class Stack:
    env: dict[str, str]
    api_url: str

    @property
    def settings(self):
        from fencing.config import load_settings
        return load_settings(self.env)

    @property
    def redis(self):
        from fencing.model.redis_conn import cluster
        return cluster(*self.settings.redis_node)

    @property
    def kafka_bootstrap(self) -> str:
        return self.settings.kafka_bootstrap

    def new_farm(self, name: str = "test farm") -> tuple[str, str]:
        out = self.cli("farm", "create", name, "--json")
        import json
        data = json.loads(out)
        return data["farm_id"], data["api_key"]

    def client(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.api_url, headers=headers, timeout=30)

    def cli(self, *args: str, check: bool = True, timeout: float = 300) -> str:
        done = subprocess.run([HERDFENCE, *args], env=self.env, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"herdfence {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout


class StackPool:
    """The suite's embedded stacks, one running at a time: on 2 cores a second stack's JVM, Redis
    Cluster and keep-warm slow every test of the first. Tests run grouped by the stack they need
    (`pytest_collection_modifyitems`); a stack asked for after another started is brought back up
    (its home kept), so an order that is not the usual one is slower, never wrong."""

    def __init__(self) -> None:
        self.stacks: dict[str, tuple[Stack, tuple[str, ...]]] = {}
        self.running: set[str] = set()

    def use(self, name: str, s: Stack, up_args: tuple[str, ...] = ()) -> Stack:
        self.stacks.setdefault(name, (s, up_args))
        for other in sorted(self.running - {name}):
            self.stop(other)
        if name not in self.running:
            s.cli("up", "--detach", *up_args, timeout=600)
            self.running.add(name)
        return s

    def ensure(self, s: Stack) -> None:
        """`s` runs (and no other stack of the pool): a no-op unless the order mixed the groups."""
        for name, (known, up_args) in self.stacks.items():
            if known is s and name not in self.running:
                self.use(name, s, up_args)

    def stop(self, name: str) -> None:
        s, _ = self.stacks[name]
        subprocess.run([HERDFENCE, "down"], env=s.env, cwd=ROOT, capture_output=True, timeout=180)
        self.running.discard(name)


POOL = StackPool()


def keep_logs(home: Path, prefix: str, limit: int = 2_000_000) -> None:
    for log in sorted((home / "run").glob("*.log")):
        target = ROOT / "test-artifacts" / "logs" / f"{prefix}{log.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(log.read_bytes()[-limit:])


def _session_stack(home: Path) -> Stack:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDFENCE_")}
    # a low per-device report rate so that the 429 path is reachable from a test client
    env.update(TEST_PORTS, HERDFENCE_HOME=str(home), HERDFENCE_TRIGGER="200 milliseconds",
               HERDFENCE_RATE_DEVICE="10", HERDFENCE_KEEP_WARM_SECONDS="4",
               HERDFENCE_STREAMS_PER_FARM="40",
               # one job process: the hot standby is tested on the disposable stack
               HERDFENCE_JOB_STANDBY="0",
               # the suite's webhook receivers listen on 127.0.0.1
               HERDFENCE_WEBHOOK_ALLOW_PRIVATE="1",
               # a test session killed before its teardown does not leave its stack running
               HERDFENCE_OWNER_PID=str(os.getpid()))
    return Stack(env=env, api_url=f"http://127.0.0.1:{TEST_PORTS['HERDFENCE_API_PORT']}")


class _EarlyStart(threading.Thread):
    """The shared stack started while the unit tests run (its start is mostly waiting: JVM, ports,
    the first micro-batch), when the run has tests that use it."""

    def __init__(self, s: Stack) -> None:
        super().__init__(daemon=True, name="session-stack-start")
        self.stack, self.error = s, None

    def run(self) -> None:
        try:
            POOL.use("session", self.stack)
        except BaseException as e:  # noqa: BLE001 - re-raised in the fixture, where a test sees it
            self.error = e


_EARLY: _EarlyStart | None = None


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Stack:
    """The shared stack: every test that does not destroy it."""
    early = _EARLY
    s = early.stack if early is not None else _session_stack(tmp_path_factory.mktemp("herdfence-home"))
    try:
        if early is not None:
            early.join()
            if early.error is not None:
                raise early.error
        yield POOL.use("session", s)
    finally:
        POOL.stop("session")
        keep_logs(Path(s.env["HERDFENCE_HOME"]), "")


# The disposable stack: the embedded default (durable broker, hot standby), for the scenarios that
# kill, freeze, stop, restore or reset it. They run after every test of the shared stack, in the
# order DISPOSABLE_ORDER gives, each leaving it running and healthy for the next.
DISPOSABLE_PORTS = {"HERDFENCE_EMBEDDED_KAFKA_PORT": str(25092 + OFFSET),
                    "HERDFENCE_EMBEDDED_REDIS_PORT": str(16101 + OFFSET), "HERDFENCE_API_PORT": str(25800 + OFFSET)}
DISPOSABLE_ORDER = ("test_failover", "test_durability", "test_chaos")


def disposable_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDFENCE_")}
    env.update(DISPOSABLE_PORTS, HERDFENCE_HOME=str(home), HERDFENCE_OWNER_PID=str(os.getpid()),
               HERDFENCE_TRIGGER="200 milliseconds", HERDFENCE_ELASTIC="0", HERDFENCE_JOB_STANDBY="1",
               HERDFENCE_KEEP_WARM_SECONDS="5",
               HERDFENCE_FORK_SERVER="1")      # the warm runner start (the default), taken over from as well
    return env


@pytest.fixture(scope="session")
def disposable(tmp_path_factory) -> Stack:
    home = tmp_path_factory.mktemp("herdfence-disposable")
    s = Stack(env=disposable_env(home), api_url=f"http://127.0.0.1:{DISPOSABLE_PORTS['HERDFENCE_API_PORT']}")
    try:
        yield POOL.use("disposable", s)
    finally:
        POOL.stop("disposable")
        for other in (Path(p) for p in s.env.get("_OTHER_HOMES", "").split(",") if p):
            subprocess.run([HERDFENCE, "down"], env=disposable_env(other), cwd=ROOT, capture_output=True, timeout=180)
        keep_logs(home, "disposable-", 1_000_000)


@pytest.fixture(autouse=True)
def _only_this_stack_runs(request):
    """Before a test: the stack it uses is the one running (see StackPool)."""
    for name in ("stack", "disposable"):
        if name in request.fixturenames:
            POOL.ensure(request.getfixturevalue(name))


def _order(item) -> tuple[int, int]:
    """Unit tests, then the shared stack's, then the disposable stack's (in DISPOSABLE_ORDER), then
    those with a stack of their own (the standalone cluster)."""
    path = Path(str(item.fspath))
    if "unit" in path.parts:
        return (0, 0)
    module = path.stem
    if "disposable" in item.fixturenames:
        return (2, DISPOSABLE_ORDER.index(module) if module in DISPOSABLE_ORDER else len(DISPOSABLE_ORDER))
    if module == "test_cluster":
        return (3, 0)
    return (1, 0)


@pytest.hookimpl(tryfirst=True)    # before `-m` deselection, which reads the markers set here
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        group, _ = _order(item)
        if group:
            item.add_marker(pytest.mark.stack)
        if group >= 2:
            item.add_marker(pytest.mark.destructive)
    items[:] = sorted(items, key=_order)       # stable: a module's tests keep their order


def pytest_collection_finish(session) -> None:
    """Start the shared stack early when what runs (after `-m`/`-k`) has unit tests and tests on it."""
    global _EARLY
    items = session.items
    wants_stack = any(_order(i)[0] == 1 and "stack" in i.fixturenames for i in items)
    if wants_stack and any(_order(i)[0] == 0 for i in items) and _EARLY is None and not session.config.option.collectonly:
        home = Path(session.config._tmp_path_factory.mktemp("herdfence-home"))   # noqa: SLF001 - pytest's own
        _EARLY = _EarlyStart(_session_stack(home))
        _EARLY.start()


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.3, what: str = "condition"):
    """Poll until predicate() returns a truthy value; fail with `what` after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def pytest_sessionfinish(session, exitstatus) -> None:
    """A shared stack started early for tests that never ran (a run stopped by -x in the unit tests)."""
    if _EARLY is not None and "session" in POOL.stacks:
        _EARLY.join()
        if "session" in POOL.running:
            POOL.stop("session")
