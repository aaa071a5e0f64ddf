"""The deployment artefacts (deploy/docker, deploy/k8s, deploy/compose) are wired together correctly.

No container engine or Kubernetes runs here, so they are parsed and cross-checked: every HERDFENCE_*
variable points at a service that exists and listens on that port, Services select pods and target
ports those pods declare, every image is third-party-pinned or built by a Dockerfile target, files the
manifests name exist in the image, the API's readiness probe / healthcheck hits /healthz.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from deploy import validate
from fencing.config import TOPIC_DLQ, TOPIC_EVENTS, TOPIC_REPORTS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
THIRD_PARTY = re.compile(r"^(redis:7\.\d+[\w.-]*|apache/kafka:\d+\.\d+\.\d+|python:3\.11-slim[\w.-]*|"
                         r"node:\d+[\w.-]*)$")
HERDFENCE_IMAGE = re.compile(r"^herdfence/([a-z-]+):(.+)$")
VARS = ("HERDFENCE_KAFKA", "HERDFENCE_REDIS", "HERDFENCE_SPARK_MASTER", "HERDFENCE_API_PORT", "HERDFENCE_HOME")


# --- Dockerfile ----------------------------------------------------------------------------------
def _stages() -> dict[str, dict]:
    """{stage name: {"from": image, "lines": [instruction lines]}} with continuation lines joined."""
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
    stages: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM (\S+) AS (\S+)$", line, re.I)
        if m:
            image = re.sub(r"\$\{(\w+)\}", lambda a: args[a.group(1)], m.group(1))
            current = stages.setdefault(m.group(2), {"from": image, "lines": []})
            continue
        if current is not None:
            current["lines"].append(line)
    return stages


def _stage_text(name: str) -> str:
    return "\n".join(_stages()[name]["lines"])


def _copied(stage: str) -> dict[str, str]:
    """{destination: source} of the COPY instructions of a stage."""
    out = {}
    for line in _stages()[stage]["lines"]:
        parts = line.split()
        if parts[0] == "COPY":
            out[parts[-1]] = " ".join(parts[1:-1])
    return out


def test_dockerfile_targets_and_bases():
    stages = _stages()
    assert {"api", "job"} <= set(stages)
    # every stage is a known base or an earlier stage
    names = list(stages)
    for i, (name, st) in enumerate(stages.items()):
        assert st["from"] in names[:i] or THIRD_PARTY.match(st["from"]), (name, st["from"])
    # both runtime images come from python:3.11-slim (through the shared dependency stage)
    def root(name: str) -> str:
        while stages[name]["from"] in stages:
            name = stages[name]["from"]
        return stages[name]["from"]
    assert root("api").startswith("python:3.11-slim") and root("job").startswith("python:3.11-slim")
    assert "openjdk-17-jre-headless" in _stage_text("job")
    assert "requirements.lock" in _stage_text("python-deps")


def test_dockerfile_copies_exist_in_the_repository():
    for stage in _stages():
        for dest, src in _copied(stage).items():
            if src.startswith("--from"):
                continue
            for path in src.split():
                assert (ROOT / path).exists(), f"{stage}: COPY {path} -> {dest}: missing in the repository"


def test_api_image_serves_on_its_port_with_a_healthz_check():
    api = _stage_text("api")
    port = re.search(r"HERDFENCE_API_PORT=(\d+)", api).group(1)
    assert f"EXPOSE {port}" in api
    assert "HEALTHCHECK" in api and "/healthz" in api
    assert "uvicorn api.app:app" in api and "${HERDFENCE_API_PORT}" in api


def test_job_image_ships_the_executor_artefact_and_entrypoint():
    job = _stage_text("job")
    copies = _copied("job")
    assert "/opt/herdfence/herdfence-pyfiles.zip" in copies
    assert re.search(r"python -m deploy\.artifact /dist herdfence-pyfiles\.zip", _stage_text("build"))
    assert "HERDFENCE_PYFILES=/opt/herdfence/herdfence-pyfiles.zip" in job
    assert copies["/opt/entrypoint.sh"] == "deploy/docker/spark-entrypoint.sh"
    assert copies["/opt/herdfence/run_job.py"] == "deploy/docker/run_job.py"
    entry = (DEPLOY / "docker" / "spark-entrypoint.sh").read_text()
    for command in ("job)", "topics)", "driver)", "executor)", "master)", "worker)"):
        assert f"  {command}" in entry, command
    assert "KubernetesExecutorBackend" in entry and "python -m fencing.stream.job" in entry


def _built_images() -> dict[str, str]:
    """image name → Dockerfile target: herdfence/<target>:<pyproject version>."""
    return {f"herdfence/{t}:{VERSION}": t for t in ("api", "job") if t in _stages()}


def _check_image(image: str, where: str) -> None:
    m = HERDFENCE_IMAGE.match(image)
    if m:
        assert image in _built_images(), f"{where}: {image} is not built by a Dockerfile target " \
                                         f"(expected one of {sorted(_built_images())})"
    else:
        assert THIRD_PARTY.match(image), f"{where}: unexpected image {image} (pin it or build it)"


# --- Kubernetes ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def k8s() -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc["__file__"] = path.name
                docs.append(doc)
    return docs


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _all(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def _pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def _container_ports(pod: dict) -> dict:
    """{name or number: number} of every container port in a pod spec."""
    out = {}
    for c in pod["containers"]:
        for p in c.get("ports", []):
            out[p["containerPort"]] = p["containerPort"]
            if "name" in p:
                out[p["name"]] = p["containerPort"]
    return out


def _selects(service: dict, workload: dict) -> bool:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in service["spec"]["selector"].items())


def _config(k8s) -> dict[str, str]:
    return _one(k8s, "ConfigMap", "herdfence-config")["data"]


def test_k8s_kustomization_lists_every_manifest(k8s):
    kust = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    files = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files
    ns = _one(k8s, "Namespace")["metadata"]["name"]
    for d in k8s:
        if d["kind"] not in ("Namespace", "Kustomization"):
            assert d["metadata"].get("namespace") == ns, (d["kind"], d["metadata"]["name"])


def test_k8s_config_has_every_variable_and_they_are_valid(k8s):
    cfg = _config(k8s)
    for var in VARS:
        assert var in cfg, var
    validate.check_spark_master(cfg["HERDFENCE_SPARK_MASTER"])
    assert cfg["HERDFENCE_SPARK_MASTER"].startswith("k8s://")


def test_k8s_kafka_variable_points_at_the_strimzi_bootstrap(k8s):
    cfg = _config(k8s)
    [(host, port)] = [validate._hostport("HERDFENCE_KAFKA", s) for s in cfg["HERDFENCE_KAFKA"].split(",")]
    kafka = _one(k8s, "Kafka")
    name = kafka["metadata"]["name"]
    assert host == f"{name}-kafka-bootstrap"       # the Service Strimzi creates for a Kafka
    plain = [l for l in kafka["spec"]["kafka"]["listeners"] if not l["tls"] and l["type"] == "internal"]
    assert port in [l["port"] for l in plain]
    pools = _all(k8s, "KafkaNodePool")
    assert pools and all(p["metadata"]["labels"]["strimzi.io/cluster"] == name for p in pools)
    assert any("broker" in p["spec"]["roles"] for p in pools)
    topics = _all(k8s, "KafkaTopic")
    assert {t["spec"]["topicName"] for t in topics} == {TOPIC_REPORTS, TOPIC_DLQ, TOPIC_EVENTS}
    replicas = sum(p["spec"]["replicas"] for p in pools if "broker" in p["spec"]["roles"])
    for t in topics:
        assert t["metadata"]["labels"]["strimzi.io/cluster"] == name
        assert 1 <= t["spec"]["replicas"] <= replicas


def test_k8s_redis_variable_points_at_the_cluster_statefulset(k8s):
    host, port = validate._hostport("HERDFENCE_REDIS", _config(k8s)["HERDFENCE_REDIS"])
    svc = _one(k8s, "Service", host)
    sts = _one(k8s, "StatefulSet", "redis-cluster")
    assert _selects(svc, sts)
    [sp] = [p for p in svc["spec"]["ports"] if p["port"] == port]
    ports = _container_ports(_pod_spec(sts))
    assert sp["targetPort"] in ports and ports[sp["targetPort"]] == port
    assert port + 10000 in ports.values()                     # the cluster bus
    headless = _one(k8s, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and _selects(headless, sts)
    conf = _one(k8s, "ConfigMap", "redis-cluster-conf")["data"]["redis.conf"]
    assert "cluster-enabled yes" in conf and f"port {port}" in conf
    # the init Job creates the cluster from exactly the StatefulSet's pods
    init = _one(k8s, "Job", "redis-cluster-init")
    script = " ".join(_pod_spec(init)["containers"][0]["args"])
    n = sts["spec"]["replicas"]
    assert f"for i in {' '.join(str(i) for i in range(n))}" in script
    assert sts["spec"]["serviceName"] in script and "--cluster create" in script
    assert n % 2 == 0 and "--cluster-replicas 1" in script    # n/2 masters, one replica each


def test_k8s_api_deployment_service_and_probes(k8s):
    cfg = _config(k8s)
    dep = _one(k8s, "Deployment", "herdfence-api")
    pod = _pod_spec(dep)
    [c] = pod["containers"]
    _check_image(c["image"], "herdfence-api")
    assert assert_config_refs(k8s, c.get("envFrom", []))
    ports = _container_ports(pod)
    assert int(cfg["HERDFENCE_API_PORT"]) in ports.values()
    probe = c["readinessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and ports[probe["port"]] == int(cfg["HERDFENCE_API_PORT"])
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    svc = _one(k8s, "Service", "herdfence-api")
    assert _selects(svc, dep)
    for p in svc["spec"]["ports"]:
        assert ports[p["targetPort"]] == int(cfg["HERDFENCE_API_PORT"])
    _check_volumes(k8s, pod["volumes"])


def assert_config_refs(k8s, env_from: list[dict]) -> bool:
    refs = [e["configMapRef"]["name"] for e in env_from if "configMapRef" in e]
    for name in refs:
        _one(k8s, "ConfigMap", name)
    return "herdfence-config" in refs


def _check_volumes(k8s, volumes: list[dict]) -> None:
    for v in volumes:
        if "persistentVolumeClaim" in v:
            _one(k8s, "PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])
        if "configMap" in v:
            _one(k8s, "ConfigMap", v["configMap"]["name"])


def test_k8s_spark_application(k8s):
    app = _one(k8s, "SparkApplication", "herdfence-job")
    spec = app["spec"]
    _check_image(spec["image"], "SparkApplication")
    assert HERDFENCE_IMAGE.match(spec["image"]).group(1) == "job"
    copies = _copied("job")
    # the files spark-submit is told to use are in the job image
    main = spec["mainApplicationFile"].removeprefix("local://")
    assert main in copies
    assert [p.removeprefix("local://") for p in spec["deps"]["pyFiles"]] == ["/opt/herdfence/herdfence-pyfiles.zip"]
    assert spec["type"] == "Python" and spec["mode"] == "cluster"
    pinned = re.search(r"^pyspark==(\S+)", (ROOT / "requirements.lock").read_text(), re.M).group(1)
    assert spec["sparkVersion"] == pinned          # the image's Spark is the pinned pyspark's
    da = spec["dynamicAllocation"]
    assert da["enabled"] and da["minExecutors"] <= da["initialExecutors"] <= da["maxExecutors"]
    # the driver may create executor pods: its service account is bound to a role that allows it
    sa = spec["driver"]["serviceAccount"]
    _one(k8s, "ServiceAccount", sa)
    binding = [b for b in _all(k8s, "RoleBinding") if any(s["name"] == sa for s in b["subjects"])]
    assert binding
    role = _one(k8s, "Role", binding[0]["roleRef"]["name"])
    assert any("pods" in r["resources"] and "create" in r["verbs"] for r in role["rules"])
    for side in ("driver", "executor"):
        assert assert_config_refs(k8s, spec[side]["envFrom"]), side
        mounts = {m["name"]: m["mountPath"] for m in spec[side]["volumeMounts"]}
        # checkpoint (driver) and history (executors) live under HERDFENCE_HOME on the shared volume
        assert _config(k8s)["HERDFENCE_HOME"] in mounts.values(), side
    _check_volumes(k8s, spec["volumes"])
    assert _one(k8s, "PersistentVolumeClaim", "herdfence-state")["spec"]["accessModes"] == ["ReadWriteMany"]


def test_k8s_hot_standby_is_a_second_application_on_another_node(k8s):
    active, standby = _one(k8s, "SparkApplication", "herdfence-job"), _one(k8s, "SparkApplication", "herdfence-job-standby")
    # the same job (image, code, config, volumes): only its executors and name differ
    for key in ("image", "mainApplicationFile", "deps", "volumes", "sparkConf"):
        assert standby["spec"][key] == active["spec"][key], key
    assert standby["spec"]["dynamicAllocation"]["minExecutors"] == 0 == standby["spec"]["dynamicAllocation"]["initialExecutors"]
    for app in (active, standby):
        driver = app["spec"]["driver"]
        rule = driver["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert rule["topologyKey"] == "kubernetes.io/hostname"
        # each driver repels every pod carrying the drivers' labels, so the two never share a node
        assert rule["labelSelector"]["matchLabels"].items() <= driver["labels"].items()


def test_k8s_every_image_is_built_or_pinned(k8s):
    for d in k8s:
        spec = d.get("spec", {})
        if "template" in spec:
            for c in _pod_spec(d)["containers"]:
                _check_image(c["image"], f"{d['kind']} {d['metadata']['name']}")
        if d["kind"] == "SparkApplication":
            _check_image(spec["image"], "SparkApplication")


# --- docker compose ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())


def _exposed(service: dict) -> set[int]:
    ports = {int(p) for p in service.get("expose", [])}
    for p in service.get("ports", []):
        ports.add(int(str(p).rsplit(":", 1)[-1].split("/")[0]))
    return ports


def test_compose_images_are_built_by_the_dockerfile(compose):
    built = _built_images()
    for name, svc in compose["services"].items():
        _check_image(svc["image"], f"compose {name}")
        if "build" in svc:
            b = svc["build"]
            assert (DEPLOY / "compose" / b["context"] / b["dockerfile"]).resolve() == DEPLOY / "docker" / "Dockerfile"
            assert built[svc["image"]] == b["target"], name
    # every herdfence image used is built by some service of the file
    used = {s["image"] for s in compose["services"].values() if HERDFENCE_IMAGE.match(s["image"])}
    assert used <= {s["image"] for s in compose["services"].values() if "build" in s}


def test_compose_herdfence_variables_point_at_services(compose):
    services = compose["services"]
    checked = 0
    for name, svc in services.items():
        env = svc.get("environment", {})
        if "HERDFENCE_KAFKA" in env:
            for server in env["HERDFENCE_KAFKA"].split(","):
                host, port = validate._hostport("HERDFENCE_KAFKA", server)
                assert host in services and port in _exposed(services[host]), (name, server)
                adv = services[host]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
                assert f"//{host}:{port}" in adv           # what clients are told to connect to
            checked += 1
        if "HERDFENCE_REDIS" in env:
            host, port = validate._hostport("HERDFENCE_REDIS", env["HERDFENCE_REDIS"])
            assert host in services and port in _exposed(services[host]), name
            assert "--cluster-enabled" in services[host]["command"]
            checked += 1
        if "HERDFENCE_SPARK_MASTER" in env:
            url = env["HERDFENCE_SPARK_MASTER"]
            validate.check_spark_master(url)
            host, port = validate._hostport("HERDFENCE_SPARK_MASTER", url.removeprefix("spark://"))
            master = services[host]
            assert master["command"] == ["master"] and port in _exposed(master)
            assert str(port) == master["environment"]["SPARK_MASTER_PORT"]
        if "HERDFENCE_API_PORT" in env and svc["image"].startswith("herdfence/api"):
            assert int(env["HERDFENCE_API_PORT"]) in _exposed(svc)
            assert "/healthz" in " ".join(svc["healthcheck"]["test"])
            assert f":{env['HERDFENCE_API_PORT']}/healthz" in " ".join(svc["healthcheck"]["test"])
    assert checked >= 4
    for name, svc in services.items():
        deps = svc.get("depends_on", [])
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in services, (name, dep)
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            assert src in compose["volumes"], (name, vol)


def test_compose_redis_cluster_init_covers_every_node(compose):
    services = compose["services"]
    nodes = [n for n, s in services.items() if "--cluster-enabled" in s.get("command", [])]
    script = " ".join(services["redis-init"]["command"])
    assert len(nodes) >= 3
    for n in nodes:
        assert f"getent hosts {n}" in script
        assert services["redis-init"]["depends_on"][n]["condition"] == "service_healthy"


def test_compose_workers_reach_the_master_and_driver_is_reachable(compose):
    services = compose["services"]
    worker, job, master = services["spark-worker"], services["job"], services["spark-master"]
    url = worker["command"][1]
    assert url == job["environment"]["HERDFENCE_SPARK_MASTER"]
    assert job["environment"]["HERDFENCE_DRIVER_HOST"] == "job"
    assert {int(job["environment"]["HERDFENCE_DRIVER_PORT"]),
            int(job["environment"]["HERDFENCE_BLOCKMANAGER_PORT"])} <= _exposed(job)
    assert master["image"] == worker["image"] == job["image"]


def test_a_stack_stops_when_its_owner_process_is_gone(tmp_path):
    """HERDFENCE_OWNER_PID (a benchmark's or a test session's private stack): the supervisor stops every
    component once that process is gone. Real processes: a supervisor, a recorded component, an owner."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from deploy import procs
    from fencing.config import load_settings
    from tests.chaoskit import alive, wait_until
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDFENCE_")}
    owner = subprocess.Popen(["sleep", "300"])
    env.update(HERDFENCE_HOME=str(tmp_path), HERDFENCE_OWNER_PID=str(owner.pid))
    settings = load_settings(env)
    component = procs.start(settings, procs.ProcSpec(name="api", argv=["sleep", "300"], markers=["sleep 300"]))
    supervisor = subprocess.Popen([sys.executable, "-m", "deploy.supervisor"], env=env, cwd=ROOT,
                                  start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
        assert alive(component.pid) and supervisor.poll() is None, "nothing stops while the owner lives"
        owner.kill()
        owner.wait()
        try:
            wait_until(lambda: supervisor.poll() is not None and not alive(component.pid), 90, interval=0.2,
                       what="the supervisor to stop the stack of a gone owner")
        except AssertionError as e:
            supervisor.kill()
            raise AssertionError(f"{e}\nsupervisor: {supervisor.stderr.read()}") from None
        assert "owner pid" in supervisor.stderr.read()
    finally:
        for pid in (component.pid, supervisor.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_two_starts_of_a_component_at_once_run_one_process_and_record_it(tmp_path):
    """`herdfence up` and the supervisor finding the same component down at the same moment: one
    process starts, both get its record (two API masters raced for the port, and the loser's record
    could leave the winner running unrecorded, past `down`). Real processes, started from two threads."""
    import os
    import threading

    import psutil

    from deploy import procs
    from fencing.config import load_settings
    settings = load_settings({"HERDFENCE_HOME": str(tmp_path)})
    marker = f"sleep 29{os.getpid() % 10}"
    spec = procs.ProcSpec(name="api", argv=marker.split(), markers=[marker])
    barrier, got = threading.Barrier(2), []

    def start() -> None:
        barrier.wait()
        got.append(procs.start(settings, spec))
    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    running = [p.pid for p in psutil.process_iter(["cmdline"]) if " ".join(p.info["cmdline"] or []) == marker]
    try:
        assert len(got) == 2 and got[0].pid == got[1].pid, [g.pid for g in got]
        assert running == [got[0].pid]
        assert procs.read_record(settings, "api").pid == got[0].pid
    finally:
        for pid in running:
            procs.kill_leftovers(pid)
