"""The typed model of every HERDFENCE_* variable (pydantic-settings): its default, what it accepts and
what it means, and the one error a bad value raises. fencing/config.py builds `Settings` from it and
uses it as `TUNING`; fencing/config_docs.py prints it (`herdfence config`, docs/configuration.md).

A field `name` is the variable `HERDFENCE_NAME`. Empty means unset (the default), except for fields
marked `keep_empty`, where "" is a value of its own (no JVM options, no RDB snapshots).
"""
from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import AfterValidator, AllowInfNan, BeforeValidator, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

PREFIX = "HERDFENCE_"
# The docs' sections, in this order.
WHERE, EMBEDDED, JOB, API, CLUSTER, INTERNAL = (
    "Where things are", "The embedded stack", "The streaming job", "The API",
    "A Spark cluster (spark://, k8s://, up --spark-workers)", "Set by herdfence for the processes it starts")


def setting(default: Any, group: str, description: str, *, unset: str | None = None, keep_empty: bool = False,
            accepts: str | None = None) -> Any:
    """A field of the model: `unset` says what an unset optional setting means; `keep_empty`: "" is a
    value (not the default); `accepts` overrides the words derived from the type."""
    return Field(default, description=description,
                 json_schema_extra={"group": group, "unset": unset, "keep_empty": keep_empty, "accepts": accepts})


class DeployError(RuntimeError):
    """A problem the user can fix; the CLI prints its message without a traceback."""


