"""The job on a local Spark standalone cluster (`herdfence up --detach --spark-workers 2`): its own
stack (own HERDFENCE_HOME and ports), started through the real CLI and stopped at the end.

* the acceptance flow of tests/test_flow.py, unchanged (the same test functions, run against this
  module's `stack` fixture): report → enter → query → exit → query, errors and tenancy;
* status --json shows spark_master and spark_worker_1/2;
* the executors import herdfence from the shipped artefact (HERDFENCE_HOME/dist/*.zip), not from the
  source tree;
* `up --detach --spark-workers 3` adds a worker to the running stack and the job runs tasks on it.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import HERDFENCE, ROOT, Stack, wait_for
from tests.farmkit import Farm, square
# The acceptance flow, unchanged: collected here again, so it runs on this module's cluster stack.
from tests.test_flow import test_enter_query_exit_query, test_errors_and_tenancy  # noqa: F401

CLUSTER_PORTS = {"HERDFENCE_EMBEDDED_KAFKA_PORT": "23092", "HERDFENCE_EMBEDDED_REDIS_PORT": "23101",
                 "HERDFENCE_API_PORT": "23800", "HERDFENCE_EMBEDDED_SPARK_PORT": "23077"}
MASTER_UI = 23077 + 3
pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Stack:
    """Overrides conftest's session stack for this module: a standalone cluster with 2 workers."""
    home = tmp_path_factory.mktemp("herdfence-cluster")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDFENCE_")}
    env.update(CLUSTER_PORTS, HERDFENCE_HOME=str(home), HERDFENCE_TRIGGER="200 milliseconds")
    s = Stack(env=env, api_url=f"http://127.0.0.1:{CLUSTER_PORTS['HERDFENCE_API_PORT']}")
    try:
        t0 = time.monotonic()
        s.cli("up", "--detach", "--spark-workers", "2", timeout=300)
        print(f"cluster stack up in {time.monotonic() - t0:.0f} s")
        yield s
    finally:
        subprocess.run([HERDFENCE, "down"], env=env, cwd=ROOT, capture_output=True, timeout=120)
        for log in sorted((home / "run").glob("*.log")):
            target = ROOT / "test-artifacts" / "logs" / "cluster" / log.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(log.read_bytes()[-2_000_000:])


def _home(stack: Stack) -> Path:
    return Path(stack.env["HERDFENCE_HOME"])


def _master_json() -> dict:
    from deploy.scale import master_state
    return master_state(MASTER_UI)


def _executor_dirs(stack: Stack) -> dict[str, Path]:
    """{executor id: its work dir} of the job's application on the local workers."""
    apps = sorted((_home(stack) / "spark" / "work").glob("app-*"))
    return {d.name: d for d in apps[-1].iterdir() if d.is_dir()} if apps else {}


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
    assert comps["spark_master"]["port"] == 23077
    assert comps["spark_master"]["alive_workers"] == 2
    state = _master_json()
    assert [a["name"] for a in state["activeapps"]] == ["herdfence"]


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
    # the job's log says so too
    log = (home / "run" / "job.log").read_text(errors="replace")
    assert f"imports fencing from ./{zip_path.name}/fencing/__init__.py" in log


def test_add_a_worker_and_the_job_uses_it(stack):
    before = _master_json()
    assert before["aliveworkers"] == 2
    stack.cli("up", "--detach", "--spark-workers", "3", timeout=300)
    st = json.loads(stack.cli("status", "--json"))
    assert st["components"]["spark_worker_3"]["ok"]
    # the master gives the job an executor on the new worker ...
    wait_for(lambda: _master_json()["coresused"] == 3, timeout=60, what="3 executor cores in use")
    from deploy.scale import busy_workers
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
        if _tasks_run(newest) > 0:
            return True
        farm.report("cow-s0", (8.505, 47.005))     # keep micro-batches coming
        return False
    wait_for(used, timeout=60, interval=1.0, what=f"tasks on the new executor {newest}")
    assert list(newest.glob("herdfence-*.zip"))
    execs = json.loads(stack.redis.get("job:executors"))
    assert len(execs["executor_ids"]) == 3 and execs["last_request"]["add"] == 1
