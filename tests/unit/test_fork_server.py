"""fencing/stream/fork_server.py: Spark's interpreter script hands `-m <module>` starts to a warm fork
server; the child gets the caller's pipes, environment, directory and arguments, and the caller
stands in for it (exit status, signals). Real processes, no Spark (the stack tests run the job's
streaming query through it)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fencing.stream import fork_server

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests.unit.fork_target"


def _parse(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split())


@pytest.fixture()
def server(tmp_path):
    """(interpreter script, server process) for a server that forks TARGET."""
    sock = tmp_path / "sock"
    proc = subprocess.Popen([fork_server.sys.executable, "-m", "fencing.stream.fork_server", str(sock),
                             str(os.getpid()), "json"], cwd=ROOT)
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the fork server did not start"
        time.sleep(0.05)
    yield fork_server.interpreter_script(tmp_path, sock, modules=(TARGET,)), proc
    proc.kill()
    proc.wait()


def _run(script: Path, *args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "FORK_TEST_MARKER": "m-42", "PYTHONPATH": str(ROOT)}
    return subprocess.run([str(script), "-m", TARGET, *args], input="hello\n", capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=30, **kw)


def test_a_module_start_runs_as_a_child_of_the_server_with_the_callers_pipes_and_environment(server, tmp_path):
    script, proc = server
    done = _run(script, "3", "extra", cwd=tmp_path)
    seen = _parse(done.stdout)
    assert int(seen["ppid"]) == proc.pid                     # forked by the server, not started afresh
    assert (seen["marker"], seen["args"], seen["cwd"], seen["stdin"]) == ("m-42", "3,extra", str(tmp_path), "hello")
    assert "to stderr" in done.stderr and done.returncode == 3


def test_other_starts_and_a_missing_server_run_the_plain_interpreter(server, tmp_path):
    script, proc = server
    plain = subprocess.run([str(script), "-c", "import os; print(os.getppid())"], capture_output=True, text=True,
                           timeout=30)
    assert plain.returncode == 0 and int(plain.stdout) == os.getpid()     # exec'd in place, no server
    proc.kill()
    proc.wait()
    (tmp_path / "sock").unlink()
    done = _run(script, "0", cwd=tmp_path)
    assert done.returncode == 0 and int(_parse(done.stdout)["ppid"]) == os.getpid()


def _sleeping_child(script: Path, cwd: Path) -> tuple[subprocess.Popen, int]:
    """A caller whose forked child sleeps: (the caller, the child's pid)."""
    env = {**os.environ, "FORK_TEST_MARKER": "m", "PYTHONPATH": str(ROOT)}
    caller = subprocess.Popen([str(script), "-m", TARGET, "sleep"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env, cwd=cwd)
    caller.stdin.write("x\n")
    caller.stdin.flush()
    return caller, int(_parse(caller.stdout.readline())["pid"])


def _gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not Path(f"/proc/{pid}").exists()


def test_a_signal_to_the_caller_reaches_the_child_and_the_caller_ends_the_same_way(server, tmp_path):
    script, proc = server
    caller, child = _sleeping_child(script, tmp_path)
    caller.send_signal(signal.SIGTERM)                       # what Spark does to stop the runner
    assert caller.wait(10) == -signal.SIGTERM
    assert _gone(child), "the child outlived the signal"


def test_a_caller_killed_outright_takes_its_child_with_it(server, tmp_path):
    script, proc = server
    caller, child = _sleeping_child(script, tmp_path)
    caller.kill()
    caller.wait()
    assert _gone(child), "the child outlived its caller"
