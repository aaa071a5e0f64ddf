"""Who may write: the active job's lease and the epoch that fences every write it makes.

Two job processes run side by side (issue 19, hot standby): the one holding the lease in Redis runs the
streaming query; the other is warm and waits. Taking the lease increments the epoch (one Lua call:
lease and epoch move together). The holder renews the lease every `ttl/5`; a holder that misses its
renewals (killed, paused, cut off) loses it when it expires, and the standby takes it with the next
epoch.

A killed holder is noticed sooner than its TTL: it keeps a connection named after itself open to the
lease's Redis node (its presence). The kernel closes that connection the moment the process dies, so
a standby that sees the holder's presence gone on three polls in a row (0.2 s, longer than the
holder takes to follow a moved slot) deletes the lease (only if that holder still has it) and takes
it at once. A paused or cut-off holder keeps its connection (or cannot be
told apart from one that does): the TTL decides, and the epoch fences whatever it writes afterwards.

Losing the lease is not enough to stop an old driver: a paused process cannot notice anything. So
each epoch writes as its own Redis user, and taking the lease deletes the older epochs' users on
every node before the first write (fencing.model.job_user): a resumed old driver's connections are
closed and it cannot authenticate again. Whatever it wrote before that is the same batch's
deterministic result (same checkpoint, same offsets) that the new active writes again, versioned by
batch.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from fencing.model.job_user import EPOCH_KEY
from fencing.model.redis_conn import node_connection

log = logging.getLogger(__name__)

LEASE_KEY = "{job}:lease"       # the holder's id, with a TTL
STANDBY_KEY = "{job}:standby"   # the holder id of the job process standing by, warm, for the lease
PRESENCE_PREFIX = "herdfence-lease:"   # CLIENT SETNAME of a job's presence connection, + its holder id
ABSENT_POLLS = 3                 # a holder's presence missing this many polls in a row (0.2 s): it died

_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
"""
# a renewal that came after the lease expired takes it again when no job took it meanwhile (the
# epoch is still the holder's): a starved process is not replaced by nothing
_RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not holder and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
class Lease:
    """The job's lease in Redis: `acquire` blocks until this process holds it and returns the epoch;
    a renewal thread keeps it and calls `on_lost` (once) when it cannot."""

    def __init__(self, redis, holder: str, ttl_ms: int, on_lost: Callable[[], None],
                 lease_key: str = LEASE_KEY, epoch_counter: str = EPOCH_KEY) -> None:
        self.redis, self.holder, self.ttl_ms, self.on_lost = redis, holder, ttl_ms, on_lost
        self.lease_key, self.epoch_counter = lease_key, epoch_counter
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)
        self.epoch = 0
        self.worst_gap_ms = 0.0          # the longest time between two renewals (see take_worst_gap_ms)
        self._renewed_at = 0.0           # monotonic time of the last renewal (or of taking the lease)
        self._stop = threading.Event()
        self._presence = None            # this process's named connection to the lease's node
        self._presence_node: tuple[str, int] | None = None
        self._absent: tuple[str | None, int] = (None, 0)    # (holder, polls its presence was missing)
        self._seen_at: tuple[str, tuple[str, int] | None, str] | None = None   # (holder, node, its client id)

    def try_acquire(self) -> int:
        """The new epoch if this call took the lease, else 0."""
        return int(self._acquire(keys=[self.lease_key, self.epoch_counter], args=[self.holder, self.ttl_ms]))

    def acquire(self, poll_s: float = 0.1, stop: threading.Event | None = None, wait: bool = True) -> int:
        """The epoch once this process holds the lease (0: `stop` was set, or not free and not `wait`)."""
        self._keep_presence()       # before taking the lease: a holder always has its presence
        while not (stop and stop.is_set()):
            try:
                dead = self._dead_holder() if wait else None
                if dead:
                    self._release(keys=[self.lease_key], args=[dead])
                epoch = self.try_acquire()
            except Exception as e:  # noqa: BLE001 - Redis away: keep waiting, the stack restarts it
                log.warning("lease: cannot reach Redis (%s); retrying", e)
                epoch = 0
            if epoch:
                self.epoch, self._renewed_at = epoch, time.monotonic()
                threading.Thread(target=self._keep, name="lease", daemon=True).start()
                return epoch
            if not wait:
                return 0
            time.sleep(poll_s)
        return 0

    def _keep(self) -> None:
        every = self.ttl_ms / 5000.0
        deadline = self._renewed_at + self.ttl_ms / 1000.0
        while not self._stop.wait(every):
            self._keep_presence()
            try:
                if int(self._renew(keys=[self.lease_key, self.epoch_counter],
                                   args=[self.holder, self.ttl_ms, self.epoch])):
                    self._renewed()
                    deadline = self._renewed_at + self.ttl_ms / 1000.0
                    continue
                reason = "another job holds it"
            except Exception as e:  # noqa: BLE001 - judged by the deadline below
                if time.monotonic() < deadline:
                    continue
                reason = f"no renewal within the lease ({e})"
            log.error("lease lost (%s): this job stops writing", reason)
            self.on_lost()
            return

    def _renewed(self) -> None:
        """Track the longest time between two renewals: how close this job came to losing the lease
        (a starved process, a long pause). A gap past half the TTL is logged."""
        now = time.monotonic()
        gap_ms, self._renewed_at = (now - self._renewed_at) * 1000.0, now
        self.worst_gap_ms = max(self.worst_gap_ms, gap_ms)
        if gap_ms > self.ttl_ms / 2:
            log.warning("lease: %.0f ms between renewals (lease %d ms)", gap_ms, self.ttl_ms)

    def take_worst_gap_ms(self) -> float:
        """The longest time between two renewals since the last call (ms)."""
        worst, self.worst_gap_ms = self.worst_gap_ms, 0.0
        return round(worst)

    def _keep_presence(self) -> None:
        """Keep this process's named connection open to the node that holds the lease's slot now (a
        failed-over or migrated slot moves it)."""
        try:
            node = self.redis.get_node_from_key(self.lease_key)
            where = (node.host, int(node.port))
            if self._presence is not None and self._presence_node == where:
                self._presence.ping()
                return
            self._close_presence()
            self._presence = node_connection(*where, name=PRESENCE_PREFIX + self.holder)
            self._presence_node = where
        except Exception as e:  # noqa: BLE001 - without it a standby waits for the TTL, or takes over early
            self._close_presence()
            log.debug("lease: no presence connection (%s)", e)

    def _close_presence(self) -> None:
        if self._presence is not None:
            self._presence.close()
        self._presence, self._presence_node = None, None

    def _dead_holder(self) -> str | None:
        """The lease's holder when it has had no presence connection for ABSENT_POLLS polls in a row
        (killed), else None."""
        self._keep_presence()
        holder = self.redis.get(self.lease_key)
        if self._presence is None or holder is None or holder == self.holder:
            self._absent = (None, 0)
            return None
        try:
            present = self._present(holder)
        except Exception:  # noqa: BLE001 - cannot tell: the TTL decides
            self._absent = (None, 0)
            return None
        misses = 0 if present else (self._absent[1] + 1 if self._absent[0] == holder else 1)
        self._absent = (holder, misses)
        if misses < ABSENT_POLLS:
            return None
        log.warning("lease: the holder %s has no connection left (its process died): taking over", holder)
        return holder

    def _present(self, holder: str) -> bool:
        """Whether the holder's presence connection is open on the lease's node. Once found in the
        node's client list, it is looked up by its client id (CLIENT LIST ID: one entry, whatever the
        number of clients); the whole list is read again only when that id no longer answers with the
        holder's name (a reconnect gives a new id; a dead holder has none)."""
        name = PRESENCE_PREFIX + holder
        seen = self._seen_at
        if seen is not None and seen[:2] == (holder, self._presence_node):
            if any(c.get("name") == name for c in self._presence.client_list(client_id=[seen[2]])):
                return True
        self._seen_at = None
        for c in self._presence.client_list():
            if c.get("name") == name:
                self._seen_at = (holder, self._presence_node, c["id"])
                return True
        return False

    def release(self) -> None:
        self._stop.set()
        try:
            self._release(keys=[self.lease_key], args=[self.holder])
        except Exception:  # noqa: BLE001 - it expires anyway
            pass
        self._close_presence()


def mark_standby(redis, holder: str) -> None:
    """This process is warm and waits for the lease (what `status` and the failover benchmark read)."""
    redis.set(STANDBY_KEY, holder)


def standby_holder(redis) -> str | None:
    """The id of the job process last marked as a warm standby (check that it still runs)."""
    return redis.get(STANDBY_KEY)


def lease_holder(redis) -> str | None:
    """The id of the job process holding the lease (None: no active job)."""
    return redis.get(LEASE_KEY)