class ConfigError(DeployError):
    """HERDFENCE_* variables holding values they do not accept, one line per variable; the CLI prints
    them and exits 2 before any command runs."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Accepts:
    """What a field accepts, in words (Annotated metadata: the error message and the docs say it)."""
    text: str


def _checked(pattern: str, accepts: str, normalize=lambda s: s) -> Any:
    """A string type that must match `pattern` (whole, any case); stored as `normalize` returns it."""
    rx = re.compile(pattern, re.IGNORECASE)

    def check(value: str) -> str:
        if not rx.fullmatch(value):
            raise ValueError(accepts)
        return normalize(value)
    return Annotated[str, AfterValidator(check), Accepts(accepts)]


# --- value types -----------------------------------------------------------------------------------
ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ON + OFF:
        return text in ON
    raise ValueError("not an on/off value")


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


FLAG_ACCEPTS = "one of " + ", ".join(ON + OFF) + " (any case)"
Flag = Annotated[bool, BeforeValidator(_flag), Accepts(FLAG_ACCEPTS)]
Port = Annotated[int, at.Ge(1), at.Le(65535)]
Number = Annotated[float, AllowInfNan(False)]
_HOSTPORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_LOCAL = re.compile(r"^local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?$|^local-cluster\[\d+,\s*\d+,\s*\d+\]$")


def _host_ports(value: str) -> str:
    entries = [e.strip().removeprefix("PLAINTEXT://") for e in value.split(",") if e.strip()]
    if not entries or not all((m := _HOSTPORT.match(e)) and 0 < int(m.group(2)) < 65536 for e in entries):
        raise ValueError("host:port")
    return value


HostPorts = Annotated[str, AfterValidator(_host_ports),
                      Accepts("host:port, or several separated by commas (e.g. 10.0.0.5:9092,10.0.0.6:9092)")]
MemorySize = _checked(r"\d+(b|kb|k|mb|m|gb|g)?", "a memory size: digits with b, kb, mb or gb (e.g. 4gb, 512mb)",
                      str.lower)
JvmSize = _checked(r"0*[1-9]\d*[kmgt]?b?", "a JVM memory size: digits with k, m, g or t (e.g. 2g, 512m)", str.lower)
SparkTime = _checked(r"0*[1-9]\d*(us|ms|s|m|min|h|d)",
                     "a positive Spark duration: digits with us, ms, s, m, min, h or d (e.g. 60s)", str.lower)
Interval = _checked(r"(interval\s+)?(\d+(\.\d+)?\s*(microsecond|millisecond|second|minute|hour|day)s?\s*)+",
                    "a Spark interval: a number and a unit (milliseconds, seconds, minutes, hours), "
                    "e.g. '250 milliseconds' or '2 seconds'", str.strip)
Host = _checked(r"[A-Za-z0-9_.:\[\]-]+", "a host name or an IP address")
SaveRule = _checked(r"(\s*\d+\s+\d+)*\s*", "pairs of seconds and changes (e.g. '3600 1' or '900 1 300 10'), "
                    "or empty for none", lambda s: " ".join(s.split()))


def spark_master_problem(url: str) -> str | None:
    """Why `url` is not a Spark master URL herdfence knows (None: it is one)."""
    if _LOCAL.match(url) or url == "yarn":
        return None
    if url.startswith("spark://"):
        hosts = url[len("spark://"):].split(",")
        if all(hosts) and all(hostport_problem(h) is None for h in hosts):
            return None
        return "expected spark://host:port[,host:port]"
    if url.startswith("k8s://"):
        if re.match(r"^(https?://)?[A-Za-z0-9_.-]+(:\d{1,5})?/?$", url[len("k8s://"):]):
            return None
        return "expected k8s://https://<api server>[:port]"
    return "expected local[*], local[N], spark://host:port, k8s://https://host:port or yarn"


def hostport_problem(value: str) -> str | None:
    m = _HOSTPORT.match(value.strip())
    return None if m is not None and 0 < int(m.group(2)) < 65536 else "expected host:port (e.g. 10.0.0.5:9092)"


def _spark_master(value: str) -> str:
    if spark_master_problem(value) is not None:
        raise ValueError("a Spark master URL")
    return value


SparkMaster = Annotated[str, AfterValidator(_spark_master),
                        Accepts("a Spark master URL: local[*], local[N], spark://host:port[,host:port], "
                                "k8s://https://host[:port] or yarn")]


# --- the model -------------------------------------------------------------------------------------
class HerdfenceEnv(BaseSettings):
    """Every HERDFENCE_* variable, typed and bounded. Field order is the order of the docs."""
    model_config = SettingsConfigDict(env_prefix=PREFIX, case_sensitive=False, env_ignore_empty=False,
                                      extra="ignore", frozen=True, validate_default=False)

    # Where things are
    home: str = setting("./.herdfence", WHERE, "state dir: PIDs and logs (`run/`), Redis data, the broker's "
                        "log, the Spark checkpoint, history", accepts="a directory (relative: to where herdfence runs)")
    kafka: HostPorts | None = setting(None, WHERE, "bootstrap servers of an existing Kafka cluster; `herdfence up` "
                                      "checks that it answers", unset="the embedded Tansu broker")
    redis: HostPorts | None = setting(None, WHERE, "a node of an existing Redis Cluster (clients discover the "
                                      "rest from it; several, comma-separated: the first that answers); "
                                      "`herdfence up` checks it is a usable cluster", unset="the embedded Redis Cluster")
    spark_master: SparkMaster | None = setting(None, WHERE, "the Spark master the job runs on; a `spark://` "
                                               "master must accept connections at `herdfence up`",
                                               unset="`local[*]`")
    api_port: Port = setting(8000, WHERE, "the API and UI port (on 127.0.0.1)")
    # The embedded stack
    embedded_kafka_port: Port = setting(9092, EMBEDDED, "the embedded broker's port")
    embedded_redis_port: Annotated[int, at.Ge(1), at.Le(55000)] = setting(
        7101, EMBEDDED, "the first embedded Redis master's port; the others and then the replicas follow it",
        accepts="an integer from 1 to 55000 (each node's cluster bus port is 10000 higher)")
    embedded_redis_masters: Annotated[int, at.Ge(1), at.Le(100)] = setting(
        3, EMBEDDED, "masters of the embedded Redis Cluster; partition p is aligned with master p mod n")
    embedded_spark_port: Annotated[int, at.Ge(1), at.Le(65000)] = setting(
        7077, EMBEDDED, "the master of `up --spark-workers N`; its web UI listens on port+3, worker i on "
        "port+10+i and its web UI on port+20+i", accepts="an integer from 1 to 65000 (the ports above it are used too)")
    broker_storage: Annotated[Literal["disk", "memory"], BeforeValidator(_lower)] = setting(
        "disk", EMBEDDED, "the embedded broker's log: `disk` (Tansu on `s3://` against `deploy/objectstore.py`, "
        "in `HERDFENCE_HOME/broker`) or `memory` (lost when the broker stops)")
    broker_keep_seconds: Annotated[Number, at.Ge(0)] = setting(
        30.0, EMBEDDED, "consumed `gps.reports` objects of the embedded broker are deleted after this long: every "
        "fetch lists a partition's objects, so this window bounds a fetch's cost; a backup holds retention "
        "while it copies")
    objectstore_fsync: Flag = setting(False, EMBEDDED, "the broker's object store fsyncs every object before "
                                      "acknowledging it (survives a power cut)")
    redis_appendfsync: Annotated[Literal["everysec", "always", "no", "off"], BeforeValidator(_lower)] = setting(
        "everysec", EMBEDDED, "the embedded Redis nodes' AOF: `everysec`, `always`, `no` (the OS flushes), "
        "`off` (no AOF: not durable)")
    redis_save: SaveRule = setting("3600 1", EMBEDDED, "the embedded Redis nodes' RDB snapshot rule", keep_empty=True)
    redis_maxmemory: MemorySize = setting("4gb", EMBEDDED, "maxmemory of each embedded Redis node (`noeviction`: "
                                          "writers get 507 when it is full)")
    # The streaming job
    trigger: Interval = setting("250 milliseconds", JOB, "the micro-batch trigger interval")
    max_offsets_per_trigger: Annotated[int, at.Ge(1)] = setting(
        1_000_000, JOB, "admission control: the most records per micro-batch. Only a backlog fills a batch; a "
        "bigger one pays each device's state read and write, and Spark's fixed cost per batch, once for more of "
        "its reports")
    single_task_records: Annotated[int, at.Ge(0)] = setting(
        10_000, JOB, "a micro-batch of at most this many records runs as one Spark task (one reader for all "
        "its Kafka ranges, no shuffle: `fencing/stream/batch_shape.py`); events and state are the same either "
        "way. 0: always two stages")
    silent_seconds: Annotated[Number, at.Gt(0)] = setting(
        3600.0, JOB, "a device silent this long (wall clock) gets one `silent` event")
    silent_scan_seconds: Annotated[Number, at.Gt(0)] = setting(30.0, JOB, "how often the job looks for silent devices")
    event_retention_days: Annotated[Number, at.Ge(0)] = setting(
        30.0, JOB, "each farm's event log in Redis (`GET /v1/events`) keeps this many days of events, by event "
        "time. 0: keep every event")
    event_trim_seconds: Annotated[Number, at.Gt(0)] = setting(
        600.0, JOB, "how often the job's driver drops events older than `HERDFENCE_EVENT_RETENTION_DAYS`")
    elastic: Flag = setting(True, JOB, "the elastic controller re-plans partitions and executors under skew")
    migrate_slots: Flag = setting(True, JOB, "the elastic controller moves the Redis slot of a group that moves "
                                  "whole to the aligned master (off: routing-only moves)")
    fence_preload: Flag = setting(True, JOB, "each Spark Python worker loads every fence group on its first "
                                  "batch, in one bulk build (off: only the groups its batches meet)")
    keep_warm_seconds: Annotated[Number, at.Ge(0)] = setting(
        20.0, JOB, "while no micro-batch has run for this long, a tiny job meets every pooled Python worker so "
        "that Spark keeps them (and their loaded fences). 0: off")
    job_standby: Flag = setting(True, JOB, "a hot standby job process beside the active one")
    skip_lost_offsets: Flag = setting(
        False, JOB, "the recovery from a loud data-loss failure (docs/operations.md): the job skips input "
        "offsets the broker no longer holds (logged) instead of stopping. Set it for one `up`, then unset it")
    job_lease_ms: Annotated[int, at.Ge(300)] = setting(
        600, JOB, "the active job's lease, renewed every fifth of it; a job that misses its renewals this long "
        "is replaced by the standby")
    standby_nice: Annotated[int, at.Ge(0), at.Le(19)] = setting(
        10, JOB, "the standby job's CPU niceness while it waits (applied where the process may lower it again "
        "on taking the lease). 0: off")
    fork_server: Flag = setting(True, JOB, "local Spark: the streaming query's Python runner is forked from a warm "
                                "server (a take-over's first batch starts sooner)")
    warm_daemon: Flag = setting(True, JOB, "local Spark: Python workers are forked from herdfence's daemon, which "
                                "keeps the fence map loaded, so a new worker starts with every fence (off: "
                                "pyspark's own daemon; a new worker loads the map in its first batch)")
    scale_watch: Flag = setting(True, JOB, "on a cluster master, the job follows executors added or removed")
    jvm_options: str = setting("-XX:TieredStopAtLevel=1", JOB, "extra options of the local Spark JVM (driver "
                               "and executor of `local[*]`); empty: the JVM's defaults. The class archive `make setup` builds "
                               "(`deploy/jvm_archive.py`) is added unless they name one or `-Xshare`", keep_empty=True,
                               accepts="JVM options, or empty")
    driver_memory: JvmSize = setting("2g", JOB, "the driver JVM's heap")
    # The API
    api_workers: Annotated[int, at.Ge(1), at.Le(64)] = setting(2, API, "uvicorn worker processes of the API")
    rate_device: Annotated[Number, at.Gt(0)] = setting(
        50.0, API, "requests per second (burst 2x) per device token posting reports; over it: 429")
    rate_farm_reports: Annotated[Number, at.Gt(0)] = setting(
        2000.0, API, "requests per second (burst 2x) per farm posting reports; over it: 429")
    rate_farm: Annotated[Number, at.Gt(0)] = setting(
        50_000.0, API, "requests per second (burst 2x) per farm on any route; over it: 429")
    streams_per_farm: Annotated[int, at.Ge(1)] = setting(
        100, API, "open live event streams per farm on one API worker (429 beyond)")
    webhook_allow_private: Flag = setting(False, API, "webhooks may point at loopback and private addresses "
                                          "(on-premise receivers)")
    # A cluster master (spark://, k8s://, --spark-workers)
    dynamic_allocation: Flag = setting(True, CLUSTER, "Spark dynamic allocation with shuffle tracking; "
                                       "`up --spark-workers` sets it off (the elastic controller drives executors)")
    min_executors: Annotated[int, at.Ge(0)] = setting(1, CLUSTER, "dynamic allocation's lower bound")
    max_executors: Annotated[int, at.Ge(1)] = setting(16, CLUSTER, "dynamic allocation's upper bound "
                                                      "(raised to the lower one if below it)")
    initial_executors: Annotated[int, at.Ge(0)] | None = setting(
        None, CLUSTER, "executors at start, kept within the bounds", unset="`HERDFENCE_MIN_EXECUTORS`")
    executor_cores: Annotated[int, at.Ge(1)] = setting(1, CLUSTER, "cores per executor")
    executor_memory: JvmSize = setting("1g", CLUSTER, "heap per executor")
    driver_host: Host = setting("127.0.0.1", CLUSTER, "the address executors use to reach the driver "
                                "(containers: the service name)")
    driver_bind: Host | None = setting(None, CLUSTER, "the address the driver binds (containers: `0.0.0.0`)",
                                       unset="`HERDFENCE_DRIVER_HOST`")
    executor_python: str | None = setting(None, CLUSTER, "the executors' Python interpreter",
                                          unset="Spark's default", accepts="a path")
    driver_port: Port | None = setting(None, CLUSTER, "a fixed driver port (containers, firewalls)",
                                       unset="a random port")
    blockmanager_port: Port | None = setting(None, CLUSTER, "a fixed block manager port", unset="a random port")
    shuffle_tracking_timeout: SparkTime = setting("120s", CLUSTER, "how long an executor holding shuffle data "
                                                  "is kept by dynamic allocation")
    backlog_timeout: SparkTime = setting("1s", CLUSTER, "tasks queued this long ask for more executors")
    executor_idle_timeout: SparkTime = setting("60s", CLUSTER, "an executor idle this long is given back")
    # Set by herdfence for the processes it starts
    pyfiles: str = setting("", INTERNAL, "comma-separated code artefacts the job ships with `addPyFile`; set by "
                           "`up` (when spark-submit gave `--py-files`, those are used)", accepts="paths, comma-separated")
    owner_pid: Annotated[int, at.Ge(0)] = setting(
        0, INTERNAL, "the stack stops when this process is gone (a benchmark's or a test session's stack). "
        "0: no owner")

    @model_validator(mode="before")
    @classmethod
    def _empty_is_unset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = {}
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if isinstance(value, str) and field is not None and not extra(field).get("keep_empty"):
                value = value.strip()
                if not value:
                    continue
            out[name] = value
        return out

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        return init_settings, env_settings     # the environment only: no .env file, no secrets dir


def var(name: str) -> str:
    return PREFIX + name.upper()


def extra(field: FieldInfo) -> dict:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def accepts(field: FieldInfo) -> str:
    """What the field accepts, in words: its own text, or from its type and bounds."""
    if extra(field).get("accepts"):
        return extra(field)["accepts"]
    for m in field.metadata:
        if isinstance(m, Accepts):
            return m.text
    kind = field.annotation
    if get_origin(kind) in (Union, UnionType):      # X | None: X says it
        kind = next(a for a in get_args(kind) if a is not type(None))
    for m in getattr(kind, "__metadata__", ()):
        if isinstance(m, Accepts):
            return m.text
    if get_origin(kind) is Literal:
        return "one of " + ", ".join(get_args(kind))
    base = getattr(kind, "__origin__", kind)
    bounds = {type(m).__name__: getattr(m, type(m).__name__.lower()) for m in
              [*field.metadata, *getattr(kind, "__metadata__", ())] if isinstance(m, (at.Ge, at.Gt, at.Le))}
    noun = "an integer" if base is int else "a number" if base is float else "text"
    fmt = (lambda v: f"{v:g}")
    if "Ge" in bounds and "Le" in bounds:
        return f"{noun} from {fmt(bounds['Ge'])} to {fmt(bounds['Le'])}"
    if "Ge" in bounds:
        return f"{noun} of at least {fmt(bounds['Ge'])}"
    if "Gt" in bounds:
        return f"{noun} greater than {fmt(bounds['Gt'])}"
    return noun


class _MappingEnv(EnvSettingsSource):
    """The env source over a given mapping instead of os.environ (load_settings(env) takes one)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._given = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._given.items()}


