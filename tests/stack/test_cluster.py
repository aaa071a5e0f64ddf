"""The job on a local Spark standalone cluster (`herdfence up --detach --spark-workers 2`): its own
stack (own HERDFENCE_HOME and ports), started through the real CLI and stopped at the end.

* the acceptance flow of tests/stack/test_flow.py, unchanged (the same test functions, run against this
  module's `stack` fixture): report → enter → query → exit → query, errors and tenancy;
* status --json shows spark_master and spark_worker_1/2;
* the master, workers and executors start from the job's class archive;
* the executors import herdfence from the shipped artefact (HERDFENCE_HOME/dist/*.zip), not from the
  source tree;
* `up --detach --spark-workers 3` adds a worker to the running stack and the job runs tasks on it;
  an executor killed through fencing/elastic/scale.py is not replaced.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import HERDFENCE, OFFSET, POOL, ROOT, Stack, keep_logs, wait_for
from tests.farmkit import Farm, square
# The acceptance flow, unchanged: collected here again, so it runs on this module's cluster stack.
from tests.stack.test_flow import test_enter_query_exit_query, test_errors_and_tenancy  # noqa: F401

SPARK_PORT = 23077 + OFFSET
CLUSTER_PORTS = {"HERDFENCE_EMBEDDED_KAFKA_PORT": str(23092 + OFFSET), "HERDFENCE_EMBEDDED_REDIS_PORT": str(12101 + OFFSET),
                 "HERDFENCE_API_PORT": str(23800 + OFFSET), "HERDFENCE_EMBEDDED_SPARK_PORT": str(SPARK_PORT)}
MASTER_UI = SPARK_PORT + 3
pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Stack:
    """Overrides conftest's session stack for this module: a standalone cluster with 2 workers."""
    home = tmp_path_factory.mktemp("herdfence-cluster")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDFENCE_")}
    env.update(CLUSTER_PORTS, HERDFENCE_HOME=str(home), HERDFENCE_OWNER_PID=str(os.getpid()), HERDFENCE_TRIGGER="200 milliseconds")
    s = Stack(env=env, api_url=f"http://127.0.0.1:{CLUSTER_PORTS['HERDFENCE_API_PORT']}")
    try:
        t0 = time.monotonic()
        POOL.use("cluster", s, ("--spark-workers", "2"))       # the other stacks of the suite stop first
        print(f"cluster stack up in {time.monotonic() - t0:.0f} s")
        yield s
    finally:
        POOL.stop("cluster")
        keep_logs(home, "cluster-")


def _home(stack: Stack) -> Path:
    return Path(stack.env["HERDFENCE_HOME"])


def _master_json() -> dict:
    from fencing.elastic.scale import master_state
    return master_state(MASTER_UI)


def _executor_dirs(stack: Stack) -> dict[str, Path]:
    """{executor id: its work dir} of the job's application on the local workers."""
    # the newest application with executors: the hot standby's application holds none
    for app in sorted((_home(stack) / "spark" / "work").glob("app-*"), reverse=True):
        dirs = {d.name: d for d in app.iterdir() if d.is_dir()}
        if dirs:
            return dirs
    return {}


def _tasks_run(d: Path) -> int:
    try:
        return (d / "stderr").read_text(errors="replace").count("Running task")
    except FileNotFoundError:
        return 0


def test_status_shows_standalone_cluster(stack):
    st = json.loads(stack.cli("status", "--json"))
    comps = st["components"]
    assert st["ok"], comps
    for name in ("broker", "redis", "job", "api", "spark_master", "spark_worker_1", "spark_worker_2"):
        assert comps[name]["ok"] and comps[name]["pid"], name
    assert comps["spark_master"]["port"] == SPARK_PORT
    assert comps["spark_master"]["alive_workers"] == 2
    # the job and its hot standby, a second application that holds no executor while it stands by; the
    # standby warms after `up` returns, so its application registers a little later
    apps = wait_for(lambda: (lambda a: a if len(a) >= 2 else None)(_master_json()["activeapps"]),
                    timeout=90, what="the standby's application on the master")
    assert [a["name"] for a in apps] == ["herdfence", "herdfence"], apps
    assert sorted(a["cores"] for a in apps)[0] == 0, apps


