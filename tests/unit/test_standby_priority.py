"""fencing.stream.standby_priority on real processes: a standby that lowered its priority starts
children at that priority, and on taking over puts itself, every thread and every descendant back."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fencing.stream import standby_priority

SCRIPT = r"""
import os, subprocess, sys, threading, time
from fencing.stream import standby_priority as sp
at_start = sp.session_niceness()          # None: no autogroup for the new session (a cpu cgroup, or none at all)
assert sp.lower(10)
worker = threading.Thread(target=time.sleep, args=(30,), daemon=True)     # a thread started while standing by
worker.start()
child = subprocess.Popen([sys.executable, "-c",
                          "import subprocess, sys, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"])
time.sleep(1.0)
tree = [os.getpid(), *sp.descendants(os.getpid())]
before = sorted({os.getpriority(os.PRIO_PROCESS, t) for p in tree for t in sp.threads(p)})
session_before = sp.session_niceness()
raised = sp.restore()
after = sorted({os.getpriority(os.PRIO_PROCESS, t) for p in tree for t in sp.threads(p)})
print(len(tree), before, after, raised, worker.native_id in sp.threads(os.getpid()), session_before,
      sp.session_niceness(), at_start is not None)
for p in sp.descendants(os.getpid()):
    try:
        os.kill(p, 9)
    except ProcessLookupError:
        pass
child.wait()
"""


def test_a_standby_runs_lowered_and_takes_its_whole_tree_back_to_normal():
    if not standby_priority.can_restore():
        pytest.skip("no right to raise priority here: a standby keeps the normal priority")
    # a session of its own, as the supervisor starts the job
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                         start_new_session=True)
    assert out.returncode == 0, out.stderr
    processes, before, after, raised, worker_seen, session_before, session_after, autogroup = out.stdout.split()
    # this process, its child and the grandchild `sleep`: every thread at 10, then every one at 0
    assert (processes, before, after, worker_seen) == ("3", "[10]", "[0]", "True")
    assert int(raised) >= 4                     # main thread, the worker thread, child, grandchild
    # with autogroup scheduling, the session (the standby's share against the other sessions) too;
    # whether the new session has an autogroup is the child's to say, not this process's
    if autogroup == "True":
        assert (session_before, session_after) == ("10", "0")
    else:
        assert (session_before, session_after) == ("None", "None")


def test_a_process_that_does_not_lead_its_session_leaves_the_session_alone():
    if not standby_priority.can_restore() or standby_priority.session_niceness() is None:
        pytest.skip("no right to raise priority, or no autogroup scheduling here")
    script = ("import os; from fencing.stream import standby_priority as sp; assert os.getsid(0) != os.getpid(); "
              "assert sp.lower(10); print(sp.session_niceness()); sp.restore()")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(standby_priority.session_niceness())]


def test_nothing_is_lowered_when_it_could_not_be_undone(monkeypatch):
    monkeypatch.setattr(standby_priority, "can_restore", lambda: False)
    assert standby_priority.lower(10) is False
