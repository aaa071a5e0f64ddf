"""A warm fork server for the Python process Spark starts with each streaming query (issue 19).

Every query start runs a fresh `python -m pyspark.sql.streaming.python_streaming_source_runner` for
the report source: importing pyspark, pyarrow and the source's modules took 0.25 s of a take-over on
an idle machine, before the new active job's first batch could even be planned. The job starts this
server once (`start`), with those modules already imported, and points Spark's interpreter
(PYSPARK_PYTHON) at a small shell script: `-m <a module in FORKED>` goes to the server, which forks a
child that takes the caller's stdin, stdout, stderr, environment, working directory and arguments and
runs the module (fencing/stream/fork_client.py waits for it in the caller's place); everything else,
or no server, execs the real interpreter as before. Local Spark only: executors on other hosts run
that interpreter path too, and the script is on this host.

The server exits when the job process that started it is gone; its children are in the job's process
group, so they stop with it."""
from __future__ import annotations

import importlib
import json
import logging
import os
import runpy
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
FORKED = (RUNNER,)                   # the modules Spark runs that the server starts
# imported before serving: the runner's own modules (pyspark, pyarrow). Not the job's source, which the
# child imports when Spark sends it: with it (and confluent_kafka) preloaded the push floor fell ~18%
# (58-71k points/s against 78-85k; the cause was not pinned down, librdkafka set up before a fork is
# the suspect)
PRELOAD = (RUNNER,)
CLIENT = Path(__file__).with_name("fork_client.py")
PREFIX = "herdfence-fork-"           # + the job's pid: the folder of its socket and interpreter script


def interpreter_script(folder: Path, sock: Path, python: str = sys.executable,
                       modules: tuple[str, ...] = FORKED) -> Path:
    """The shell script Spark runs as its Python: the listed modules through the server."""
    cases = "|".join(modules)
    script = folder / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-m" ] && [ -S "{sock}" ]; then\n'
        f'  case "$2" in {cases}) exec "{python}" -I -S "{CLIENT}" "{sock}" "$@" ;; esac\n'
        "fi\n"
        f'exec "{python}" "$@"\n')
    script.chmod(0o755)
    return script


def start(modules: tuple[str, ...] = FORKED, preload: tuple[str, ...] = PRELOAD) -> Path:
    """Start the server for this process and return the interpreter script for Spark. It does not
    wait: until the server listens (its imports take a moment), the script runs the plain way."""
    _remove_stale()
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    sock = folder / "sock"
    env = {**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fencing.stream.fork_server", str(sock), str(os.getpid()),
                             ",".join(preload)], env=env, stdin=subprocess.DEVNULL)
    log.info("fork server %d for %s", proc.pid, ", ".join(modules))
    return interpreter_script(folder, sock, modules=modules)


def _remove_stale() -> None:
    """The folders of servers whose job was killed with them (the server removes its own otherwise)."""
    import psutil  # here: the server and its workers do without it
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        owner = folder.name[len(PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not psutil.pid_exists(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)


# --- the server process -----------------------------------------------------------------------------
def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
    if len(data) < 4:
        raise ConnectionError("short request")
    size = struct.unpack("!I", data[:4])[0]
    body = data[4:]
    while len(body) < size:
        part = conn.recv(size - len(body))
        if not part:
            raise ConnectionError("request cut short")
        body += part
    return json.loads(body), fds


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the process Spark started, run its module, never return."""
    code = 1
    try:
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        argv = request["argv"]          # ["-m", module, args...]
        sys.argv = [argv[1], *argv[2:]]
        try:
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported on the caller's stderr, as a plain start would
        import traceback
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _watch(conn: socket.socket, pid: int) -> None:
    """Tell the caller how the child ended; kill the child if the caller is gone first."""
    def caller_gone():
        try:
            conn.recv(1)        # the caller never writes: this returns when it is gone
        except OSError:
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    threading.Thread(target=caller_gone, daemon=True).start()
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
    except OSError:
        pass
    conn.close()


def _exit_with(parent: int, folder: Path) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)


def serve(sock: Path, parent: int, preload: list[str]) -> None:
    for module in preload:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock) + ".new")
    os.rename(str(sock) + ".new", sock)      # the socket appears ready to accept
    listener.listen(16)
    threading.Thread(target=_exit_with, args=(parent, sock.parent), daemon=True).start()
    while True:
        conn, _ = listener.accept()
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError):
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            _child(request, fds)
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(struct.pack("!q", pid))
        except OSError:
            pass
        threading.Thread(target=_watch, args=(conn, pid), daemon=True).start()


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]), [m for m in sys.argv[3].split(",") if m])
