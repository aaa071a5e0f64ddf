"""The embedded stack's data in HERDFENCE_HOME: what `reset --yes` deletes, `backup` copies, `restore`
brings back.

    redis/<port>/   each Redis node: append-only file (+ RDB snapshots) and nodes.conf
    broker/         the broker's log (Tansu's objects in segment files, deploy/objectlog.py)
    checkpoint/     the Spark job's checkpoint (Kafka offsets of every micro-batch)
    history/        position history (Parquet, by day)

A backup is taken while the stack runs, in an order that makes the copy consistent: the checkpoint
first, then Redis, then the history, then the broker (its segments oldest first; while the hold is
on, no segment is compacted away and no consumed object deleted). So
the copied broker log holds every offset the copied checkpoint names, and the copied device state is
at or after the checkpoint — the job replays from there, and deterministic event ids plus the
versioned state make the replay add nothing twice.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import redis

from deploy import broker, broker_retention, procs, redis_cluster
from fencing.config import DeployError, Settings
from fencing.model import history_compact

DATA_DIRS = ("redis", "broker", "checkpoint", "history")
MANIFEST = "herdfence-backup.json"


def _say(msg: str) -> None:
    print(f"herdfence: {msg}", file=sys.stderr, flush=True)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def present(settings: Settings) -> list[Path]:
    return [settings.home / d for d in DATA_DIRS if (settings.home / d).exists()]


def running(settings: Settings) -> list[str]:
    return [n for n in procs.recorded_names(settings) if procs.alive_record(settings, n)]


# --- reset ---------------------------------------------------------------------------------------
def reset(settings: Settings, yes: bool) -> list[Path]:
    """Delete every farm, fence, device, event, the history, the broker log and the checkpoint."""
    found = present(settings)
    listing = "\n".join(f"  {p}  ({_human(_size(p))})" for p in found) or "  (nothing)"
    if not yes:
        raise DeployError(f"reset deletes all data of {settings.home}:\n{listing}\n"
                          "run `herdfence reset --yes` to delete it")
    if running(settings):
        from deploy import stack
        _say("stopping the stack first")
        stack.down(settings)
    for p in found:
        _say(f"deleting {p} ({_human(_size(p))})")
        shutil.rmtree(p, ignore_errors=True)
    return found


# --- backup --------------------------------------------------------------------------------------
def _copy_tree(src: Path, dst: Path, first: tuple[str, ...] = (), skip_existing: bool = False) -> int:
    """Copy files under src into dst; files whose name ends with one of `first` go first. Files that
    vanish while we copy (a compacted AOF, a replaced object) are skipped."""
    files = [p for p in src.rglob("*") if p.is_file() and not p.name.endswith(".tmp")
             and not (skip_existing and (dst / p.relative_to(src)).exists())]
    files.sort(key=lambda p: (not p.name.endswith(first) if first else False, str(p)))
    copied = 0
    for p in files:
        target = dst / p.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copy2(p, target)
            copied += target.stat().st_size
        except FileNotFoundError:
            continue
    return copied


def _copy_history(src: Path, dst: Path, passes: int = 5) -> int:
    """The history while the job may compact it: a merged file written during the copy holds rows of
    sources that vanished before we reached them, so new files are copied until none appear, and then
    the sources a merged file lists are dropped from the copy (each row once)."""
    size = _copy_tree(src, dst)
    for _ in range(passes):
        added = _copy_tree(src, dst, skip_existing=True)
        size += added
        if not added:
            break
    history_compact.finish_interrupted(str(dst))
    return size


def _rewrite_aof(port: int, timeout: float = 120.0) -> None:
    """A compact AOF (RDB image + a short tail) to copy, finished before we copy it."""
    r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
    try:
        r.execute_command("BGREWRITEAOF")
    except redis.ResponseError as e:          # one already runs or is scheduled: wait for it
        if "already" not in str(e):
            raise
    deadline = time.monotonic() + timeout
    while True:
        info = r.info("persistence")
        if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
            return
        if time.monotonic() > deadline:
            raise DeployError(f"Redis {port}: the AOF rewrite did not finish in {timeout:.0f} s")
        time.sleep(0.1)


def backup(settings: Settings, dest: Path) -> dict:
    dest = Path(dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise DeployError(f"{dest} is not empty: back up into a new or empty folder")
    if settings.kafka or settings.redis:
        raise DeployError("backup copies the embedded stack; back up an external Kafka or Redis with "
                          "its own tools")
    dest.mkdir(parents=True, exist_ok=True)
    # the checkpoint is copied first and the broker's log last: no consumed object may go in between
    hold = broker_retention.hold_path(settings.checkpoint_dir)
    hold.parent.mkdir(parents=True, exist_ok=True)
    hold.write_text(f"{os.getpid()}\n")
    try:
        return _backup(settings, dest)
    finally:
        hold.unlink(missing_ok=True)


def _backup(settings: Settings, dest: Path) -> dict:
    t0 = time.monotonic()
    sizes: dict[str, int] = {}
    home = settings.home
    if (home / "checkpoint").exists():
        _say("copying the job checkpoint")
        sizes["checkpoint"] = _copy_tree(home / "checkpoint", dest / "checkpoint")
    nodes = redis_cluster.recorded_nodes(settings)
    for i, node in enumerate(nodes, 1):
        _say(f"Redis node {node.port} ({i}/{len(nodes)}): rewriting its AOF, then copying it")
        if procs.alive_record(settings, node.name):
            _rewrite_aof(node.port)
        src = home / "redis" / str(node.port)
        sizes[f"redis/{node.port}"] = _copy_tree(src, dest / "redis" / str(node.port),
                                                 first=(".manifest", "nodes.conf"))
    if (home / "history").exists():
        _say("copying the position history")
        sizes["history"] = _copy_history(home / "history", dest / "history")
    if broker.data_dir(settings).exists():
        _say("copying the broker log")
        sizes["broker"] = _copy_tree(broker.data_dir(settings), dest / "broker")
    manifest = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "home": str(home),
                "redis_ports": [n.port for n in nodes], "redis_replicas": [n.port for n in nodes if n.master_port],
                "kafka_port": settings.embedded_kafka_port, "bytes": sizes,
                "seconds": round(time.monotonic() - t0, 2)}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _say(f"backup of {home} in {dest}: {_human(sum(sizes.values()))} in {manifest['seconds']} s")
    return manifest


# --- restore -------------------------------------------------------------------------------------
def restore(settings: Settings, src: Path, yes: bool = False) -> dict:
    src = Path(src).resolve()
    try:
        manifest = json.loads((src / MANIFEST).read_text())
    except (FileNotFoundError, ValueError):
        raise DeployError(f"{src} is not a herdfence backup (no {MANIFEST})") from None
    if running(settings):
        raise DeployError(f"the stack of {settings.home} is running: `herdfence down` first")
    masters = [p for p in manifest["redis_ports"] if p not in manifest.get("redis_replicas", [])]
    if masters and masters != settings.embedded_redis_ports:
        raise DeployError(f"the backup's Redis masters were on ports {masters}; restore with "
                          f"HERDFENCE_EMBEDDED_REDIS_PORT={masters[0]} HERDFENCE_EMBEDDED_REDIS_MASTERS="
                          f"{len(masters)} (each node's nodes.conf names its peers by port)")
    existing = present(settings)
    if existing and not yes:
        raise DeployError(f"{settings.home} already holds data ({', '.join(p.name for p in existing)}); "
                          "`herdfence restore DIR --yes` replaces it")
    for p in existing:
        shutil.rmtree(p, ignore_errors=True)
    settings.home.mkdir(parents=True, exist_ok=True)
    for d in DATA_DIRS:
        if (src / d).exists():
            _say(f"restoring {d}")
            shutil.copytree(src / d, settings.home / d)
    # the next `up` starts the same nodes (replicas included) from their restored files
    _say(f"restored {src} into {settings.home}; start it with `herdfence up`")
    return manifest
