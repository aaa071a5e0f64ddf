"""The fork server's client (fencing/stream/fork_server.py): run as `python -I -S fork_client.py SOCKET
-m MODULE ARGS...` by the interpreter script Spark starts, in place of `python -m MODULE ARGS...`.

It hands the server its stdin, stdout and stderr, environment, working directory and arguments; the
server forks a warm child that runs the module. This process stands in for that child: Spark's
SIGTERM is passed on to it, and it exits with the child's status. Without a server (gone, never
started) it becomes the real interpreter. Standard library only: it starts in a few milliseconds."""
import json
import os
import signal
import socket
import struct
import sys


def _run_here(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


def main() -> None:
    sock_path, argv = sys.argv[1], sys.argv[2:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sock_path)
        request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(request)) + request], [0, 1, 2])
        head = conn.recv(8, socket.MSG_WAITALL)
    except OSError:
        head = b""
    if len(head) != 8:          # no server: run it here, as Spark asked
        conn.close()
        _run_here(argv)
    child = struct.unpack("!q", head)[0]

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    status = b""
    while len(status) < 4:
        try:
            part = conn.recv(4 - len(status))
        except InterruptedError:
            continue
        if not part:
            break
        status += part
    # the server gone before the child ended: report a failure, the child dies with the job
    code = struct.unpack("!i", status)[0] if len(status) == 4 else 1
    if code < 0:                # killed by a signal: end the same way
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
