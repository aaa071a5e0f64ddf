"""Farms and devices: creation and lookup. Secrets are returned once and stored hashed."""
from __future__ import annotations

import re
import time

import orjson

from api.auth import hash_secret, new_secret, secrets_changed
from fencing.model import keys

DEVICE_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}\Z")     # \Z: "$" would let a trailing newline in
HERD = re.compile(r"[\w .:-]{0,64}\Z")


def create_farm(redis, name: str) -> tuple[str, str]:
    name = (name or "").strip()
    if not name or len(name) > 128:
        raise ValueError("farm name must be 1..128 characters")
    farm_id = new_secret("farm").replace("farm_", "farm-")[:21].lower()
    api_key = new_secret("hfk")
    digest = hash_secret(api_key)
    redis.hset(keys.farm(farm_id), mapping={"name": name, "key_hash": digest, "created": int(time.time() * 1000)})
    redis.set(keys.apikey(digest), farm_id)
    redis.sadd(keys.FARMS, farm_id)
    return farm_id, api_key


def rotate_farm_key(redis, farm_id: str) -> str:
    """A new API key for the farm; the old one stops working at once (every API worker drops its
    cached keys on the notice)."""
    old = redis.hget(keys.farm(farm_id), "key_hash")
    if old is None:
        raise LookupError(f"no farm {farm_id}")
    api_key = new_secret("hfk")
    digest = hash_secret(api_key)
    redis.set(keys.apikey(digest), farm_id)
    redis.hset(keys.farm(farm_id), "key_hash", digest)
    redis.delete(keys.apikey(old))
    secrets_changed(redis)
    return api_key


def revoke_device_token(redis, farm_id: str, device_id: str) -> bool:
    """The device's token stops working at once; False when the farm has no such device."""
    raw = redis.hget(keys.farm_devices(farm_id), device_id)
    if raw is None:
        return False
    record = orjson.loads(raw)
    old = record.pop("token_hash", None)
    if old:
        redis.delete(keys.devtoken(old))
    redis.hset(keys.farm_devices(farm_id), device_id, orjson.dumps(record))
    secrets_changed(redis)
    return True


def register_device(redis, farm_id: str, device_id: str, herd: str | None, with_token: bool) -> str | None:
    """Register (or update) a device; returns its new token when `with_token`."""
    """Register (or re-register) a device in a farm; returns a new device token when asked for one."""
    token = new_secret("hfd") if with_token else None
    existing = redis.hget(keys.farm_devices(farm_id), device_id)
    record = orjson.loads(existing) if existing else {"created": int(time.time() * 1000)}
    if herd is not None:
        record["herd"] = herd
    if token:
        old = record.get("token_hash")
        if old:
            redis.delete(keys.devtoken(old))
            secrets_changed(redis)   # API workers drop the old token now
        record["token_hash"] = hash_secret(token)
        redis.set(keys.devtoken(record["token_hash"]), f"{farm_id}\t{device_id}")
    redis.hset(keys.farm_devices(farm_id), device_id, orjson.dumps(record))
    _add_to_registry(redis, farm_id, device_id)
    return token


def _add_to_registry(redis, farm_id: str, device_id: str) -> None:
    current = redis.hget(keys.DEVICE_REGISTRY, device_id)
    joined = registry_with(current, farm_id)
    if joined != current:
        redis.hset(keys.DEVICE_REGISTRY, device_id, joined)


def registry_with(current: str | None, farm_id: str) -> str:
    """The device registry's entry (the farms that registered the id, in registration order) with
    `farm_id` added last. Order matters: the first farm owns the bare id (a Kafka record without
    farm_id goes to it, fencing.stream.prepare); a later farm that registers the same id cannot take
    or break that farm's feed, and its own gateways must name their farm."""
    farms = current.split(",") if current else []
    return current if farm_id in farms else ",".join([*farms, farm_id])


def bare_id_owner(redis, device_id: str) -> str | None:
    """The farm a Kafka record without farm_id for this device goes to (the first to register it)."""
    current = redis.hget(keys.DEVICE_REGISTRY, device_id)
    return current.split(",")[0] if current else None


def device_record(redis, farm_id: str, device_id: str) -> dict | None:
    raw = redis.hget(keys.farm_devices(farm_id), device_id)
    return orjson.loads(raw) if raw else None


def known_devices(redis, farm_id: str, device_ids: list[str]) -> set[str]:
    if not device_ids:
        return set()
    values = redis.hmget(keys.farm_devices(farm_id), device_ids)
    return {d for d, v in zip(device_ids, values) if v is not None}


def device_records(redis, farm_id: str, device_ids: list[str]) -> dict[str, dict]:
    if not device_ids:
        return {}
    values = redis.hmget(keys.farm_devices(farm_id), device_ids)
    return {d: orjson.loads(v) for d, v in zip(device_ids, values) if v}


def herd_of(raw: str | bytes | None) -> str | None:
    return orjson.loads(raw).get("herd") if raw else None


def register_devices_bulk(redis, devices, with_tokens: bool = False, chunk: int = 10_000) -> dict[str, str]:
    """Register many devices with a few pipelines: ``devices`` = (farm_id, device_id, herd) triples.

    Same records as `register_device` (an existing device keeps its record; herd is updated; a new
    token replaces the old one); returns {device_id: token} when ``with_tokens``. Per chunk: one
    HMGET per farm and one of the registry, then one HSET per farm and one of the registry."""
    devices = list(devices)
    for _, device_id, herd in devices:
        if not DEVICE_ID.match(device_id):
            raise ValueError(f"invalid device_id {device_id!r}")
        if herd is not None and not HERD.match(herd):
            raise ValueError(f"invalid herd {herd!r}")
    tokens: dict[str, str] = {}
    now = int(time.time() * 1000)
    for start in range(0, len(devices), chunk):
        part = devices[start:start + chunk]
        by_farm: dict[str, list[tuple[str, str | None]]] = {}
        for farm_id, device_id, herd in part:
            by_farm.setdefault(farm_id, []).append((device_id, herd))
        ids = sorted({d for _, d, _ in part})
        pipe = redis.pipeline()
        for farm_id, rows in by_farm.items():
            pipe.hmget(keys.farm_devices(farm_id), [d for d, _ in rows])
        pipe.hmget(keys.DEVICE_REGISTRY, ids)
        answers = pipe.execute()
        registry = dict(zip(ids, answers[-1]))
        pipe = redis.pipeline()
        for (farm_id, rows), existing in zip(by_farm.items(), answers[:-1]):
            mapping = {}
            for (device_id, herd), raw in zip(rows, existing):
                record = orjson.loads(raw) if raw else {"created": now}
                if herd is not None:
                    record["herd"] = herd
                if with_tokens:
                    token = new_secret("hfd")
                    if record.get("token_hash"):
                        pipe.delete(keys.devtoken(record["token_hash"]))
                    record["token_hash"] = hash_secret(token)
                    pipe.set(keys.devtoken(record["token_hash"]), f"{farm_id}\t{device_id}")
                    tokens[device_id] = token
                mapping[device_id] = orjson.dumps(record)
                registry[device_id] = registry_with(registry.get(device_id), farm_id)
            pipe.hset(keys.farm_devices(farm_id), mapping=mapping)
        pipe.hset(keys.DEVICE_REGISTRY, mapping={d: registry[d] for d in ids})
        pipe.execute()
    if with_tokens:
        secrets_changed(redis)   # tokens may have replaced older ones
    return tokens