def test_the_cluster_jvms_start_from_the_class_archive(stack):
    """The master, the workers and the job's executors start from the job's class archive (the same
    jars, the same classpath as the driver's): its pages are resident in each of them."""
    import psutil

    from fencing.stream.class_archive import class_archive
    from tests.chaoskit import archive_resident_kb

    archive = class_archive()
    assert archive is not None and archive.is_file()
    comps = json.loads(stack.cli("status", "--json"))["components"]
    daemons = {name: int(comps[name]["pid"]) for name in ("spark_master", "spark_worker_1", "spark_worker_2")}

    def executors() -> dict[str, int]:
        found = {}
        for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
            cmd, cwd = proc.info["cmdline"] or [], proc.info["cwd"] or ""
            if any("CoarseGrainedExecutorBackend" in c for c in cmd) and cwd.startswith(str(_home(stack))):
                found[f"executor {proc.info['pid']}"] = proc.info["pid"]
        return found
    jvms = {**daemons, **wait_for(executors, timeout=60, what="the job's executors")}
    resident = {name: archive_resident_kb(pid, archive) for name, pid in jvms.items()}
    assert all(kb > 10_000 for kb in resident.values()), f"kB of {archive} resident: {resident}"


def test_executors_import_the_shipped_artefact(stack):
    home = _home(stack)
    [zip_path] = sorted((home / "dist").glob("herdfence-*.zip"))[-1:]
    probe = wait_for(lambda: (lambda p: json.loads(p.read_text()) if p.exists() else None)(
        home / "run" / "executors.json"), timeout=60, what="the executor probe")
    assert probe["workers"]
    for w in probe["workers"]:
        # "./herdfence-0.1.0-<hash>.zip/fencing/__init__.py" inside the executor's work dir
        assert f"{zip_path.name}/fencing/__init__.py" in w["fencing"], w
        assert f"{zip_path.name}/ingest/__init__.py" in w["ingest"], w
        assert str(ROOT) not in w["fencing"] and w["executor_cwd"].startswith(str(home / "spark" / "work"))
    # the job's log says so too (the active job's: either job process may hold the lease)
    log = "".join((home / "run" / f"{name}.log").read_text(errors="replace") for name in ("job", "job_standby")
                  if (home / "run" / f"{name}.log").exists())
    assert f"imports fencing from ./{zip_path.name}/fencing/__init__.py" in log


