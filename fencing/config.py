"""Configuration from HERDFENCE_* environment variables, shared by every part.

Unset variables mean "the embedded stack": Tansu on 127.0.0.1:9092, a 3-master Redis Cluster on
127.0.0.1:7101-7103 (3 masters), Spark in local[*], the API on 127.0.0.1:8000.
"""
from __future__ import annotations

import os
import re
import socket
import time
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


_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def flag(env: dict[str, str], var: str, default: bool) -> bool:
    """The one reader of on/off settings: 1/true/yes/on and 0/false/no/off (any case); unset or
    empty → `default`; anything else is an error naming the variable."""
    value = (env.get(var) or "").strip().lower()
    if not value:
        return default
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise DeployError(f"{var}={env[var]!r}: expected one of {', '.join(_ON + _OFF)}")


def number(env: dict[str, str], var: str, default: float, minimum: float = 0.0, kind: type = float):
    value = (env.get(var) or "").strip()
    if not value:
        return kind(default)
    try:
        out = kind(value)
    except ValueError:
        raise DeployError(f"{var}={value!r}: expected a{'n integer' if kind is int else ' number'}") from None
    if not out >= minimum:          # also refuses nan
        raise DeployError(f"{var}={value!r}: must be at least {minimum}")
    return out


@dataclass(frozen=True)
class Tuning:
    """The job's and the API's knobs (README, "Configuration"), read once per process from the
    environment and validated there: a malformed value stops the process at start with a clear error."""
    trigger: str = "250 milliseconds"            # HERDFENCE_TRIGGER
    max_offsets_per_trigger: int = 1_000_000     # HERDFENCE_MAX_OFFSETS_PER_TRIGGER
    elastic: bool = True                         # HERDFENCE_ELASTIC
    migrate_slots: bool = True                   # HERDFENCE_MIGRATE_SLOTS
    fence_preload: bool = True                   # HERDFENCE_FENCE_PRELOAD
    keep_warm_s: float = 20.0                    # HERDFENCE_KEEP_WARM_SECONDS (0: off)
    silent_after_s: float = 3600.0               # HERDFENCE_SILENT_SECONDS
    silent_scan_s: float = 30.0                  # HERDFENCE_SILENT_SCAN_SECONDS
    retention_days: float = 30.0                 # HERDFENCE_EVENT_RETENTION_DAYS (0: keep all)
    trim_every_s: float = 600.0                  # HERDFENCE_EVENT_TRIM_SECONDS
    jvm_options: str = "-XX:TieredStopAtLevel=1"  # HERDFENCE_JVM_OPTIONS ("" = the JVM's default)
    driver_host: str = "127.0.0.1"               # HERDFENCE_DRIVER_HOST
    driver_bind: str = ""                        # HERDFENCE_DRIVER_BIND ("" = driver_host)
    driver_memory: str = "2g"                    # HERDFENCE_DRIVER_MEMORY
    scale_watch: bool = True                     # HERDFENCE_SCALE_WATCH
    rate_device: float = 50.0                    # HERDFENCE_RATE_DEVICE (requests/s, burst 2x)
    rate_farm_reports: float = 2000.0            # HERDFENCE_RATE_FARM_REPORTS
    rate_farm: float = 50_000.0                  # HERDFENCE_RATE_FARM
    api_workers: int = 2                         # HERDFENCE_API_WORKERS
    objectstore_fsync: bool = False              # HERDFENCE_OBJECTSTORE_FSYNC
    broker_keep_s: float = 30.0                  # HERDFENCE_BROKER_KEEP_SECONDS: consumed gps.reports kept this long
    owner_pid: int = 0                           # HERDFENCE_OWNER_PID: the stack stops when this process is gone
    job_standby: bool = True                     # HERDFENCE_JOB_STANDBY: a hot standby job beside the active one
    lease_ms: int = 600                          # HERDFENCE_JOB_LEASE_MS: the active job's lease
    standby_nice: int = 10                       # HERDFENCE_STANDBY_NICE: a standby's CPU niceness (0: off)
    single_task_records: int = 10_000            # HERDFENCE_SINGLE_TASK_RECORDS: a batch this small runs as one task (0: never)
    fork_server: bool = True                     # HERDFENCE_FORK_SERVER: the query's Python runner from a warm fork server (local Spark)


