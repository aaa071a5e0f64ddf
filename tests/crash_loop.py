"""Whole-stack crash, repeated: `python -m tests.crash_loop --runs 20` (a slow check, run by hand).

Each round, on one home (the default one unless HERDFENCE_HOME is set): `up --detach`; a new farm
with a herd of 40 collars; four threads post its reports over HTTP as fast as the API takes them;
after 8 s every process of the stack is frozen (SIGSTOP), then killed (SIGKILL), children included;
`up --detach --timeout 60` again while the writers keep retrying; then every report is reconciled
against the reference oracle: 0 lost, 0 duplicated, 0 unexpected events, no duplicate event id.

Prints one line per round and a JSON summary; exits 1 when any round hung or did not reconcile.
Traffic goes to 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from deploy import procs
from fencing.config import load_settings
from loadgen import http_writer
from tests.chaoskit import Herd, wait_until

HERDFENCE = str(Path(sys.executable).parent / "herdfence")


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([HERDFENCE, *args], capture_output=True, text=True, timeout=timeout)


def _up(ready_s: float) -> tuple[bool, float, str]:
    started = time.monotonic()
    done = _cli("up", "--detach", "--timeout", str(ready_s), timeout=ready_s + 120)
    return done.returncode == 0, time.monotonic() - started, done.stderr[-600:]


def _freeze_and_kill(run_dir: Path) -> int:
    """SIGSTOP every process group of the stack, then SIGKILL them; returns how many groups."""
    groups = [int(p.read_text()) for p in run_dir.glob("*.pid")]
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    wait_until(lambda: not any(procs.group_members(g) for g in groups), 30, what="every process to die")
    return len(groups)


def one_round(n: int, load_s: float, ready_s: float) -> dict:
    settings = load_settings()
    ok, took, err = _up(ready_s)
    if not ok:
        return {"round": n, "hang": True, "phase": "first up", "up_s": round(took, 1), "stderr": err}
    farm = json.loads(_cli("farm", "create", f"crash {n}", "--json").stdout)
    herd = Herd.create(settings.api_url, farm["farm_id"], farm["api_key"], f"c{n}", devices=40, steps=60, seed=n)
    box: dict = {}
    writer = threading.Thread(target=lambda: box.update(stats=http_writer.write_reports(
        settings.api_url, herd.reports, key=farm["api_key"], batch_size=10, workers=4, retries=60,
        progress=False)))
    writer.start()
    time.sleep(load_s)                   # the load runs for this long before the crash
    groups = _freeze_and_kill(settings.run_dir)
    ok, took, err = _up(ready_s)
    writer.join(timeout=900)
    out = {"round": n, "groups_killed": groups, "up_s": round(took, 1), "hang": not ok}
    if not ok:
        out["stderr"] = err
        return out
    stats = box["stats"]
    out["acknowledged"] = stats.sent
    out["failed_posts"] = stats.failed
    out.update(herd.reconcile(timeout=240))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.crash_loop", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--load-seconds", type=float, default=8.0)
    p.add_argument("--ready-seconds", type=float, default=60.0)
    args = p.parse_args(argv)
    rounds = []
    for n in range(1, args.runs + 1):
        r = one_round(n, args.load_seconds, args.ready_seconds)
        rounds.append(r)
        print(json.dumps(r), flush=True)
    bad = [r for r in rounds if r.get("hang") or r.get("failed_posts") or
           (r.get("lost"), r.get("duplicated"), r.get("unexpected"), r.get("duplicate_event_ids")) != (0, 0, 0, 0)]
    summary = {"runs": len(rounds), "bad": len(bad), "hangs": sum(bool(r.get("hang")) for r in rounds),
               "up_s_max": max(r["up_s"] for r in rounds),
               "acknowledged": sum(r.get("acknowledged", 0) for r in rounds),
               "events": sum(r.get("events", 0) for r in rounds)}
    print(json.dumps(summary), flush=True)
    _cli("down")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