def test_add_a_worker_and_the_job_uses_it(stack):
    before = _master_json()
    assert before["aliveworkers"] == 2
    stack.cli("up", "--detach", "--spark-workers", "3", timeout=300)
    st = json.loads(stack.cli("status", "--json"))
    assert st["components"]["spark_worker_3"]["ok"]
    # the master gives the job an executor on the new worker ...
    wait_for(lambda: _master_json()["coresused"] == 3, timeout=60, what="3 executor cores in use")
    from fencing.elastic.scale import busy_workers
    assert busy_workers(_master_json()) == 3
    dirs = wait_for(lambda: (lambda d: d if len(d) == 3 else None)(_executor_dirs(stack)), timeout=30,
                    what="a third executor")
    newest = dirs[max(dirs, key=int)]
    # ... and runs micro-batch tasks there, with the code shipped to it
    farm = Farm(stack, "scale")
    farm.fence(square(8.50, 47.00))
    for i in range(8):
        farm.report(f"cow-s{i}", (8.505, 47.005), (8.506, 47.006))

    def used() -> bool:
        # a task ran there, and the executor fetched the artefact (it does so for its first task)
        if _tasks_run(newest) > 0 and list(newest.glob("herdfence-*.zip")):
            return True
        farm.report("cow-s0", (8.505, 47.005))     # keep micro-batches coming
        return False
    wait_for(used, timeout=60, interval=1.0, what=f"tasks on the new executor {newest}")
    # job:executors is republished every 2 s: wait for the view that includes the new executor
    execs = wait_for(lambda: (lambda e: e if len(e["executor_ids"]) == 3 else None)(
        json.loads(stack.redis.get("job:executors"))), timeout=30, what="job:executors with 3 executors")
    assert execs["last_request"]["add"] == 1

    # the controller's other direction (fencing/elastic/scale.py through the job's RequestWatcher): give it back
    from fencing.elastic.scale import post_request
    post_request(stack.redis, kill=[newest.name])
    wait_for(lambda: (lambda e: e["executor_ids"] == sorted(set(dirs) - {newest.name}, key=int)
                      and e["last_request"].get("result", {}).get("killed") == [newest.name])(
        json.loads(stack.redis.get("job:executors"))), timeout=30, what="the executor killed")
    # not replaced: the job still runs on the other two once the master had its chance to offer a
    # replacement: the executors' view republished four more times (every 2 s) and a report processed
    # meanwhile (the master's core count is no measure any more: the hot standby is a second
    # application, free to take a core a worker offers)
    killed_at = json.loads(stack.redis.get("job:executors"))["time"]
    ts = farm.report("cow-s1", (8.505, 47.005))[-1]
    farm.wait_seen("cow-s1", ts, timeout=60)
    later = wait_for(lambda: (lambda e: e if e["time"] >= killed_at + 8 else None)(
        json.loads(stack.redis.get("job:executors"))), timeout=60, what="the executors' view 8 s later")
    assert later["executor_ids"] == sorted(set(dirs) - {newest.name}, key=int)


# --- configuration validated at start (no stack needed: `up` must refuse before starting anything) ----
def _up_fails(tmp_path, rc: int = 1, **env_vars) -> str:
    """`up` refuses: 2 for a value the setting does not accept (before anything runs), 1 for one it
    cannot use (nothing answers there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDFENCE_")}
    env.update(CLUSTER_PORTS, HERDFENCE_HOME=str(tmp_path / "home"), HERDFENCE_OWNER_PID=str(os.getpid()), **env_vars)
    done = subprocess.run([HERDFENCE, "up", "--detach"], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == rc, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not list((tmp_path / "home" / "run").glob("*.pid")), "something was started"
    return done.stderr


def test_malformed_spark_master_is_refused(tmp_path):
    err = _up_fails(tmp_path, 2, HERDFENCE_SPARK_MASTER="spark:/127.0.0.1")
    assert "HERDFENCE_SPARK_MASTER='spark:/127.0.0.1' is not valid: a Spark master URL" in err
    err = _up_fails(tmp_path, HERDFENCE_SPARK_MASTER="spark://127.0.0.1:1")
    assert "no Spark master answers" in err


def test_unreachable_kafka_is_refused(tmp_path):
    err = _up_fails(tmp_path, HERDFENCE_KAFKA="127.0.0.1:1")
    assert "HERDFENCE_KAFKA=127.0.0.1:1: no Kafka broker answers" in err
    assert "HERDFENCE_KAFKA='kafka-without-port' is not valid: host:port" in _up_fails(
        tmp_path, 2, HERDFENCE_KAFKA="kafka-without-port")


def test_redis_not_a_cluster_or_unreachable_is_refused(tmp_path):
    assert "Redis is unreachable" in _up_fails(tmp_path, HERDFENCE_REDIS="127.0.0.1:1")
    port = 23199 + OFFSET         # a plain (non-cluster) redis-server of our own
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from deploy.procs import port_open
        wait_for(lambda: port_open(port), timeout=10, what="the plain redis-server")
        err = _up_fails(tmp_path, HERDFENCE_REDIS=f"127.0.0.1:{port}")
        assert f"HERDFENCE_REDIS=127.0.0.1:{port} is a Redis server without cluster mode" in err
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("masters", [1, 5])
def test_redis_cluster_of_any_size_passes_validation(tmp_path, masters):
    """The embedded cluster can have any number of masters (HERDFENCE_EMBEDDED_REDIS_MASTERS); the
    start-up check reads its slot map (CLUSTER SLOTS) whatever the size. Ports 12301+ keep the bus
    ports (+10000) below the ephemeral range (32768+): at 23201 a bus port 33205 was once taken. Shifted
    by the test offset like the module's stack (12101 + offset), which it would otherwise meet at offset 200."""
    from deploy import redis_cluster, validate
    from fencing.config import load_settings
    port = 12301 + OFFSET
    settings = load_settings({"HERDFENCE_HOME": str(tmp_path), "HERDFENCE_EMBEDDED_REDIS_PORT": str(port),
                              "HERDFENCE_EMBEDDED_REDIS_MASTERS": str(masters)})
    try:
        redis_cluster.up(settings)
        found = validate.check_redis_cluster(f"127.0.0.1:{port}")
        assert len(found["masters"]) == masters and found["slots_covered"] == 16384
        from fencing.stream import routing
        table = routing.load(redis_cluster.connect(settings))
        assert len(table.nodes) == masters
        # a cluster whose default user may not manage ACL users cannot host the job's writer users
        import redis
        node = redis.Redis(port=port)
        node.execute_command("ACL", "SETUSER", "default", "-acl")
        from deploy.procs import DeployError
        with pytest.raises(DeployError, match="may not manage ACL users"):
            validate.check_redis_cluster(f"127.0.0.1:{port}")
        node.close()
    finally:
        redis_cluster.down(settings)