def read_env(env: Mapping[str, str] | None = None) -> HerdfenceEnv:
    """The validated settings of `env` (default os.environ); ConfigError names every bad variable."""
    env = os.environ if env is None else env
    return _read(tuple(sorted((k, v) for k, v in env.items() if k.upper().startswith(PREFIX))))


@lru_cache(maxsize=32)     # asked for per micro-batch (Settings.redis_node) with the same variables
def _read(items: tuple[tuple[str, str], ...]) -> HerdfenceEnv:
    given = dict(items)
    try:
        return HerdfenceEnv(_build_sources=((_MappingEnv(HerdfenceEnv, given),), {}))
    except ValidationError as e:
        raw = {k.upper(): v for k, v in given.items()}
        problems = []
        for err in e.errors():
            name = str(err["loc"][0]) if err["loc"] else ""
            field = HerdfenceEnv.model_fields.get(name)
            if field is None:
                problems.append(f"herdfence settings: {err['msg']}")
                continue
            line = f"{var(name)}={raw.get(var(name), err.get('input'))!r} is not valid: {accepts(field)}"
            if line not in problems:
                problems.append(line)
        raise ConfigError(problems) from None


def unknown_vars(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """HERDFENCE_* variables that are no setting (a typo?): herdfence ignores them."""
    env = os.environ if env is None else env
    known = {var(n) for n in HerdfenceEnv.model_fields}
    return {k: v for k, v in sorted(env.items()) if k.upper().startswith(PREFIX) and k.upper() not in known}


# --- checks of single values (the job checks its master at start; deploy/validate.py the rest) ---------
def _hostport(variable: str, value: str) -> tuple[str, int]:
    if hostport_problem(value):
        raise DeployError(f"{variable}={value!r} is malformed: {hostport_problem(value)}")
    m = _HOSTPORT.match(value.strip())
    return m.group(1).strip("[]"), int(m.group(2))


def _tcp(host: str, port: int, timeout: float = 3.0) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return e.strerror or str(e)


def check_spark_master(url: str, reach: bool = False) -> None:
    """local / local[N] / local[*] / spark://h:p[,h:p] / k8s://https://h[:p] / yarn; with `reach`, a
    spark:// master must accept connections."""
    variable = "HERDFENCE_SPARK_MASTER"
    problem = spark_master_problem(url)
    if problem:
        raise DeployError(f"{variable}={url!r} is malformed: {problem}")
    if reach and url.startswith("spark://"):
        hosts = url[len("spark://"):].split(",")
        addrs = [_hostport(variable, h) for h in hosts]
        if all(_tcp(h, p) for h, p in addrs):
            raise DeployError(f"{variable}={url!r}: no Spark master answers at {', '.join(hosts)} "
                              f"({_tcp(*addrs[0])}); start it or fix the URL")
