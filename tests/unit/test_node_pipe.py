"""The RESP packing of NodePipeline (no server needed): what redis-py would send, numpy scalars as numbers."""
from __future__ import annotations

import numpy as np
from redis.connection import Connection

from fencing.model.node_pipe import encode


def test_plain_arguments_pack_like_redis_py():
    args = ("HSET", "pos:{farm-1}", "dev-é", b'{"lat":47.1}', "n", 17, "x", 0.1, "big", 1e22, "neg", -3)
    assert encode(args) == b"".join(Connection().pack_command(*args))


def test_numpy_scalars_and_bytearrays_pack_as_their_plain_values():
    assert encode(("ZADD", "k", np.float64(0.3), np.int64(5), bytearray(b"m"))) == encode(("ZADD", "k", 0.3, 5, b"m"))
    assert b"np." not in encode(("SET", "k", np.float64(47.25)))
