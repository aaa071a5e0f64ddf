"""Configuration checks run by `herdfence up` before it starts anything (and by the job at start).

Each failure is a DeployError naming the variable, the value and what to do, e.g.
  HERDFENCE_REDIS=10.0.0.5:6379 is a Redis server without cluster mode (cluster_enabled:0); ...
"""
from __future__ import annotations


from fencing.config import DeployError, Settings, _hostport, check_spark_master

SLOTS = 16384


# --- Kafka ---------------------------------------------------------------------------------------
def check_kafka(bootstrap: str, timeout: float = 5.0) -> int:
    """Every bootstrap entry is host:port and the cluster answers a metadata request; returns brokers."""
    var = "HERDFENCE_KAFKA"
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
    if not servers:
        raise DeployError(f"{var} is empty")
    for s in servers:
        _hostport(var, s.removeprefix("PLAINTEXT://"))
    from confluent_kafka.admin import AdminClient
    try:
        md = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout * 1000),
                          "socket.connection.setup.timeout.ms": int(timeout * 1000)}
                         ).list_topics(timeout=timeout)
    except Exception as e:  # noqa: BLE001 - KafkaException(_TRANSPORT / _TIMED_OUT ...)
        raise DeployError(f"{var}={bootstrap}: no Kafka broker answers within {timeout:.0f} s ({e}); "
                          "check the address, or unset it to use the embedded broker") from None
    return len(md.brokers)


# --- Redis Cluster -------------------------------------------------------------------------------
def check_redis_cluster(node: str, timeout: float = 3.0) -> dict:
    """The node answers, runs in cluster mode, the cluster is ok; returns the slot map summary:
    {"masters": [host:port...], "slots_covered": n, "cluster_state"}."""
    var = "HERDFENCE_REDIS"
    host, port = _hostport(var, node)
    import redis
    r = redis.Redis(host=host, port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
                    decode_responses=True)
    try:
        info = r.info("cluster")
    except redis.AuthenticationError as e:
        raise DeployError(f"{var}={node}: authentication required ({e})") from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
        raise DeployError(f"{var}={node}: Redis is unreachable ({e}); check the address, or unset it to "
                          "use the embedded cluster") from None
    if not int(info.get("cluster_enabled", 0)):
        raise DeployError(f"{var}={node} is a Redis server without cluster mode (cluster_enabled:0); "
                          "herdfence needs a Redis Cluster (cluster-enabled yes, all 16384 slots assigned)")
    cinfo = r.cluster("INFO")
    slots = r.execute_command("CLUSTER", "SLOTS")
    masters, covered = set(), 0
    for entry in slots:
        lo, hi, master = int(entry[0]), int(entry[1]), entry[2]
        covered += hi - lo + 1
        h = master[0] if isinstance(master[0], str) else master[0].decode()
        masters.add(f"{h or host}:{int(master[1])}")
    state = cinfo.get("cluster_state")
    if state != "ok" or covered != SLOTS:
        raise DeployError(f"{var}={node}: the Redis Cluster is not usable (cluster_state:{state}, "
                          f"{covered} of {SLOTS} slots assigned); fix the cluster (redis-cli --cluster "
                          "check/fix) first")
    try:    # the job writes as its lease epoch's own user, created and deleted on every node (job_user)
        r.execute_command("ACL", "DRYRUN", "default", "ACL", "SETUSER", "herdfence-job-0")
    except redis.ResponseError as e:
        if "unknown subcommand" not in str(e).lower():      # Redis 6 has no DRYRUN: the take-over finds out
            raise DeployError(f"{var}={node}: the default user may not manage ACL users ({e}); herdfence's "
                              "job creates and deletes its writer users (herdfence-job-<epoch>) on every node") from None
    return {"masters": sorted(masters), "slots_covered": covered, "cluster_state": state}


def check(settings: Settings, spark_workers: int = 0) -> dict:
    """All checks for `herdfence up`; returns what was found (for the log)."""
    found: dict = {}
    if settings.spark_master:
        if spark_workers:
            raise DeployError(f"HERDFENCE_SPARK_MASTER={settings.spark_master} and --spark-workers "
                              f"{spark_workers} contradict each other: use one or the other")
        check_spark_master(settings.spark_master, reach=True)
        found["spark_master"] = settings.spark_master
    if settings.kafka:
        found["kafka_brokers"] = check_kafka(settings.kafka)
    if settings.redis:
        found["redis"] = check_redis_cluster(settings.redis)
    return found


def main() -> int:
    """`python -m deploy.validate`: check the HERDFENCE_* configuration (the job image runs this first)."""
    import json
    import sys

    from fencing.config import load_settings
    try:
        settings = load_settings()
        found = check(settings)
        if settings.spark_master:
            check_spark_master(settings.spark_master)
    except DeployError as e:
        print(f"herdfence: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"ok": True, **found}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