@pytest.mark.parametrize("url,ok", [("local[*]", True), ("local[2]", True), ("local", True),
                                    ("spark://10.0.0.5:7077", True), ("spark://a:7077,b:7077", True),
                                    ("k8s://https://kubernetes.default.svc:443", True), ("yarn", True),
                                    ("spark://host", False), ("spark:/h:7077", False), ("local[0]", False),
                                    ("mesos://h:5050", False), ("k8s://", False), ("", False)])
def test_spark_master_syntax(url, ok):
    from deploy.procs import DeployError
    from deploy.validate import check_spark_master
    if ok:
        check_spark_master(url)
    else:
        with pytest.raises(DeployError, match="malformed"):
            check_spark_master(url)


def test_cluster_conf_dynamic_allocation():
    from fencing.stream.spark_session import cluster_conf
    conf = cluster_conf({"HERDFENCE_MIN_EXECUTORS": "2", "HERDFENCE_MAX_EXECUTORS": "12",
                         "HERDFENCE_INITIAL_EXECUTORS": "3"})
    assert conf["spark.dynamicAllocation.enabled"] == "true"
    assert conf["spark.dynamicAllocation.shuffleTracking.enabled"] == "true"
    assert (conf["spark.dynamicAllocation.minExecutors"], conf["spark.dynamicAllocation.initialExecutors"],
            conf["spark.dynamicAllocation.maxExecutors"]) == ("2", "3", "12")
    off = cluster_conf({"HERDFENCE_DYNAMIC_ALLOCATION": "0", "HERDFENCE_DRIVER_PORT": "7079"})
    assert "spark.dynamicAllocation.enabled" not in off and off["spark.driver.port"] == "7079"
    assert off["spark.executor.cores"] == "1"


def test_executor_artefact_is_content_addressed(tmp_path):
    import zipfile
    from deploy import artifact
    a = artifact.build_into(tmp_path)
    assert artifact.build_into(tmp_path) == a                      # unchanged sources: reused
    names = zipfile.ZipFile(a).namelist()
    for pkg in artifact.PACKAGES:
        assert f"{pkg}/__init__.py" in names
    assert "fencing/stream/job.py" in names and not [n for n in names if "node_modules" in n or n.endswith(".pyc")]