def load_tuning(env: dict[str, str] | None = None) -> Tuning:
    env = dict(os.environ if env is None else env)
    d = Tuning()
    return Tuning(
        trigger=(env.get("HERDFENCE_TRIGGER") or d.trigger).strip(),
        max_offsets_per_trigger=number(env, "HERDFENCE_MAX_OFFSETS_PER_TRIGGER", d.max_offsets_per_trigger, 1, int),
        elastic=flag(env, "HERDFENCE_ELASTIC", d.elastic),
        migrate_slots=flag(env, "HERDFENCE_MIGRATE_SLOTS", d.migrate_slots),
        fence_preload=flag(env, "HERDFENCE_FENCE_PRELOAD", d.fence_preload),
        keep_warm_s=number(env, "HERDFENCE_KEEP_WARM_SECONDS", d.keep_warm_s),
        silent_after_s=number(env, "HERDFENCE_SILENT_SECONDS", d.silent_after_s),
        silent_scan_s=number(env, "HERDFENCE_SILENT_SCAN_SECONDS", d.silent_scan_s),
        retention_days=number(env, "HERDFENCE_EVENT_RETENTION_DAYS", d.retention_days),
        trim_every_s=number(env, "HERDFENCE_EVENT_TRIM_SECONDS", d.trim_every_s),
        jvm_options=env.get("HERDFENCE_JVM_OPTIONS", d.jvm_options),
        driver_host=env.get("HERDFENCE_DRIVER_HOST") or d.driver_host,
        driver_bind=env.get("HERDFENCE_DRIVER_BIND") or "",
        driver_memory=env.get("HERDFENCE_DRIVER_MEMORY") or d.driver_memory,
        scale_watch=flag(env, "HERDFENCE_SCALE_WATCH", d.scale_watch),
        rate_device=number(env, "HERDFENCE_RATE_DEVICE", d.rate_device, 0.001),
        rate_farm_reports=number(env, "HERDFENCE_RATE_FARM_REPORTS", d.rate_farm_reports, 0.001),
        rate_farm=number(env, "HERDFENCE_RATE_FARM", d.rate_farm, 0.001),
        api_workers=number(env, "HERDFENCE_API_WORKERS", d.api_workers, 1, int),
        objectstore_fsync=flag(env, "HERDFENCE_OBJECTSTORE_FSYNC", d.objectstore_fsync),
        broker_keep_s=number(env, "HERDFENCE_BROKER_KEEP_SECONDS", d.broker_keep_s, 0.0),
        owner_pid=number(env, "HERDFENCE_OWNER_PID", d.owner_pid, 0, int),
        job_standby=flag(env, "HERDFENCE_JOB_STANDBY", d.job_standby),
        lease_ms=number(env, "HERDFENCE_JOB_LEASE_MS", d.lease_ms, 300, int),
        standby_nice=min(19, number(env, "HERDFENCE_STANDBY_NICE", d.standby_nice, 0, int)),
        single_task_records=number(env, "HERDFENCE_SINGLE_TASK_RECORDS", d.single_task_records, 0, int),
        fork_server=flag(env, "HERDFENCE_FORK_SERVER", d.fork_server),
    )


def spark_cluster_conf(env: dict[str, str] | None = None) -> dict[str, str]:
    """Spark settings for a cluster master (executor size, dynamic allocation)."""
    env = os.environ if env is None else env
    conf = {"spark.executor.cores": env.get("HERDFENCE_EXECUTOR_CORES", "1"),
            "spark.executor.memory": env.get("HERDFENCE_EXECUTOR_MEMORY", "1g"),
            # A micro-batch's tasks should start at once on any executor, not wait for locality.
            "spark.locality.wait": "0s"}
    # Pinned driver ports (containers, firewalls): executors connect back to the driver on these.
    if env.get("HERDFENCE_DRIVER_PORT"):
        conf["spark.driver.port"] = env["HERDFENCE_DRIVER_PORT"]
    if env.get("HERDFENCE_BLOCKMANAGER_PORT"):
        conf["spark.blockManager.port"] = env["HERDFENCE_BLOCKMANAGER_PORT"]
    if env.get("HERDFENCE_EXECUTOR_PYTHON"):
        conf["spark.pyspark.python"] = env["HERDFENCE_EXECUTOR_PYTHON"]
    if flag(env, "HERDFENCE_DYNAMIC_ALLOCATION", True):
        lo = number(env, "HERDFENCE_MIN_EXECUTORS", 1, 0, int)
        hi = max(lo, number(env, "HERDFENCE_MAX_EXECUTORS", 16, 1, int))
        initial = min(hi, max(lo, number(env, "HERDFENCE_INITIAL_EXECUTORS", lo, 0, int)))
        conf.update({
            "spark.dynamicAllocation.enabled": "true",
            # No external shuffle service: executors holding shuffle data are tracked instead.
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.timeout": env.get("HERDFENCE_SHUFFLE_TRACKING_TIMEOUT",
                                                                       "120s"),
            "spark.dynamicAllocation.minExecutors": str(lo),
            "spark.dynamicAllocation.maxExecutors": str(hi),
            "spark.dynamicAllocation.initialExecutors": str(initial),
            # Micro-batches queueing for 1 s ask for more executors; 60 s without a task gives one back.
            "spark.dynamicAllocation.schedulerBacklogTimeout": env.get("HERDFENCE_BACKLOG_TIMEOUT", "1s"),
            "spark.dynamicAllocation.sustainedSchedulerBacklogTimeout": "1s",
            "spark.dynamicAllocation.executorIdleTimeout": env.get("HERDFENCE_EXECUTOR_IDLE_TIMEOUT", "60s"),
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
        webhook_allow_private=flag(env, "HERDFENCE_WEBHOOK_ALLOW_PRIVATE", False),
        streams_per_farm=number(env, "HERDFENCE_STREAMS_PER_FARM", 100, 1, int),
        broker_durable=_broker_storage(env.get("HERDFENCE_BROKER_STORAGE") or "disk"),
        redis_appendfsync=_choice("HERDFENCE_REDIS_APPENDFSYNC", env.get("HERDFENCE_REDIS_APPENDFSYNC") or "everysec",
                                  ("everysec", "always", "no", "off")),
        redis_save=_save_rule(env.get("HERDFENCE_REDIS_SAVE", "3600 1")),
        redis_maxmemory=_memory_size("HERDFENCE_REDIS_MAXMEMORY", env.get("HERDFENCE_REDIS_MAXMEMORY") or "4gb"),
    )


def _choice(var: str, value: str, allowed: tuple[str, ...]) -> str:
    if value.strip().lower() not in allowed:
        raise DeployError(f"{var}={value!r}: expected one of {', '.join(allowed)}")
    return value.strip().lower()


def _save_rule(value: str) -> str:
    if not re.fullmatch(r"(\s*\d+\s+\d+)*\s*", value):
        raise DeployError(f"HERDFENCE_REDIS_SAVE={value!r}: expected pairs of seconds and changes, e.g. '3600 1'")
    return " ".join(value.split())


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


# Read once per process, at import: every module that needs a knob takes it from here.
TUNING = load_tuning()
