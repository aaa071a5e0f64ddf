"""Where a benchmark runs: the stack the environment points at when `herdfence status` says ok, else
a private, short-lived stack on ports of its own (its own HERDFENCE_HOME in a temp dir), torn down
after the run whatever happens."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fencing.config import Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]
HERDFENCE = str(Path(sys.executable).parent / "herdfence")
PRIVATE_PORTS = {"HERDFENCE_EMBEDDED_KAFKA_PORT": "22092", "HERDFENCE_EMBEDDED_REDIS_PORT": "22101",
                 "HERDFENCE_API_PORT": "22800"}


def say(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


@dataclass
class BenchStack:
    settings: Settings
    env: dict[str, str]
    private: bool

    @property
    def redis(self):
        from fencing.model.redis_conn import cluster
        return cluster(*self.settings.redis_node)

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """`herdfence <args>` against this stack."""
        return _cli(self.env, *args, timeout=timeout)

    def stop_job(self) -> None:
        """Stop the job processes, and the supervisor first (it would restart them). The lease and its
        epoch stay in Redis."""
        from deploy import procs
        from deploy.stack import JOB, JOB_STANDBY, SUPERVISOR
        procs.stop_many(self.settings, [SUPERVISOR])
        procs.stop_many(self.settings, [JOB, JOB_STANDBY])

    def describe(self) -> dict:
        s = self.settings
        return {"kind": "private" if self.private else "running", "kafka": s.kafka_bootstrap,
                "redis": "%s:%d" % s.redis_node, "api": s.api_url, "spark_master": s.spark_master_url}


def _cli(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([HERDFENCE, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@contextmanager
def bench_stack(private_ports: dict[str, str] | None = None, keep: bool = False):
    """Yields a BenchStack: the running one when healthy, else a private one (stopped on exit)."""
    from deploy import stack as deploy_stack

    settings = load_settings()
    try:
        healthy = deploy_stack.status(settings)["ok"]
    except Exception:  # noqa: BLE001 - nothing reachable: start our own
        healthy = False
    if healthy:
        say(f"using the running stack (kafka {settings.kafka_bootstrap}, api {settings.api_url})")
        yield BenchStack(settings, dict(os.environ), private=False)
        return
    home = Path(tempfile.mkdtemp(prefix="herdfence-bench-"))
    # the caller's own stack settings stay out, except the job settings a benchmark compares
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HERDFENCE_") or k in ("HERDFENCE_TRIGGER", "HERDFENCE_MAX_OFFSETS_PER_TRIGGER",
                                                     "HERDFENCE_SINGLE_TASK_RECORDS", "HERDFENCE_JOB_STANDBY",
                                                     "HERDFENCE_BROKER_KEEP_SECONDS")}
    env.update(private_ports or PRIVATE_PORTS, HERDFENCE_HOME=str(home))
    if not keep:    # the private stack stops by itself if this process dies (killed, OOM) before it stops it
        env["HERDFENCE_OWNER_PID"] = str(os.getpid())
    priv = load_settings(env)
    say(f"no healthy stack in this environment: starting a private one in {home} "
        f"(kafka {priv.kafka_bootstrap}, redis {priv.redis_node[1]}, api {priv.api_url})")
    try:
        done = _cli(env, "up", "--detach")
        if done.returncode != 0:
            raise RuntimeError(f"private stack did not start:\n{done.stdout}\n{done.stderr[-4000:]}")
        yield BenchStack(priv, env, private=True)
    finally:
        if keep:
            say(f"private stack left running (HERDFENCE_HOME={home}); stop it with herdfence down")
        else:
            say("stopping the private stack")
            _cli(env, "down", timeout=180)
            logs = ROOT / "test-artifacts" / "bench-logs"
            for log in sorted((home / "run").glob("*.log")):
                logs.mkdir(parents=True, exist_ok=True)
                (logs / log.name).write_bytes(log.read_bytes()[-2_000_000:])
            shutil.rmtree(home, ignore_errors=True)


def machine() -> dict:
    import platform
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {"cores": os.cpu_count(), "cpu": model, "memory": mem, "python": platform.python_version(),
            "os": platform.platform()}
