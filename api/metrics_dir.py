"""Where the API workers keep their metrics: one directory per API master, under HERDFENCE_HOME/run.

`uvicorn --workers N` runs N processes, each counting only what it serves. With prometheus-client's
multiprocess mode every worker writes its counters to mmap files in one shared directory, and a scrape,
whichever worker answers it, sums them all. The directory is named after the uvicorn master (its pid and
start time), which spawns the workers: a restarted API begins again from zero (a counter reset, as
Prometheus expects), a worker that uvicorn restarts adds to what its predecessor counted, and the
directories of masters that are gone are removed by the next worker to start.
"""
from __future__ import annotations

import multiprocessing
import os
import re
import shutil
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"
SUBDIR = "api-metrics"
_LIVE_GAUGE_FILE = re.compile(r"gauge_live\w+_(\d+)\.db")


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (with the pid, unique for the machine's uptime);
    None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]   # field 22; the name in parentheses may hold spaces


def _identity(pid: int) -> str | None:
    started = _start_time(pid)
    return None if started is None else f"{pid}-{started}"


def master_pid() -> int:
    """The uvicorn master of a spawned worker, else this process (a single-process server, a test)."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else os.getpid()


def prepare(run_dir: Path) -> Path:
    """Create this API's metrics directory, point prometheus-client at it (before any metric is made)
    and remove those of API masters that no longer run."""
    base = run_dir / SUBDIR
    pid = master_pid()
    path = base / (_identity(pid) or str(pid))
    path.mkdir(parents=True, exist_ok=True)
    for other in base.iterdir():
        pid_text = other.name.split("-", 1)[0]
        if other != path and (not pid_text.isdigit() or _identity(int(pid_text)) != other.name):
            shutil.rmtree(other, ignore_errors=True)
    os.environ[ENV] = str(path)
    return path


def forget_dead_workers(path: Path) -> None:
    """Drop the gauges of workers that died (a gauge is the value now, unlike a counter): their files of
    live-process gauges go, as prometheus-client's mark_process_dead does."""
    from prometheus_client import multiprocess
    for name in os.listdir(path):
        found = _LIVE_GAUGE_FILE.fullmatch(name)
        if found and _start_time(int(found.group(1))) is None:
            multiprocess.mark_process_dead(int(found.group(1)), str(path))
