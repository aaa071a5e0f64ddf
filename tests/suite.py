"""`make test`: the whole suite as two pytest runs side by side, each on stacks of its own.

- the shared run: unit tests, then every test of the shared stack (tests/conftest.py starts that stack
  while the unit tests run);
- the destructive run: the tests that bring up a broker or Spark of their own (marker own_services),
  then the scenarios that kill, freeze, stop or restore their stack (the disposable stack), then the
  standalone Spark cluster.

The destructive scenarios spend much of their time waiting (a job's JVM starting, a lease running out,
a supervisor's restart): measured alone they keep the 2 cores of this machine 57% busy, so the other
run fills the rest. Each run has its own ports, homes and pytest temp dir. The shared run prints as it
goes; the destructive run's output follows once both have ended. The exit code is the first non-zero
of the two.

`python -m tests.suite [pytest args]` passes extra arguments to both runs.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
NO_TESTS = 5      # pytest's exit code when a run selected no test


def _pytest(marker: str, basetemp: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "--durations=15", "-m", marker, f"--basetemp={basetemp}",
            *extra, "tests"]


def main(argv: list[str]) -> int:
    ARTIFACTS.mkdir(exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix="herdfence-suite-"))
    destructive_log = ARTIFACTS / "destructive-run.log"
    started = time.monotonic()
    with destructive_log.open("w") as out:
        destructive = subprocess.Popen(_pytest("destructive or own_services", temp / "destructive", argv), cwd=ROOT,
                                       stdout=out, stderr=subprocess.STDOUT)
        print(f"suite: the destructive run (pid {destructive.pid}) writes to {destructive_log}", flush=True)
        try:
            shared = subprocess.run(_pytest("not destructive and not own_services", temp / "shared", argv), cwd=ROOT).returncode
        except KeyboardInterrupt:
            destructive.terminate()
            raise
        print(f"suite: the shared run ended ({shared}) after {time.monotonic() - started:.0f} s; "
              "waiting for the destructive run", flush=True)
        destructive_code = destructive.wait()
    print(f"\n===== the destructive run ({destructive_code}) =====", flush=True)
    sys.stdout.write(destructive_log.read_text())
    print(f"\nsuite: shared run {'passed' if shared == 0 else f'FAILED ({shared})'}, destructive run "
          f"{'passed' if destructive_code == 0 else f'FAILED ({destructive_code})'}, "
          f"{time.monotonic() - started:.0f} s in all", flush=True)
    codes = [c for c in (shared, destructive_code) if c != NO_TESTS]   # a selection may leave one run empty
    return next((c for c in codes if c), 0) if codes else NO_TESTS


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
