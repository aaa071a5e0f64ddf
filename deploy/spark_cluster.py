"""A local Spark standalone cluster (a master and N worker JVMs) from the pyspark distribution.

Ports: the master listens on HERDFENCE_EMBEDDED_SPARK_PORT (default 7077); its web UI on port+3;
worker i (1-based) on port+10+i, its web UI on port+20+i. All bound to 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

from deploy import procs
from fencing.config import Settings, read_env
from fencing.stream.class_archive import spark_home, with_class_archive

MASTER = "spark_master"
DEFAULT_PORT = 7077
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
PORT_ENV = "HERDFENCE_EMBEDDED_SPARK_PORT"


@dataclass(frozen=True)
class SparkPorts:
    master: int

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> SparkPorts:
        return cls(read_env(env).embedded_spark_port)

    @property
    def master_ui(self) -> int:
        return self.master + 3

    def worker(self, i: int) -> int:
        return self.master + 10 + i

    def worker_ui(self, i: int) -> int:
        return self.master + 20 + i

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master}"


def worker_name(i: int) -> str:
    return f"spark_worker_{i}"


def java_binary() -> str | None:
    """The `java` Spark's launcher runs: JAVA_HOME's, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    return shutil.which("java", path=os.path.join(home, "bin")) if home else shutil.which("java")


def check_java() -> None:
    """Spark 4 needs Java 17+; say so before any JVM fails with a cryptic message."""
    java = java_binary()
    if java is None:
        raise procs.DeployError("Java 17 is required: run make setup")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)', out)
    if m is None or int(m.group(1)) < 17:
        raise procs.DeployError(f"Java 17 is required (found: {out.splitlines()[:1]}): run make setup")


def _env(settings: Settings) -> dict[str, str]:
    work = settings.home / "spark"
    return {"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(work / "logs"), "SPARK_WORKER_DIR": str(work / "work"),
            # Executors must run the venv's Python (with shapely, h3, ...), not the system one.
            "PYSPARK_PYTHON": sys.executable,
            # the master and workers start from the job's class archive: the same jars, the same classpath
            "SPARK_DAEMON_JAVA_OPTS": with_class_archive(os.environ.get("SPARK_DAEMON_JAVA_OPTS", ""))}


def _class_argv(cls: str, *args: str) -> list[str]:
    return [str(spark_home() / "bin" / "spark-class"), cls, *args]


def master_spec(settings: Settings, ports: SparkPorts) -> procs.ProcSpec:
    return procs.ProcSpec(
        name=MASTER, markers=[MASTER_CLASS, f"--port {ports.master}"], port=ports.master,
        port_env=PORT_ENV, env=_env(settings),
        argv=_class_argv(MASTER_CLASS, "--host", "127.0.0.1", "--port", str(ports.master),
                         "--webui-port", str(ports.master_ui)))


def worker_spec(settings: Settings, ports: SparkPorts, i: int) -> procs.ProcSpec:
    return procs.ProcSpec(
        name=worker_name(i), markers=[WORKER_CLASS, f"--port {ports.worker(i)}"], port=ports.worker(i),
        port_env=PORT_ENV, env=_env(settings),
        argv=_class_argv(WORKER_CLASS, "--host", "127.0.0.1", "--port", str(ports.worker(i)),
                         "--webui-port", str(ports.worker_ui(i)), "--cores", "1", "--memory", "2g",
                         "--work-dir", str(settings.home / "spark" / "work"), ports.master_url))


def alive_workers(ports: SparkPorts) -> int:
    """ALIVE workers as the master sees them (its web UI's JSON view)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ports.master_ui}/json/", timeout=2) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


def up(settings: Settings, workers: int, ports: SparkPorts | None = None) -> str:
    """Start the master and workers that are down; wait until `workers` are registered."""
    ports = ports or SparkPorts.from_env()
    check_java()
    master = procs.alive_record(settings, MASTER) or procs.start(settings, master_spec(settings, ports))
    procs.wait_for_port(ports.master, 60, master, settings)
    for i in range(1, workers + 1):
        if procs.alive_record(settings, worker_name(i)) is None:
            procs.start(settings, worker_spec(settings, ports, i))
    deadline = time.monotonic() + 90
    while alive_workers(ports) < workers:
        for i in range(1, workers + 1):
            rec = procs.read_record(settings, worker_name(i))
            if not procs.record_alive(rec):
                raise procs.DeployError(f"{worker_name(i)} exited:\n{procs.log_tail(settings, worker_name(i))}")
        if time.monotonic() > deadline:
            raise procs.DeployError(f"only {alive_workers(ports)} of {workers} Spark workers registered "
                                    f"with {ports.master_url}")
        time.sleep(0.5)
    return ports.master_url


def started_workers(settings: Settings) -> list[str]:
    return [n for n in procs.recorded_names(settings) if n.startswith("spark_worker_")]


def down(settings: Settings) -> list[str]:
    return procs.stop_many(settings, started_workers(settings)) + procs.stop_many(settings, [MASTER])


def status(settings: Settings) -> dict[str, dict]:
    """{} when no standalone cluster was started."""
    out = {}
    for name in [MASTER, *started_workers(settings)]:
        rec = procs.read_record(settings, name)
        if rec is None:
            continue
        alive = procs.record_alive(rec)
        out[name] = {"pid": rec.pid if alive else None, "port": rec.spec.port, "ok": alive}
    if out.get(MASTER, {}).get("ok"):
        ui = out[MASTER]["port"] + 3
        out[MASTER]["ui_port"] = ui
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                st = json.load(r)
            out[MASTER].update(url=st.get("url"), alive_workers=st.get("aliveworkers"),
                               cores=st.get("cores"), cores_used=st.get("coresused"),
                               apps=[a.get("name") for a in st.get("activeapps", [])])
        except (OSError, ValueError):
            pass
    return out
