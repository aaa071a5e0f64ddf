"""Who may write: each lease epoch writes as its own Redis user, and a take-over deletes the older ones.

The active job (fencing.model.lease) connects to every Redis node as the user `herdfence-job-<epoch>`.
Taking the lease admits the new epoch on every node (masters and replicas: ACLs do not replicate)
before the job's first write. Admitting an epoch on a node creates its user, then deletes every
older epoch's user there; deleting a user closes its connections at once, and Redis runs none of the
commands a closed connection still had queued. So on each node every write of an older job comes
before the first write of the newer one, and an older job that resumes (paused, cut off) cannot
authenticate again: its next command fails with `Fenced`. That is the whole fence: the writes
themselves are plain commands, with no check per write.

Admission is create, then check: a node's ACL commands run one at a time, so of two epochs admitted
on the same node at once, the older one either sees the newer user and deletes its own, or is
deleted by the newer one's admission. A node that was unreachable at the take-over is admitted as
soon as it answers (the job retries in the background), and a node that lost its users in a restart
admits the job on its first connection there (`JobConnection`), but only while the job's epoch is
still the newest one counted (`{job}:epoch`): an older job never admits itself again.
"""
from __future__ import annotations

import logging
import time

from redis import Redis
from redis.connection import Connection
from redis.exceptions import AuthenticationError, RedisError, ResponseError

log = logging.getLogger(__name__)

SCOPE = "job"                    # the job's users are herdfence-job-<epoch>; a test uses a scope of its own
EPOCH_KEY = "{job}:epoch"       # incremented by every take-over (fencing.model.lease)
# every key, channel and command: the job's reads and writes, the scripts they run
_RIGHTS = ("on", "nopass", "~*", "&*", "+@all")
ADMIT_CLIENT = "herdfence-admit"   # CLIENT SETNAME of the short connections that admit an epoch


class Fenced(ResponseError):
    """This job's epoch may no longer write: a newer job has taken the lease."""


def job_user(epoch: int, scope: str = SCOPE) -> str:
    return f"herdfence-{scope}-{epoch}"


def epoch_counter(scope: str = SCOPE) -> str:
    """The key counting the scope's epochs (same hash tag as its lease)."""
    return EPOCH_KEY if scope == SCOPE else f"{{{scope}}}:epoch"


def user_epoch(name: str) -> tuple[str, int] | None:
    """(scope, epoch) of a job user's name (None: not a job user)."""
    head, _, tail = name.rpartition("-")
    if not head.startswith("herdfence-") or not tail.isdigit():
        return None
    return head[len("herdfence-"):], int(tail)


def admit(node: Redis, epoch: int, scope: str = SCOPE) -> None:
    """Admit `epoch` on one node (`node`: a connection as a user that may run ACL): create its user,
    refuse (Fenced) if a newer epoch is there, delete every older epoch's user (closing their
    connections). Idempotent."""
    me = job_user(epoch, scope)
    node.execute_command("ACL", "SETUSER", me, *_RIGHTS)
    epochs = [e for s, e in filter(None, map(user_epoch, node.execute_command("ACL", "USERS"))) if s == scope]
    newer = max((e for e in epochs if e > epoch), default=None)
    if newer is not None:
        node.execute_command("ACL", "DELUSER", me)
        raise Fenced(f"FENCED epoch {epoch} is older than {newer}")
    older = [job_user(e, scope) for e in epochs if e < epoch]
    if older:
        node.execute_command("ACL", "DELUSER", *older)


def admit_everywhere(redis, epoch: int, scope: str = SCOPE) -> list[str]:  # noqa: ANN001 - RedisCluster
    """Admit `epoch` on every node the cluster knows (masters and replicas); returns the nodes that
    could not be reached."""
    from fencing.model.redis_conn import node_connection     # (imported here: redis_conn builds on this module)
    missed = []
    for address, info in redis.cluster_nodes().items():
        flags = str(info.get("flags", ""))
        host, _, port = address.partition(":")
        if "noaddr" in flags or not port:
            continue
        try:
            with node_connection(host or "127.0.0.1", int(port.split("@")[0]), ADMIT_CLIENT) as node:
                admit(node, epoch, scope)
        except Fenced:
            raise
        except (RedisError, OSError) as e:
            log.debug("job user: node %s not reached (%s)", address, e)
            missed.append(address)
    return missed


def admit_missed(redis, epoch: int, scope: str = SCOPE, every_s: float = 1.0) -> None:  # noqa: ANN001
    """Admit `epoch` everywhere again every `every_s` until every node took it (a node away at the
    take-over, a replica say, may still know an older epoch's user: admitted as soon as it answers,
    before a failover can make it a master), or until a newer epoch is found (Fenced: this job stops
    on its next write)."""
    missed = ["?"]
    while missed:
        time.sleep(every_s)
        try:
            missed = admit_everywhere(redis, epoch, scope)
        except Fenced:
            return
        except (RedisError, OSError) as e:       # the node listing itself failed: try again
            log.debug("admitting epoch %d: %s", epoch, e)
    log.info("job user of epoch %d admitted on every node", epoch)


def admit_if_current(host: str, port: int, epoch: int, scope: str = SCOPE) -> None:
    """Admit `epoch` on the node host:port if it is still the newest epoch counted; else Fenced."""
    from fencing.model.redis_conn import cluster, node_connection
    newest = int(cluster(host, port).get(epoch_counter(scope)) or 0)
    if newest != epoch:
        raise Fenced(f"FENCED epoch {epoch} is older than {newest}")
    with node_connection(host, port, ADMIT_CLIENT) as node:
        admit(node, epoch, scope)


class JobConnection(Connection):
    """A connection as a job epoch's user. A node that does not know the user (unreachable at the
    take-over, or restarted since) admits the epoch first, if it is still the newest (else Fenced)."""

    def on_connect_check_health(self, check_health: bool = True) -> None:
        try:
            super().on_connect_check_health(check_health)
        except AuthenticationError:
            known = user_epoch(self.username or "")
            if known is None:
                raise
            admit_if_current(self.host, self.port, known[1], known[0])
            super().on_connect_check_health(check_health)
