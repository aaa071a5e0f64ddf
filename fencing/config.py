"""Configuration from HERDFENCE_* environment variables, shared by every part: `Settings` (where
things are) and `TUNING` (the job's and the API's knobs), both from the typed model in
fencing/settings_model.py, which checks every variable (docs/configuration.md lists them).

Unset variables mean "the embedded stack": Tansu on 127.0.0.1:9092, a 3-master Redis Cluster on
127.0.0.1:7101-7103 (3 masters), Spark in local[*], the API on 127.0.0.1:8000.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# The typed model of the variables, and the checks of single values, live in fencing/settings_model.py.
from fencing.settings_model import (  # noqa: F401 - the configuration's public names
    FLAG_ACCEPTS, ConfigError, DeployError, HerdfenceEnv, _flag, _hostport, _tcp, check_spark_master, read_env,
    unknown_vars)

# Embedded ports. HERDFENCE_EMBEDDED_KAFKA_PORT / HERDFENCE_EMBEDDED_REDIS_PORT (the first of three)
# move the embedded stack, so that a test session can run beside a developer's stack.
DEFAULT_KAFKA_PORT = 9092
DEFAULT_REDIS_PORT = 7101
REDIS_MASTERS = 3
TOPIC_REPORTS = "gps.reports"
TOPIC_DLQ = "gps.reports.dlq"
TOPIC_EVENTS = "fence.events"
REPORT_PARTITIONS = 4


def flag(env: Mapping[str, str], var: str, default: bool) -> bool:
    """The one reader of on/off values: 1/true/yes/on and 0/false/no/off (any case); unset or empty →
    `default`; anything else is a ConfigError naming the variable."""
    value = (env.get(var) or "").strip()
    if not value:
        return default
    try:
        return _flag(value)
    except ValueError:
        raise ConfigError([f"{var}={env[var]!r} is not valid: {FLAG_ACCEPTS}"]) from None


def load_tuning(env: Mapping[str, str] | None = None) -> HerdfenceEnv:
    """The job's and the API's knobs (docs/configuration.md): the validated settings model itself, read
    once per process from the environment; a malformed value stops the process at start with a
    clear error."""
    return read_env(env)


def spark_cluster_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings for a cluster master (executor size, dynamic allocation)."""
    m = read_env(env)
    conf = {"spark.executor.cores": str(m.executor_cores), "spark.executor.memory": m.executor_memory,
            # A micro-batch's tasks should start at once on any executor, not wait for locality.
            "spark.locality.wait": "0s"}
    # Pinned driver ports (containers, firewalls): executors connect back to the driver on these.
    if m.driver_port:
        conf["spark.driver.port"] = str(m.driver_port)
    if m.blockmanager_port:
        conf["spark.blockManager.port"] = str(m.blockmanager_port)
    if m.executor_python:
        conf["spark.pyspark.python"] = m.executor_python
    if m.dynamic_allocation:
        lo = m.min_executors
        hi = max(lo, m.max_executors)
        initial = min(hi, max(lo, lo if m.initial_executors is None else m.initial_executors))
        conf.update({
            "spark.dynamicAllocation.enabled": "true",
            # No external shuffle service: executors holding shuffle data are tracked instead.
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.timeout": m.shuffle_tracking_timeout,
            "spark.dynamicAllocation.minExecutors": str(lo),
            "spark.dynamicAllocation.maxExecutors": str(hi),
            "spark.dynamicAllocation.initialExecutors": str(initial),
            # Micro-batches queueing for 1 s ask for more executors; 60 s without a task gives one back.
            "spark.dynamicAllocation.schedulerBacklogTimeout": m.backlog_timeout,
            "spark.dynamicAllocation.sustainedSchedulerBacklogTimeout": "1s",
            "spark.dynamicAllocation.executorIdleTimeout": m.executor_idle_timeout,
        })
    return conf


NODE_PROBE_S = 10.0
_reachable: dict[tuple, tuple[float, tuple[str, int]]] = {}


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
    redis_appendfsync: str = "everysec"   # HERDFENCE_REDIS_APPENDFSYNC: everysec | always | no | off (no AOF)
    redis_save: str = "3600 1"      # HERDFENCE_REDIS_SAVE: RDB snapshot rule ("" = none)
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
        `redis_nodes` that accepts a connection, so a restart after a master died still connects.
        Probed at most every NODE_PROBE_S per process (it is asked for every micro-batch)."""
        nodes = tuple(self.redis_nodes)
        cached = _reachable.get(nodes)
        now = time.monotonic()
        if cached is not None and now - cached[0] < NODE_PROBE_S:
            return cached[1]
        found = nodes[0]
        for host, port in nodes:
            try:
                with socket.create_connection((host, port), timeout=0.3):
                    found = (host, port)
                    break
            except OSError:
                continue
        _reachable[nodes] = (now, found)
        return found

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

    @property
    def ingest_hold_file(self) -> Path:
        """While it names a time to come, the job plans no new reports (ingest.admission.hold)."""
        return self.run_dir / "ingest-hold-until"


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    m = read_env(env)
    return Settings(
        home=Path(m.home).resolve(), kafka=m.kafka, redis=m.redis, spark_master=m.spark_master,
        api_port=m.api_port, embedded_kafka_port=m.embedded_kafka_port, embedded_redis_port=m.embedded_redis_port,
        embedded_redis_masters=m.embedded_redis_masters, webhook_allow_private=m.webhook_allow_private,
        streams_per_farm=m.streams_per_farm, broker_durable=m.broker_storage == "disk",
        redis_appendfsync=m.redis_appendfsync, redis_save=m.redis_save, redis_maxmemory=m.redis_maxmemory,
    )


# --- the executors' code: artefacts built by deploy/artifact.py ----------------------------------
PYFILES_ENV = "HERDFENCE_PYFILES"  # comma-separated artefacts for the job's SparkContext.addPyFile


def pyfiles_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    return [p for p in read_env(env).pyfiles.split(",") if p.strip()]


# Read once per process, at import: every module that needs a knob takes it from here.
TUNING = load_tuning()
