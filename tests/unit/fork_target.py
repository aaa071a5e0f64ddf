"""Run by tests/unit/test_fork_server.py as `python -m tests.unit.fork_target ...` through the fork
server: reports what it was given, then exits with the code asked for (or sleeps until killed)."""
import os
import sys
import time

if __name__ == "__main__":
    print(f"pid={os.getpid()} ppid={os.getppid()} marker={os.environ.get('FORK_TEST_MARKER')} "
          f"args={','.join(sys.argv[1:])} cwd={os.getcwd()} stdin={sys.stdin.readline().strip()}", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(60)
    sys.exit(int(sys.argv[1]))
