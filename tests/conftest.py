"""Shared fixtures: ONE embedded stack (broker, Redis Cluster, Spark job, API) per test session,
started through the real CLI (`herdfence up --detach`) on ports of its own, stopped at the end."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

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


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Stack:
    home = tmp_path_factory.mktemp("herdfence-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDFENCE_")}
    # a low per-device report rate so that the 429 path is reachable from a test client
    env.update(TEST_PORTS, HERDFENCE_HOME=str(home), HERDFENCE_TRIGGER="200 milliseconds",
               HERDFENCE_RATE_DEVICE="10", HERDFENCE_KEEP_WARM_SECONDS="4",
               HERDFENCE_STREAMS_PER_FARM="40",
               # one job process: the hot standby has its own stack (tests/stack/test_failover.py)
               HERDFENCE_JOB_STANDBY="0",
               # the suite's webhook receivers listen on 127.0.0.1
               HERDFENCE_WEBHOOK_ALLOW_PRIVATE="1")
    s = Stack(env=env, api_url=f"http://127.0.0.1:{TEST_PORTS['HERDFENCE_API_PORT']}")
    try:
        s.cli("up", "--detach", timeout=600)
        yield s
    finally:
        subprocess.run([HERDFENCE, "down"], env=env, cwd=ROOT, capture_output=True, timeout=120)
        for log in sorted((home / "run").glob("*.log")):
            target = ROOT / "test-artifacts" / "logs" / log.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(log.read_bytes()[-2_000_000:])


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
