"""A standby job yields the CPU while it warms and waits (issue 19): on a shared machine its start
(a JVM, Python workers, fence caches, the planner's warm-up) took the cores from the active job for
about a minute after every take-over, doubling its freshness lag. The standby runs at a lower
priority (niceness, inherited by its JVM and Python workers), and the moment it takes the lease it
puts itself and every process it started back at the normal priority.

Linux with autogroup scheduling (sched_autogroup_enabled) shares the CPU between sessions first, and a
process's niceness only ranks it inside its own session: the supervisor starts every component in a
session of its own, so a niced standby still took a full session's share (10 core-s of an 18 s flood
at 100k fences, when its fence load met the measured window). A standby that leads its session
therefore also lowers the session's autogroup niceness, and raises it again with the rest.

Going back up needs the right to raise priority (root, or RLIMIT_NICE): without it the standby keeps
the normal priority from the start, as an active job must not be left behind the broker and Redis."""
from __future__ import annotations

import logging
import os
import resource
from pathlib import Path

import psutil

log = logging.getLogger(__name__)
AUTOGROUP = Path("/proc/self/autogroup")    # "/autogroup-N nice K": the share of the CPU of the process's session


def can_restore() -> bool:
    """Whether this process may go back to niceness 0 once it lowered its priority."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= 20


def lower(niceness: int) -> bool:
    """Run this process (and what it starts from now on) at `niceness`; False when it may not."""
    if niceness <= 0 or not can_restore():
        return False
    os.setpriority(os.PRIO_PROCESS, 0, niceness)
    _set_session_niceness(niceness)
    return True


def session_niceness() -> int | None:
    """The niceness of this process's autogroup (None: no autogroup scheduling here)."""
    try:
        return int(AUTOGROUP.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _set_session_niceness(niceness: int) -> None:
    """Rank the autogroup of the session this process leads (its JVM and Python workers are in it)
    against the other sessions; only a session leader does, as the session is then the job's own."""
    if os.getsid(0) != os.getpid() or session_niceness() is None:
        return
    try:
        AUTOGROUP.write_text(str(niceness))
    except OSError as e:
        log.warning("standby priority: the session's niceness stays as it is (%s)", e)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children...)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def threads(pid: int) -> list[int]:
    """The thread ids of a process (Linux keeps a niceness per thread)."""
    try:
        return [t.id for t in psutil.Process(pid).threads()]
    except psutil.Error:                              # gone, or not ours to read
        return []


def restore() -> int:
    """Back to niceness 0: every thread of this process and of every process it started (a JVM's
    threads each carry their own), and of its session. Returns how many threads were raised."""
    if session_niceness():
        _set_session_niceness(0)
    raised = 0
    for pid in [os.getpid(), *descendants(os.getpid())]:
        for tid in threads(pid):
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) != 0:
                    os.setpriority(os.PRIO_PROCESS, tid, 0)
                    raised += 1
            except ProcessLookupError:
                continue                              # ended meanwhile
            except PermissionError as e:
                log.warning("standby priority: cannot restore thread %d of process %d (%s)", tid, pid, e)
    return raised
