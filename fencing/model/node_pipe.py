"""Commands pipelined straight to each master's connection, grouped by the slot owner of their key.

redis-py's cluster pipeline costs ~40 µs of Python per command here (measured with 20k HSETs; its
per-master pipelines ~19 µs), refuses EVALSHA, and a batch's writes are tens of thousands of
commands. So each master's share is packed into one RESP buffer here, sent on a pooled connection,
and its replies are read with one hiredis reader (~3 µs a command). Every master gets its share
before any reply is read, so the masters work at the same time (42k events into the farms' logs:
0.51 -> 0.37 s). A command that fails on its
master (slot moved during a migration, failover, NOSCRIPT) is
made again on its own through the cluster client, which follows redirects; the answers of the ones
that succeeded are kept, so each command's effect and answer is that of exactly one successful run
(the callers only send commands that may run twice: overwrites, set operations, HSETNX scripts).

Fenced writes (an epoch given) go to each master as one script call for all of its slots
(fencing.model.lease FENCED_NODE): a batch writes a few keys per farm into thousands of farm slots,
and a script call per slot cost the master ~25 µs each on top of its writes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import hiredis
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from fencing.model.lease import LUA_UNPACK_MAX, split_command

# the only reply shape the callers need converted (redis-py's callbacks are not run on raw replies)
_REPLY = {"HGETALL": lambda r: dict(zip(r[::2], r[1::2])) if isinstance(r, list) else r}


def _arg(a) -> bytes:  # noqa: ANN001
    if isinstance(a, float):
        return repr(float(a)).encode()          # float(): numpy's repr is "np.float64(…)"
    if isinstance(a, int):
        return b"%d" % a
    return a.encode() if isinstance(a, str) else bytes(a) if isinstance(a, (bytes, bytearray, memoryview)) \
        else str(a).encode()


# argument types hiredis packs exactly as redis-py would (numpy scalars and bool it would not)
_PLAIN = frozenset((str, bytes, int, float))


def encode(args: tuple) -> bytes:
    """One command in RESP (arguments as redis-py encodes them: str as UTF-8, numbers as text).
    hiredis packs plain arguments in C (~2x faster on a batch's large HSETs); anything else here."""
    if _PLAIN.issuperset(map(type, args)):
        return hiredis.pack_command(args)
    parts = [a if type(a) is bytes else a.encode() if type(a) is str else _arg(a) for a in args]
    return b"".join([b"*%d\r\n" % len(parts)] + [b"$%d\r\n%s\r\n" % (len(a), a) for a in parts])


def _send(node, commands: list[tuple]):  # noqa: ANN001, ANN201 - redis-py ClusterNode, Connection
    """Send the commands to one master in one write; returns the connection to read the replies from
    (`_receive`). Every master is sent its share before any reply is read, so the masters run their
    shares at the same time (a master buffers its replies meanwhile)."""
    pool = node.redis_connection.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command([b"".join(encode(c) for c in commands)], check_health=False)
    except BaseException:
        conn.disconnect()
        pool.release(conn)
        raise
    return conn


def _receive(node, conn, commands: list[tuple]) -> list:  # noqa: ANN001 - redis-py ClusterNode, Connection
    """The replies to `commands` sent on `conn` (error replies come back as exception objects, in
    place). A connection that failed midway is dropped, never reused."""
    pool = node.redis_connection.connection_pool
    try:
        reader = hiredis.Reader(encoding="utf-8" if conn.encoder.decode_responses else None)
        replies: list = []
        while len(replies) < len(commands):
            reply = reader.gets()
            if reply is False:                  # incomplete: read more
                data = conn._sock.recv(1 << 20)
                if not data:
                    raise RedisConnectionError("connection closed by the server")
                reader.feed(data)
            else:
                replies.append(reply)
        return [_REPLY[c[0]](r) if c[0] in _REPLY and not isinstance(r, Exception) else r
                for c, r in zip(commands, replies)]
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


# commands that change data: under an epoch they run through the fenced script (fencing.model.lease)
_WRITES = frozenset(("HSET", "HDEL", "SADD", "SREM", "ZADD", "ZREM", "SET", "DEL", "LPUSH", "LTRIM", "XADD",
                     "EXPIRE", "PEXPIRE", "INCR", "INCRBY", "HINCRBY"))
_FENCED_SCRIPTS: dict[tuple[int, str], object] = {}
_MARKS: dict[str, tuple[str, int]] = {}   # key → its hash tag's epoch mark, and its slot (keys repeat batch after batch)
GROUP_ARGS = 20_000     # arguments per node-grouped script call at most: a script holds its master (~30 ms here)


def _loaded(redis, source: str):  # noqa: ANN001, ANN202 - RedisCluster, redis Script
    script = _FENCED_SCRIPTS.get((id(redis), source))
    if script is None:
        script = redis.register_script(source)
        redis.script_load(source)
        _FENCED_SCRIPTS[(id(redis), source)] = script
    return script


def fenced_script(redis):  # noqa: ANN001, ANN201 - RedisCluster, redis Script
    """The fenced-command script of this client, loaded on every master once per process."""
    from fencing.model.lease import FENCED_COMMAND
    return _loaded(redis, FENCED_COMMAND)


def _mark(key: str) -> tuple[str, int]:
    known = _MARKS.get(key)
    if known is None:
        from fencing.model.lease import epoch_key
        if len(_MARKS) > 100_000:
            _MARKS.clear()
        known = _MARKS[key] = (epoch_key(key), key_slot(key.encode()))
    return known


def _node_lookup(redis):  # noqa: ANN001, ANN202 - RedisCluster; a callable slot → ClusterNode
    """The master of a slot, read from the client's slot map as it is at one pipeline's execution
    (redis-py's get_node_from_slot takes a lock and checks deprecated arguments per call: ~4% of a
    process task's CPU when every write has its own slot). A slot it does not cover goes to
    get_node_from_slot, which raises."""
    manager = redis.nodes_manager
    slots, get_node = manager.slots_cache, manager.get_node_from_slot

    def node_of(slot: int):  # noqa: ANN202
        owners = slots.get(slot)
        return owners[0] if owners else get_node(slot)
    return node_of


class NodePipeline:
    """`epoch` > 0: every write is checked against the epoch mark of its slot, atomically with the
    write, and refused (FENCED, raised from `execute`) when a newer active job has written there.

    The fenced writes bound for one master go together: one script call per master (fencing.model.lease
    FENCED_NODE) runs them mark by mark, each mark's in queue order and checked once, instead of one
    call per slot or per write (a batch writes tens of thousands of keys, a few per farm). A command
    that is not a fenced write ends the group of its master: per slot, commands run in queue order."""

    def __init__(self, redis, epoch: int = 0) -> None:  # noqa: ANN001 - RedisCluster
        self.redis = redis
        self.epoch = epoch
        self._calls: list[tuple[str, tuple]] = []    # (routing key, command args)
        self._retry: dict[int, object] = {}          # index → how to run it alone (scripts: reload)
        self._fenced: dict[int, tuple[str, int]] = {}   # index → its epoch mark and its slot (a fenced write)

    def __len__(self) -> int:
        return len(self._calls)

    def command(self, key: str, *args, retry=None) -> int:  # noqa: ANN001 - a callable
        """Queue `args` (command name first) routed by `key`; returns its index in the answers.
        `retry`: what to call instead when it must run again alone (default: the same command)."""
        if self.epoch and str(args[0]).upper() in _WRITES:
            return self._queue_fenced(key, args)
        self._calls.append((key, args))
        if retry is not None:
            self._retry[len(self._calls) - 1] = retry
        return len(self._calls) - 1

    def _queue_fenced(self, key: str, args: tuple) -> int:
        target = args[1] if isinstance(args[1], str) else args[1].decode()
        mark = _mark(target)
        for part in [args] if len(args) <= LUA_UNPACK_MAX else split_command(args):
            self._calls.append((key, part))
            self._fenced[len(self._calls) - 1] = mark
        return len(self._calls) - 1

    def _fenced_alone(self, mark: str, part: tuple):  # noqa: ANN202
        script = fenced_script(self.redis)
        return script(keys=[mark, part[1]], args=[self.epoch, part[0], *part[2:]])

    def script(self, script, keys: list[str], args: list) -> int:  # noqa: ANN001 - redis Script
        """EVALSHA of a registered script; run alone (loading the script where missing) on failure."""
        return self.command(keys[0], "EVALSHA", script.sha, len(keys), *keys, *args,
                            retry=lambda: script(keys=keys, args=args))

    def hset(self, key: str, mapping: dict) -> int:
        return self.command(key, "HSET", key, *chain.from_iterable(mapping.items()))

    def hmget(self, key: str, fields: list) -> int:
        return self.command(key, "HMGET", key, *fields)

    def _requests(self, calls: list[tuple[str, tuple]], fenced: dict[int, tuple[str, int]]) -> list[_Request]:
        """What to send: plain calls one by one, fenced writes grouped per master (a group goes where
        its first write was queued, and a plain call to its master closes it: per slot, queue order)."""
        if not fenced:
            return [_Request(key, args, [i]) for i, (key, args) in enumerate(calls)]
        from fencing.model.lease import FENCED_NODE
        sha = _loaded(self.redis, FENCED_NODE).sha
        node_of = _node_lookup(self.redis)
        out: list[_Request | _NodeGroup] = []
        open_: dict[str, _NodeGroup] = {}            # node name → its group still taking writes
        for i, (key, args) in enumerate(calls):
            known = fenced.get(i)
            if known is None:
                out.append(_Request(key, args, [i]))
                if open_:        # writes queued after it on its master go after it
                    open_.pop(node_of(key_slot(key.encode() if type(key) is str else key)).name, None)
                continue
            mark, slot = known
            node = node_of(slot).name
            group = open_.get(node)
            if group is None or group.size + len(args) > GROUP_ARGS:
                group = open_[node] = _NodeGroup(args[1])     # routed where its writes go
                out.append(group)
            group.add(i, mark, args)
        return [r.request(sha, self.epoch) if type(r) is _NodeGroup else r for r in out]

    def execute(self) -> list:
        calls, retry, fenced = self._calls, self._retry, self._fenced
        self._calls, self._retry, self._fenced = [], {}, {}
        requests = self._requests(calls, fenced)
        # each master's requests in queue order: a node group holds writes of several slots, so its
        # place among the master's other requests is its queue position, not its routing slot's
        by_node: dict[str, list[int]] = {}
        nodes = {}
        node_of = _node_lookup(self.redis)
        for r, request in enumerate(requests):
            key = request.key
            node = node_of(key_slot(key.encode() if type(key) is str else key))
            nodes[node.name] = node
            by_node.setdefault(node.name, []).append(r)
        answers: list = [None] * len(calls)
        failed: list[int] = []
        reload = False
        sent = []
        for name, indices in by_node.items():       # every master's share out first, then the replies
            commands = [requests[r].args for r in indices]
            try:
                sent.append((name, indices, commands, _send(nodes[name], commands)))
            except (RedisError, OSError):
                failed += [i for r in indices for i in requests[r].members]   # unreachable: retried below
        for name, indices, commands, conn in sent:
            try:
                replies = _receive(nodes[name], conn, commands)
            except (RedisError, OSError):
                failed += [i for r in indices for i in requests[r].members]
                continue
            for r, reply in zip(indices, replies):
                request = requests[r]
                if isinstance(reply, Exception):
                    failed += request.members        # not run (a whole group: NOSCRIPT, MOVED)
                    if request.grouped and str(reply).startswith("NOSCRIPT"):
                        reload = True                # a master new since the load (a failover)
                    continue
                for i, answer in zip(request.members, reply if request.grouped else [reply]):
                    if isinstance(answer, Exception):
                        failed.append(i)
                    else:
                        answers[i] = answer
        if reload:
            from fencing.model.lease import FENCED_NODE
            try:
                self.redis.script_load(FENCED_NODE)     # on every master: the next batches group again
            except (RedisError, OSError):
                pass                                    # a master still away: the writes go alone below
        for i in sorted(failed):
            if i in fenced:
                answers[i] = self._fenced_alone(fenced[i][0], calls[i][1])
            else:
                answers[i] = retry[i]() if i in retry else self.redis.execute_command(*calls[i][1])
        return answers


@dataclass
class _Request:
    """One command sent, and the queued calls (indices) its reply answers."""
    key: str
    args: tuple
    members: list[int]
    grouped: bool = False            # a node group: its reply holds one answer per member


@dataclass
class _NodeGroup:
    """Fenced writes bound for one master, sent as one FENCED_NODE call: grouped by their epoch mark
    (one per hash tag: two tags can share a slot, never a mark), each mark's writes in queue order."""
    key: str                                         # the first write's key: routes the call
    marks: dict[str, list] = field(default_factory=dict)   # mark → its writes (index, args)
    size: int = 0

    def add(self, index: int, mark: str, args: tuple) -> None:
        writes = self.marks.get(mark)
        if writes is None:
            writes = self.marks[mark] = []
            self.size += 2
        writes.append((index, args))
        self.size += len(args) + 1

    def request(self, sha: str, epoch: int) -> _Request:
        argv: list = [epoch]
        members: list[int] = []
        for mark, writes in self.marks.items():
            argv += (mark, len(writes))
            for index, args in writes:
                argv += (len(args) - 2, *args)
                members.append(index)
        first_mark = next(iter(self.marks))
        return _Request(self.key, ("EVALSHA", sha, 1, first_mark, *argv), members, grouped=True)
