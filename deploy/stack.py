"""The whole embedded stack: up / down / status.

Order up: broker, Redis Cluster, (Spark standalone master + workers), job, API, (supervisor).
Order down: supervisor, job, API, Spark, Redis, broker, its object store. Everything is stopped by its recorded PID.
Components that are alive are left alone, so `up --detach` run again restarts only what is down.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass

import httpx

from deploy import artifact, broker, procs, redis_cluster, spark_cluster, validate
from fencing.elastic import scale
from deploy.procs import DeployError
from fencing.config import TOPIC_REPORTS, TUNING, Settings
from deploy.supervisor import NAME as SUPERVISOR, Supervisor
from fencing.model import keys

JOB, JOB_STANDBY, API = "job", "job_standby", "api"
JOBS = (JOB, JOB_STANDBY)     # two job processes: the lease decides which is active (fencing.model.lease)
PING_KEY = b"__herdfence_ping__"
PING_EVERY_S = 20.0
READY_TIMEOUT_S = 180.0


def _say(msg: str) -> None:
    print(f"herdfence: {msg}", file=sys.stderr, flush=True)


# --- component specs -----------------------------------------------------------------------------
def settings_env(settings: Settings) -> dict[str, str]:
    """The HERDFENCE_* variables that reproduce `settings` in a child process."""
    env = {"HERDFENCE_HOME": str(settings.home), "HERDFENCE_API_PORT": str(settings.api_port),
           "HERDFENCE_EMBEDDED_KAFKA_PORT": str(settings.embedded_kafka_port),
           "HERDFENCE_EMBEDDED_REDIS_PORT": str(settings.embedded_redis_port),
           "HERDFENCE_EMBEDDED_REDIS_MASTERS": str(settings.embedded_redis_masters),
           "HERDFENCE_BROKER_STORAGE": "disk" if settings.broker_durable else "memory",
           "HERDFENCE_REDIS_MAXMEMORY": settings.redis_maxmemory,
           "HERDFENCE_REDIS_APPENDFSYNC": settings.redis_appendfsync, "HERDFENCE_REDIS_SAVE": settings.redis_save}
    for var, value in (("HERDFENCE_KAFKA", settings.kafka), ("HERDFENCE_REDIS", settings.redis),
                       ("HERDFENCE_SPARK_MASTER", settings.spark_master)):
        if value:
            env[var] = value
    return env


def job_spec(settings: Settings, spark_master: str | None, pyfiles: list[str] | None = None,
             executors: int = 0, name: str = JOB) -> procs.ProcSpec:
    env = {**settings_env(settings), "PYSPARK_PYTHON": sys.executable}
    if spark_master:
        env["HERDFENCE_SPARK_MASTER"] = spark_master
    if pyfiles:               # the executors' code (deploy/artifact.py), shipped by the job's SparkContext
        env[artifact.ENV] = ",".join(pyfiles)
    if executors:
        # The embedded standalone cluster: the executor count is driven explicitly (fencing/elastic/scale.py:
        # the elastic controller, `up --spark-workers N`), not by Spark's dynamic allocation, which
        # refuses killExecutors and overrides requestExecutors. HERDFENCE_DYNAMIC_ALLOCATION=1 switches.
        env["HERDFENCE_DYNAMIC_ALLOCATION"] = "0"
        env["HERDFENCE_INITIAL_EXECUTORS"] = str(executors)
    for var in ("HERDFENCE_MIN_EXECUTORS", "HERDFENCE_MAX_EXECUTORS", "HERDFENCE_INITIAL_EXECUTORS",
                "HERDFENCE_DYNAMIC_ALLOCATION", "HERDFENCE_EXECUTOR_MEMORY", "HERDFENCE_EXECUTOR_CORES",
                "HERDFENCE_TRIGGER", "HERDFENCE_MAX_OFFSETS_PER_TRIGGER", "HERDFENCE_ELASTIC"):
        if os.environ.get(var):
            env[var] = os.environ[var]
    return procs.ProcSpec(name=name, argv=[sys.executable, "-m", "fencing.stream.job", "--process", name],
                          markers=["-m fencing.stream.job", f"--process {name}"], env=env, cwd=os.getcwd())


def api_spec(settings: Settings) -> procs.ProcSpec:
    port = str(settings.api_port)
    return procs.ProcSpec(
        name=API, argv=[sys.executable, "-m", "uvicorn", "api.app:app", "--host", "127.0.0.1",
                        "--port", port, "--timeout-graceful-shutdown", "3", "--no-access-log",
                        "--http", "api.serving:NoDelayHTTP",
                        "--workers", str(TUNING.api_workers)],
        markers=["uvicorn", "api.app:app", f"--port {port}"], port=settings.api_port,
        port_env="HERDFENCE_API_PORT", env=settings_env(settings), cwd=os.getcwd())


def supervisor_spec(settings: Settings) -> procs.ProcSpec:
    return procs.ProcSpec(name=SUPERVISOR, argv=[sys.executable, "-m", "deploy.supervisor"],
                          markers=["-m deploy.supervisor"], env=settings_env(settings), cwd=os.getcwd())


# --- readiness -----------------------------------------------------------------------------------
def api_healthy(settings: Settings, timeout: float = 2.0) -> bool:
    try:
        r = httpx.get(f"{settings.api_url}/healthz", timeout=timeout)
        return r.status_code == 200 and r.json().get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


@dataclass
class _Pinger:
    """Sends control pings through gps.reports; the job answers each by setting {job}:ping:<id>."""
    settings: Settings

    def __post_init__(self) -> None:
        from confluent_kafka import Producer

        from ingest.producer import PARTITIONER
        self.producer = Producer({"bootstrap.servers": self.settings.kafka_bootstrap, **PARTITIONER})
        self.redis = redis_cluster.connect(self.settings)
        self.ids: list[str] = []

    def send(self) -> None:
        ping_id = uuid.uuid4().hex
        self.producer.produce(TOPIC_REPORTS, key=PING_KEY,
                              value=json.dumps({"control": "ping", "id": ping_id}).encode())
        self.producer.flush(10)
        self.ids.append(ping_id)

    def answered(self) -> bool:
        try:
            return any(self.redis.exists(keys.JOB_PING.format(i)) for i in self.ids)
        except Exception:  # noqa: BLE001 - a Redis hiccup: keep polling
            return False


def job_activity(redis) -> dict:
    """What the job is doing: the batch it runs now ("running": id, seconds, planned end offsets) or
    none, and the last batch it finished ("last_batch"). What `up` names while it waits."""
    from fencing.model.heartbeat import read_progress, read_running_batch
    running, done = read_running_batch(redis), read_progress(redis)
    out: dict = {"last_batch": done.batch_id if done else None}
    if running is not None and (done is None or running.batch_id > done.batch_id):
        out["running"] = {"batch_id": running.batch_id, "seconds": round(time.time() - running.started, 1),
                          "planned_ends": running.planned_ends}
    return out


def _job_waiting_note(settings: Settings) -> str:
    """'; the job runs batch 19 for 42 s (gps.reports ends {...})', or '' when there is nothing to say."""
    try:
        activity = job_activity(redis_cluster.connect(settings))
    except Exception:  # noqa: BLE001 - Redis away: say nothing more
        return ""
    running = activity.get("running")
    if running is None:
        return "" if activity["last_batch"] is None else f"; the job's last batch was {activity['last_batch']}"
    return (f"; the job has run batch {running['batch_id']} for {running['seconds']:.0f} s, reading {TOPIC_REPORTS} "
            f"up to offsets {running['planned_ends']} (see {procs.log_path(settings, JOB)})")


def wait_ready(settings: Settings, timeout: float = READY_TIMEOUT_S,
               supervisor: Supervisor | None = None) -> None:
    """Until the API answers /healthz and the job has completed a micro-batch (answered a ping).

    `supervisor`: an in-process one to step while waiting (foreground); else a detached one may run.
    """
    start = time.monotonic()
    pinger = _Pinger(settings)
    last_ping = last_note = -1e9
    api_ok = job_ok = False
    while True:
        now = time.monotonic()
        api_ok = api_ok or api_healthy(settings)
        if now - last_ping >= PING_EVERY_S and not job_ok:
            pinger.send()
            last_ping = now
        job_ok = job_ok or pinger.answered()
        if api_ok and job_ok:
            return
        if supervisor is not None:
            supervisor.step()
        restarter = supervisor is not None or procs.alive_record(settings, SUPERVISOR) is not None
        for name in (JOB, API):
            rec = procs.read_record(settings, name)
            if rec is None or rec.gave_up or not (restarter or procs.record_alive(rec)):
                raise DeployError(f"the {name} is not running (it crashed):\n{procs.log_tail(settings, name)}"
                                  f"\nfull log: {procs.log_path(settings, name)}")
        if now - start > timeout:
            waiting = [w for w, ok in (("the API's /healthz", api_ok), ("the job's first micro-batch",
                                                                         job_ok)) if not ok]
            note = _job_waiting_note(settings) if not job_ok else ""
            raise DeployError(f"not ready after {timeout:.0f} s: still waiting for {' and '.join(waiting)}{note};"
                              f" logs in {settings.run_dir}; the stack is left running (herdfence down)")
        if now - last_note >= 10:
            what = "API" if not api_ok else "first micro-batch of the job"
            note = _job_waiting_note(settings) if api_ok and now - start >= 30 else ""
            _say(f"waiting for the {what} ({now - start:.0f} s){note}")
            last_note = now
        time.sleep(0.5)


# --- up / down / status --------------------------------------------------------------------------
def _preflight(settings: Settings, spark_workers: int = 0, redis_replicas: int = 0) -> None:
    """Validate the configuration before anything starts (clear errors, no half-started stack)."""
    found = validate.check(settings, spark_workers)
    for what, value in found.items():
        _say(f"external {what}: {value}")
    spark_cluster.check_java()          # the job is a Spark driver
    if settings.redis is None and shutil.which("redis-server") is None:
        raise DeployError("redis-server is required: run make setup")
    for port, env_hint in _ports_to_take(settings, redis_replicas):
        procs.ensure_port_free(port, env_hint)


def _ports_to_take(settings: Settings, redis_replicas: int = 0) -> list[tuple[int, str]]:
    """The ports the embedded components that are not running yet will listen on: all checked before
    any starts, so a taken one stops `up` before it has started anything."""
    ports = [(port, broker.PORT_ENV) for port in broker.ports_to_take(settings)]
    ports += [(port, redis_cluster.PORT_ENV) for port in redis_cluster.ports_to_take(settings, redis_replicas)]
    if procs.alive_record(settings, API) is None:
        ports.append((settings.api_port, "HERDFENCE_API_PORT"))
    return ports


def _start_unless_alive(settings: Settings, spec: procs.ProcSpec) -> procs.ProcRecord:
    rec = procs.alive_record(settings, spec.name)
    if rec is None:
        rec = procs.start(settings, spec)
        _say(f"started {spec.name} (pid {rec.pid}, log {procs.log_path(settings, spec.name)})")
    return rec


def start_components(settings: Settings, spark_workers: int = 0, redis_replicas: int = 0,
                     supervise: bool = False) -> None:
    """Start every component that is not running (no readiness wait beyond ports)."""
    _preflight(settings, spark_workers, redis_replicas)
    fresh_broker = broker.up(settings)
    redis_cluster.up(settings, redis_replicas)
    # Keep a standalone cluster that an earlier `up --spark-workers N` started.
    workers_before = [n for n in spark_cluster.started_workers(settings) if procs.alive_record(settings, n)]
    spark_workers = spark_workers or len(spark_cluster.started_workers(settings))
    master = spark_cluster.up(settings, spark_workers) if spark_workers else None
    pyfiles: list[str] = []
    if master or (settings.spark_master and not settings.spark_master.startswith("local")):
        pyfiles = [str(artifact.build(settings))]
        _say(f"executors' code: {pyfiles[0]}")
    if fresh_broker:
        # The embedded broker keeps its log in memory: a restarted broker starts at offset 0, so a
        # running job and an old checkpoint both point at offsets that no longer exist.
        procs.stop_many(settings, list(JOBS))
        if settings.checkpoint_dir.exists():
            _say(f"fresh embedded broker: clearing the old job checkpoint {settings.checkpoint_dir}")
            shutil.rmtree(settings.checkpoint_dir, ignore_errors=True)
    job_was_alive = procs.alive_record(settings, JOB) is not None
    _start_unless_alive(settings, job_spec(settings, master, pyfiles, spark_workers))
    if TUNING.job_standby:      # the hot standby: warm, takes the lease when the active job loses it
        _start_unless_alive(settings, job_spec(settings, master, pyfiles, spark_workers, JOB_STANDBY))
    else:
        procs.stop(settings, JOB_STANDBY)
    added = spark_workers - len(workers_before)
    if master and job_was_alive and workers_before and added > 0:
        # The running job asks for executors on the new workers (fencing/elastic/scale.py RequestWatcher).
        scale.post_request(redis_cluster.connect(settings), add=added)
        _say(f"asked the running job for {added} more executor(s)")
    api = _start_unless_alive(settings, api_spec(settings))
    procs.wait_for_port(settings.api_port, 60, api, settings)
    if supervise:
        _start_unless_alive(settings, supervisor_spec(settings))


def up(settings: Settings, detach: bool = False, spark_workers: int = 0, redis_replicas: int = 0,
       timeout: float = READY_TIMEOUT_S) -> dict:
    """Start the stack. detach=True: return once ready (status dict); else run until Ctrl-C/SIGTERM."""
    if detach:
        start_components(settings, spark_workers, redis_replicas, supervise=True)
        wait_ready(settings, timeout)
        result = status(settings)
        if result["ok"]:
            _say(f"ready: open {settings.api_url}/ ; `herdfence down` stops everything")
        return result
    return _foreground(settings, spark_workers, redis_replicas, timeout)


def _foreground(settings: Settings, spark_workers: int, redis_replicas: int, timeout: float) -> dict:
    stop = threading.Event()
    supervisor = Supervisor(settings)

    def on_term(*_: object) -> None:
        raise KeyboardInterrupt      # same path as Ctrl-C, also while blocked in a wait
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        start_components(settings, spark_workers, redis_replicas)
        _say(f"UI and API at {settings.api_url}/ (waiting for the job's first micro-batch)")
        try:
            wait_ready(settings, timeout, supervisor)
            _say(f"ready: open {settings.api_url}/ ; Ctrl-C stops everything")
        except DeployError as e:
            _say(f"{e}\n(still running; Ctrl-C stops everything)")
        supervisor.run(stop)
    except KeyboardInterrupt:
        _say("stopping ...")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # do not interrupt our own shutdown
        down(settings)
        signal.signal(signal.SIGTERM, previous)
    return status(settings)


def down(settings: Settings) -> list[str]:
    """Stop everything `up` started, by PID; returns the names of the processes that were running.

    The supervisor goes first (else it would restart what we stop), then job + API, Spark, Redis,
    broker; the members of each step stop in parallel.
    """
    steps = [[SUPERVISOR], [*JOBS, API], [*spark_cluster.started_workers(settings)], [spark_cluster.MASTER],
             [n.name for n in redis_cluster.recorded_nodes(settings)], [broker.NAME], [broker.STORE]]
    return [name for step in steps for name in procs.stop_many(settings, step)]


def _proc_status(settings: Settings, name: str) -> dict:
    rec = procs.read_record(settings, name)
    alive = procs.record_alive(rec)
    out = {"pid": rec.pid if alive else None, "ok": alive}
    if rec is not None and rec.spec.port is not None:
        out["port"] = rec.spec.port
    if rec is not None:
        out["restarts"] = rec.restarts
        if rec.gave_up:
            out["gave_up"] = True
    return out


def _job_status(settings: Settings) -> dict[str, dict]:
    """`job`: the job process holding the lease (the active one), `job_standby`: the other one, each
    with the process record it runs under ("process"). Before any lease (starting), by record."""
    found = {name: _proc_status(settings, name) for name in JOBS if procs.read_record(settings, name)}
    found.setdefault(JOB, _proc_status(settings, JOB))
    holder = ready = None
    try:
        from fencing.model.lease import lease_holder, standby_holder
        redis = redis_cluster.connect(settings)
        holder, ready = lease_holder(redis), standby_holder(redis)
    except Exception:  # noqa: BLE001 - Redis away: report by record
        pass
    active = next((n for n, s in found.items() if holder and s["pid"] and holder.endswith(f":{s['pid']}")), None)
    order = [active] + [n for n in JOBS if n != active and n in found] if active else \
        [n for n in JOBS if n in found]
    out = {}
    for role, name in zip(JOBS, order):
        out[role] = {**found[name], "process": name,
                     "role": "active" if name == active else "standby" if active else "starting"}
        if out[role]["role"] == "standby":          # warm and waiting (fencing.stream.job)
            out[role]["ready"] = bool(ready and found[name]["pid"] and ready.endswith(f":{found[name]['pid']}"))
    return out


def status(settings: Settings) -> dict:
    """{"ok": bool, "components": {name: {"pid", "port"?, "ok", ...}}}."""
    comps: dict[str, dict] = {"broker": broker.status(settings), "redis": redis_cluster.status(settings)}
    comps.update(spark_cluster.status(settings))
    comps.update(_job_status(settings))
    try:
        from fencing.model.heartbeat import read_log_gaps
        redis = redis_cluster.connect(settings)
        comps[JOB].update(job_activity(redis))
        # offsets of gps.reports that no record held and the job skipped (ingest/kafka_read.py)
        comps["broker"]["log_gaps"] = read_log_gaps(redis)
    except Exception:  # noqa: BLE001 - Redis away: the components say so themselves
        pass
    if settings.spark_master:
        comps[JOB]["spark_master"] = settings.spark_master
    api = _proc_status(settings, API)
    api["port"] = settings.api_port
    api["ok"] = api["ok"] and api_healthy(settings)
    comps[API] = api
    if procs.read_record(settings, SUPERVISOR) is not None:
        comps[SUPERVISOR] = _proc_status(settings, SUPERVISOR)
    return {"ok": all(c["ok"] for c in comps.values()), "components": comps}
