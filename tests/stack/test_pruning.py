"""What grows with time is pruned: the deleted-fence set (fencing/model/deleted_fences.py) keeps an entry
only while a device state can still name the fence; a stray members hash of the fence goes with it."""
from __future__ import annotations

import secrets

import orjson

from fencing.model import keys
from fencing.model.deleted_fences import DELETED_AT, DELETED_FENCES, named_in_states, prune
from fencing.stream.pruning import first_replayable_batch
from tests.conftest import wait_for
from tests.farmkit import Farm, square

INSIDE = (8.505, 47.005)
OUTSIDE = (8.53, 47.03)


def _replay_floor(stack) -> tuple[str, int]:
    checkpoint = stack.settings.checkpoint_dir
    run = orjson.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"][:8]
    return run, first_replayable_batch(str(checkpoint))


def test_deleted_fence_leaves_the_set_once_no_device_state_names_it(stack):
    farm = Farm(stack, "pruning")
    fence_id = farm.fence(square(8.50, 47.00))
    uid = f"{farm.farm_id}/{fence_id}"
    farm.device("cow-p")
    farm.report("cow-p", INSIDE, INSIDE)
    farm.wait_events(1, device_id="cow-p")
    assert farm.api.delete(f"/v1/fences/{fence_id}").status_code == 204
    redis = stack.redis
    assert redis.sismember(DELETED_FENCES, uid) and redis.hget(DELETED_AT, uid)
    # a members hash written by a batch that was in flight while the fence was deleted
    redis.hset(keys.members(farm.farm_id, fence_id), "cow-p", "2024-01-01T00:00:00Z")

    # cow-p's state still names the fence (it has not reported since): the entry must stay
    assert uid not in prune(redis, 0, *_replay_floor(stack))    # (other tests' entries may go)
    assert redis.sismember(DELETED_FENCES, uid)

    # its next report makes the job forget the fence; once that batch is committed ("p" is then never
    # read again) the entry goes, and the stray members hash with it
    farm.wait_seen("cow-p", farm.report("cow-p", OUTSIDE)[0])
    wait_for(lambda: uid in prune(redis, 0, *_replay_floor(stack)), timeout=60, what="the entry pruned")
    assert not redis.sismember(DELETED_FENCES, uid)
    assert redis.hget(DELETED_AT, uid) is None
    assert not redis.exists(keys.members(farm.farm_id, fence_id))
    assert [e["type"] for e in farm.events(device_id="cow-p")] == ["enter"]   # nothing for the deleted fence


def test_prune_keeps_entries_in_grace_redated_or_named_by_a_replayable_batch(stack):
    redis = stack.redis
    tag = secrets.token_hex(4)
    uid_p, uid_new, uid_old = f"pr-{tag}/f-p", f"pr-{tag}/f-new", f"pr-{tag}/f-old"
    state_key = keys.group_state(f"pt{tag}")
    before = {"t": 1, "f": {uid_p: [1, 0, 0, 1, 0]}}
    after = {"t": 2, "f": {}}
    redis.hset(state_key, f"pr-{tag}/cow", orjson.dumps({"b": "runx:7", "s": after, "p": before}))
    try:
        # batch 7 may be replayed: its "p" names uid_p; once 8 is the first replayable, it does not
        assert named_in_states(redis, [uid_p], "runx", 7) == {uid_p}
        assert named_in_states(redis, [uid_p], "runx", 8) == set()
        assert named_in_states(redis, [uid_p], "", 0) == {uid_p}              # run unknown: careful
        assert named_in_states(redis, [uid_p], "other", 0) == set()           # an old run is never replayed

        pipe = redis.pipeline()
        pipe.sadd(DELETED_FENCES, uid_p, uid_new, uid_old)
        pipe.hset(DELETED_AT, mapping={uid_p: 1_000, uid_new: 9_000})       # uid_old: from before times were kept
        pipe.execute()
        # at 10 s with 5 s of grace: uid_new is too recent, uid_old gets a time now, uid_p is named
        assert prune(redis, 5, "runx", 7, at_ms=10_000) == []
        assert redis.hget(DELETED_AT, uid_old) == "10000"
        assert sorted(prune(redis, 5, "runx", 8, at_ms=20_000)) == sorted([uid_p, uid_new, uid_old])
        assert not redis.smismember(DELETED_FENCES, [uid_p, uid_new, uid_old]).count(1)
    finally:
        redis.delete(state_key)
        redis.srem(DELETED_FENCES, uid_p, uid_new, uid_old)
        redis.hdel(DELETED_AT, uid_p, uid_new, uid_old)


def test_failed_webhook_deliveries_are_bounded_and_go_with_the_last_webhook(stack):
    from api.webhooks import failed_key, record_failure
    farm = Farm(stack, "failed hooks")
    redis = stack.redis
    body = orjson.dumps({"event_id": "e", "type": "enter"})
    for i in range(25):
        record_failure(redis, farm.farm_id, "h-1", f"HTTP 50{i % 10}", body, keep=10)
    assert redis.llen(failed_key(farm.farm_id)) == 10
    assert orjson.loads(redis.lindex(failed_key(farm.farm_id), 0))["reason"] == "HTTP 504"     # the newest
    hooks = [farm.api.post("/v1/webhooks", json={"url": f"http://127.0.0.1:9/h{i}"}).json()["id"] for i in range(2)]
    assert farm.api.delete(f"/v1/webhooks/{hooks[0]}").status_code == 204
    assert redis.llen(failed_key(farm.farm_id)) == 10          # another webhook is left
    assert farm.api.delete(f"/v1/webhooks/{hooks[1]}").status_code == 204
    assert not redis.exists(failed_key(farm.farm_id))


def test_history_compaction_beside_the_running_job_keeps_every_position(stack):
    from fencing.model.history_compact import compact
    farm = Farm(stack, "compaction")
    farm.device("cow-h")
    for point in (INSIDE, OUTSIDE, INSIDE):        # three batches at least: three small files
        farm.wait_seen("cow-h", farm.report("cow-h", point)[0])
    history = farm.api.get("/v1/positions/history", params={"device_id": "cow-h"})
    assert history.status_code == 200 and len(history.json()["features"]) == 3, history.text
    root = stack.settings.history_dir
    files_before = len(list(root.glob("day=*/*.parquet")))
    compact(str(root), *_replay_floor(stack))     # while the job goes on writing (and may compact too)
    assert len(list(root.glob("day=*/*.parquet"))) < files_before
    again = farm.api.get("/v1/positions/history", params={"device_id": "cow-h"})
    assert again.json() == history.json()


def test_a_fence_named_only_in_the_delta_of_the_state_before_is_kept_while_replayable(stack):
    """Records keep the state before their batch as a delta (transitions.state_record, issue 23): a
    fence the device had before that batch, gone after it, is named in "d" until the batch commits."""
    from fencing.model.transitions import state_record
    redis = stack.redis
    tag = secrets.token_hex(4)
    uid = f"pd-{tag}/f-d"
    state_key = keys.group_state(f"pd{tag}")
    before = {"t": 1, "f": {uid: [1, 0, 0, 1, 0, 0]}}
    after = {"t": 2, "f": {}}
    redis.hset(state_key, f"pd-{tag}/cow", orjson.dumps(state_record("runy:7", after, before)))
    try:
        assert named_in_states(redis, [uid], "runy", 7) == {uid}
        assert named_in_states(redis, [uid], "runy", 8) == set()
    finally:
        redis.delete(state_key)
