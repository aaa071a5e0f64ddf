"""Configuration from HERDFENCE_* environment variables, shared by every part.

Unset variables mean "the embedded stack": Tansu on 127.0.0.1:9092, a 3-master Redis Cluster on
127.0.0.1:7101-7103 (3 masters), Spark in local[*], the API on 127.0.0.1:8000.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

# Embedded ports. HERDFENCE_EMBEDDED_KAFKA_PORT / HERDFENCE_EMBEDDED_REDIS_PORT (the first of three)
# move the embedded stack, so that a test session can run beside a developer's stack.
DEFAULT_KAFKA_PORT = 9092
DEFAULT_REDIS_PORT = 7101
REDIS_MASTERS = 3
TOPIC_REPORTS = "gps.reports"
TOPIC_DLQ = "gps.reports.dlq"
TOPIC_EVENTS = "fence.events"
REPORT_PARTITIONS = 4


@dataclass(frozen=True)
class Settings:
    home: Path
    kafka: str | None
    redis: str | None
    spark_master: str | None
    api_port: int
    embedded_kafka_port: int = DEFAULT_KAFKA_PORT
    embedded_redis_port: int = DEFAULT_REDIS_PORT
    embedded_redis_masters: int = REDIS_MASTERS     # HERDFENCE_EMBEDDED_REDIS_MASTERS: any size >= 1
    redis_maxmemory: str = "4gb"    # HERDFENCE_REDIS_MAXMEMORY: per embedded node (noeviction beyond)
    broker_durable: bool = True     # HERDFENCE_BROKER_STORAGE: disk (default) | memory
    streams_per_farm: int = 100     # HERDFENCE_STREAMS_PER_FARM: live event streams per farm and API worker
    webhook_allow_private: bool = False   # HERDFENCE_WEBHOOK_ALLOW_PRIVATE=1: on-premise receivers

    @property
    def embedded_redis_ports(self) -> list[int]:
        return [self.embedded_redis_port + i for i in range(self.embedded_redis_masters)]

    @property
    def kafka_bootstrap(self) -> str:
        return self.kafka or f"127.0.0.1:{self.embedded_kafka_port}"

    @property
    def redis_nodes(self) -> list[tuple[str, int]]:
        """Every node a client may start from: HERDFENCE_REDIS may list several (`h1:p1,h2:p2`); the
        embedded cluster's masters and their replicas (ports after the masters')."""
        if self.redis:
            out = []
            for entry in self.redis.split(","):
                host, _, port = entry.strip().rpartition(":")
                out.append((host or "127.0.0.1", int(port)))
            return out
        return [("127.0.0.1", self.embedded_redis_port + i) for i in range(2 * self.embedded_redis_masters)]

    @property
    def redis_node(self) -> tuple[str, int]:
        """A reachable node of the Redis Cluster (the client discovers the rest from it): the first of
        `redis_nodes` that accepts a connection, so a restart after a master died still connects."""
        nodes = self.redis_nodes
        for host, port in nodes:
            try:
                with socket.create_connection((host, port), timeout=0.3):
                    return host, port
            except OSError:
                continue
        return nodes[0]

    @property
    def spark_master_url(self) -> str:
        return self.spark_master or "local[*]"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def checkpoint_dir(self) -> Path:
        return self.home / "checkpoint"

    @property
    def history_dir(self) -> Path:
        return self.home / "history"

    @property
    def run_dir(self) -> Path:
        """PID files and logs of the components `herdfence up` started."""
        return self.home / "run"


def load_settings(env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ if env is None else env)
    return Settings(
        home=Path(env.get("HERDFENCE_HOME") or "./.herdfence").resolve(),
        kafka=env.get("HERDFENCE_KAFKA") or None,
        redis=env.get("HERDFENCE_REDIS") or None,
        spark_master=env.get("HERDFENCE_SPARK_MASTER") or None,
        api_port=int(env.get("HERDFENCE_API_PORT") or 8000),
        embedded_kafka_port=int(env.get("HERDFENCE_EMBEDDED_KAFKA_PORT") or DEFAULT_KAFKA_PORT),
        embedded_redis_port=int(env.get("HERDFENCE_EMBEDDED_REDIS_PORT") or DEFAULT_REDIS_PORT),
        embedded_redis_masters=max(1, int(env.get("HERDFENCE_EMBEDDED_REDIS_MASTERS") or REDIS_MASTERS)),
        webhook_allow_private=(env.get("HERDFENCE_WEBHOOK_ALLOW_PRIVATE") or "0").strip().lower()
        in ("1", "true", "yes", "on"),
        streams_per_farm=max(1, int(env.get("HERDFENCE_STREAMS_PER_FARM") or 100)),
        broker_durable=_broker_storage(env.get("HERDFENCE_BROKER_STORAGE") or "disk"),
        redis_maxmemory=_memory_size("HERDFENCE_REDIS_MAXMEMORY", env.get("HERDFENCE_REDIS_MAXMEMORY") or "4gb"),
    )


def _broker_storage(value: str) -> bool:
    if value.strip().lower() not in ("disk", "memory"):
        raise DeployError(f"HERDFENCE_BROKER_STORAGE={value!r}: expected disk or memory")
    return value.strip().lower() == "disk"


def _memory_size(var: str, value: str) -> str:
    """A Redis memory size (`4gb`, `512mb`, bytes); anything else is a clear error, not a Redis
    that refuses to start."""
    text = value.strip().lower()
    if not re.fullmatch(r"\d+(b|kb|k|mb|m|gb|g)?", text):
        raise DeployError(f"{var}={value!r} is not a memory size (e.g. 4gb, 512mb)")
    return text


class DeployError(RuntimeError):
    """A problem the user can fix; the CLI prints its message without a traceback."""


# --- checks of single values (the job checks its master at start; deploy/validate.py the rest) ---
_HOSTPORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_LOCAL = re.compile(r"^local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?$|^local-cluster\[\d+,\s*\d+,\s*\d+\]$")


def _hostport(var: str, value: str) -> tuple[str, int]:
    m = _HOSTPORT.match(value.strip())
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise DeployError(f"{var}={value!r} is malformed: expected host:port (e.g. 10.0.0.5:9092)")
    return m.group(1).strip("[]"), int(m.group(2))


def _tcp(host: str, port: int, timeout: float = 3.0) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return e.strerror or str(e)


# --- Spark ---------------------------------------------------------------------------------------
def check_spark_master(url: str, reach: bool = False) -> None:
    """local / local[N] / local[*] / spark://h:p[,h:p] / k8s://https://h[:p] / yarn."""
    var = "HERDFENCE_SPARK_MASTER"
    if _LOCAL.match(url) or url == "yarn":
        return
    if url.startswith("spark://"):
        hosts = url[len("spark://"):].split(",")
        if not all(hosts):
            raise DeployError(f"{var}={url!r} is malformed: expected spark://host:port[,host:port]")
        addrs = [_hostport(var, h) for h in hosts]
        if reach and all(_tcp(h, p) for h, p in addrs):
            raise DeployError(f"{var}={url!r}: no Spark master answers at {', '.join(hosts)} "
                              f"({_tcp(*addrs[0])}); start it or fix the URL")
        return
    if url.startswith("k8s://"):
        rest = url[len("k8s://"):]
        if not re.match(r"^(https?://)?[A-Za-z0-9_.-]+(:\d{1,5})?/?$", rest):
            raise DeployError(f"{var}={url!r} is malformed: expected k8s://https://<api server>[:port]")
        return
    raise DeployError(f"{var}={url!r} is malformed: expected local[*], local[N], spark://host:port, "
                      "k8s://https://host:port or yarn")


# --- the executors' code: artefacts built by deploy/artifact.py ----------------------------------
PYFILES_ENV = "HERDFENCE_PYFILES"  # comma-separated artefacts for the job's SparkContext.addPyFile


def pyfiles_from_env(env: dict[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    return [p for p in (env.get(PYFILES_ENV) or "").split(",") if p.strip()]
