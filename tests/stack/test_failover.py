"""Hot standby (issue 19), black-box: two job processes, the lease decides which one is active. A kill -9
of the active job hands the push path to the warm standby, every event exactly once; a frozen active job
(SIGSTOP past its lease) is replaced, and once resumed it writes nothing and exits.

One private stack for the module (it kills and freezes jobs), on ports of its own."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from fencing.model.heartbeat import read_heartbeat, recent_heartbeats
from loadgen import kafka_writer
from tests.chaoskit import Herd, alive, wait_until
from tests.conftest import Stack
from tests.farmkit import Farm, square

pytestmark = pytest.mark.stack



@pytest.fixture(scope="module")
def hot(disposable) -> Stack:
    """The disposable stack runs the embedded default: an active job and a warm standby."""
    return disposable


def _redis(stack: Stack, clients: dict = {}):  # noqa: B006 - one client per stack for the module
    return clients.setdefault(id(stack), stack.redis)


def _roles(stack: Stack) -> dict[str, dict] | None:
    """status --json's job (active) and job_standby, once both are up in their roles and the standby
    is warm."""
    import json
    comps = json.loads(stack.cli("status", "--json", check=False) or "{}").get("components", {})
    active, standby = comps.get("job", {}), comps.get("job_standby", {})
    if active.get("role") == "active" and standby.get("role") == "standby" and standby.get("ready") \
            and alive(standby.get("pid")) and alive(active.get("pid")) and active["pid"] != standby["pid"]:
        return {"active": active, "standby": standby}
    return None


def _beat_of(stack: Stack, pid: int, after: float = 0.0):
    """The newest heartbeat written by job process `pid` after `after` (None: none yet)."""
    beat = read_heartbeat(_redis(stack))
    return beat if beat and beat.holder.endswith(f":{pid}") and beat.time > after else None


def test_a_frozen_active_job_is_replaced_and_once_resumed_writes_nothing(hot):
    roles = wait_until(lambda: _roles(hot), 240, interval=1, what="an active job and a standby")
    old_pid, standby_pid = roles["active"]["pid"], roles["standby"]["pid"]
    old = wait_until(lambda: _beat_of(hot, old_pid), 120, what="a batch of the active job")

    farm = Farm(hot, "frozen")
    farm.fence(square(8.50, 47.00))
    farm.device("fz-cow")
    farm.report("fz-cow", (8.505, 47.05), (8.505, 47.005), (8.505, 47.005))      # outside, then inside
    farm.wait_events(1, timeout=60, device_id="fz-cow")

    frozen_at = time.time()
    os.killpg(old_pid, signal.SIGSTOP)                 # driver, JVM and Python workers: paused, not dead
    try:
        farm.report("fz-cow", (8.505, 47.05), (8.505, 47.05))    # leaves: only a new active job can see it
        new = wait_until(lambda: _beat_of(hot, standby_pid, frozen_at), 120, interval=0.2,
                         what="the standby's first batch after the take-over")
        took_s = new.time - frozen_at
        assert new.epoch > old.epoch, (new.epoch, old.epoch)
        events = farm.wait_events(2, timeout=60, device_id="fz-cow")
    finally:
        os.killpg(old_pid, signal.SIGCONT)
    resumed_at = time.time()
    wait_until(lambda: not alive(old_pid), 30, interval=0.2, what="the resumed old job to exit")
    print(f"SIGSTOP: the standby's first batch {took_s:.1f} s after the freeze; "
          f"the resumed job exited within {time.time() - resumed_at:.1f} s")
    # the old driver wrote nothing after the take-over: no heartbeat of its epoch, no second event
    late = [b for b in recent_heartbeats(_redis(hot), 2000) if b.epoch == old.epoch and b.time > new.time]
    assert not late, late[:3]
    time.sleep(2)
    assert [e["type"] for e in farm.events(device_id="fz-cow")] == [e["type"] for e in events] == ["enter", "exit"]
    # the supervisor starts the old process again, and it stands by
    roles = wait_until(lambda: _roles(hot), 240, interval=1, what="a new standby")
    assert roles["active"]["pid"] == standby_pid


def test_kill9_of_the_active_job_mid_stream_hands_over_with_every_event_once(hot):
    roles = wait_until(lambda: _roles(hot), 240, interval=1, what="an active job and a standby")
    active_pid, standby_pid = roles["active"]["pid"], roles["standby"]["pid"]
    farm_id, key = hot.new_farm("kill the active")
    herd = Herd.create(hot.api_url, farm_id, key, "hk", devices=20, steps=40, seed=13)
    writer = threading.Thread(target=kafka_writer.write_reports, args=(hot.kafka_bootstrap, herd.reports),
                              kwargs={"rate": 120, "progress": False})
    since = time.time()
    writer.start()
    wait_until(lambda: (lambda b: b and b.time > since and b.points > 0)(read_heartbeat(_redis(hot))), 120,
               interval=0.2, what="a batch with points")
    killed_at = time.time()
    os.killpg(active_pid, signal.SIGKILL)
    new = wait_until(lambda: _beat_of(hot, standby_pid, killed_at), 120, interval=0.2,
                     what="the standby's first batch after the kill")
    print(f"kill -9: the standby's first batch {new.time - killed_at:.1f} s after the kill")
    writer.join()
    result = herd.reconcile(timeout=240)
    print(f"kill -9 of the active job: {result}")
    assert result["events"] >= 10
    assert (result["lost"], result["duplicated"], result["unexpected"], result["duplicate_event_ids"]) == (0, 0, 0, 0), result
    roles = wait_until(lambda: _roles(hot), 240, interval=1, what="a new standby")
    assert roles["active"]["pid"] == standby_pid and roles["standby"]["pid"] != active_pid
