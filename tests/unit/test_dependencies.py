"""Lean runtime: pyproject's dependencies, the runtime lock and the images hold what herdfence runs on;
test tools and the benchmarks' extras are `test` and `bench` extras with locks of their own, which
`make setup` installs for the suite and the benchmarks. Every module of the project imports without
them."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from tests.conftest import ROOT

TEST_TOOLS = {"pytest", "pytest-timeout", "hypothesis", "schemathesis", "py-spy", "pyyaml"}
BENCH_ONLY = {"tqdm", "matplotlib"}
UNUSED = {"protobuf"}          # transformWithStateInPandas needs it; herdfence keeps its state in Redis
NOT_RUNTIME = TEST_TOOLS | BENCH_ONLY | UNUSED
LOCKS = {"runtime": "requirements.lock", "test": "requirements-test.lock", "bench": "requirements-bench.lock"}


def _name(requirement: str) -> str:
    """The normalized project name of a requirement ("PyYAML>=6" → "pyyaml", "jsonschema_rs" → "jsonschema-rs")."""
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins(lock: str) -> dict[str, str]:
    """{name: line} of a lock file's pins (`-r` includes and comments left out)."""
    pins = {}
    for line in (ROOT / lock).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            pins[_name(line)] = line
    return pins


def test_the_runtime_dependencies_hold_no_test_tool_bench_extra_or_protobuf():
    runtime = {_name(r) for r in _project()["dependencies"]}
    assert runtime & NOT_RUNTIME == set()
    assert set(_pins(LOCKS["runtime"])) & NOT_RUNTIME == set()


def test_the_extras_name_the_test_tools_and_the_bench_extras():
    extras = {k: {_name(r) for r in v} for k, v in _project()["optional-dependencies"].items()}
    assert {"pytest", "pytest-timeout", "hypothesis", "schemathesis", "pyyaml"} <= extras["test"]
    assert BENCH_ONLY | {"py-spy"} <= extras["bench"]


def test_each_lock_pins_its_part_on_top_of_the_runtime_lock():
    project = _project()
    parts = {"runtime": project["dependencies"], **project["optional-dependencies"]}
    for part, requirements in parts.items():
        pins = _pins(LOCKS[part])
        assert {_name(r) for r in requirements} <= set(pins), f"{LOCKS[part]} misses some of {part}"
        if part != "runtime":
            assert f"-r {LOCKS['runtime']}" in (ROOT / LOCKS[part]).read_text().splitlines()
            assert not set(pins) & set(_pins(LOCKS["runtime"])), f"{LOCKS[part]} pins a runtime package again"


def test_make_setup_installs_every_lock():
    """`make test` on a fresh clone needs the test tools, the benchmarks' tests the bench extras."""
    makefile = (ROOT / "Makefile").read_text()
    locks = re.search(r"^LOCKS\s*:=\s*(.+)$", makefile, re.M).group(1).split()
    assert sorted(locks) == sorted(LOCKS.values())
    assert "$(addprefix -r ,$(LOCKS))" in makefile and "$(STAMP): $(BIN)/python $(LOCKS)" in makefile


def test_the_images_install_the_runtime_only():
    for path in sorted(p for p in (ROOT / "deploy" / "docker").iterdir() if p.is_file()):   # not __pycache__
        text = path.read_text()
        installs = [line.strip() for line in re.findall(r"pip\s+install[^\n&]*", text)]
        for line in installs:
            assert "requirements-" not in line and "[" not in line, f"{path.name}: {line}"
            assert not any(tool in line for tool in NOT_RUNTIME), f"{path.name}: {line}"
        assert not re.search(r"requirements-(test|bench)\.lock|\[(test|bench)\]", text), path.name
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    assert "pip install -r requirements.lock" in dockerfile
    assert all("--no-deps" in line for line in re.findall(r"pip install [^\n]*\.whl", dockerfile))


BLOCKER = """
import importlib, importlib.abc, pkgutil, sys
BLOCKED = ("pytest", "_pytest", "hypothesis", "schemathesis", "tqdm", "matplotlib", "yaml", "google.protobuf")

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"No module named {name!r} (not in the runtime)")

sys.meta_path.insert(0, NotInstalled())
failed = []
for package in ("ingest", "fencing", "api", "deploy", "loadgen"):
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        try:
            importlib.import_module(info.name)
        except Exception as err:
            failed.append(f"{info.name}: {type(err).__name__}: {err}")
print("\\n".join(failed))
"""


def test_every_module_imports_with_the_runtime_only():
    """Test tools, the bench extras and protobuf made unimportable: every module of the project still
    imports (a progress bar or a plot is imported where it is used, and does without)."""
    done = subprocess.run([sys.executable, "-c", BLOCKER], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", done.stdout


def test_the_load_generator_runs_without_the_bench_extras():
    """No tqdm: a silent counter; no matplotlib: the plot is skipped and said so."""
    code = """
import sys
sys.modules["tqdm"] = None           # import tqdm → ImportError
sys.modules["matplotlib"] = None
from loadgen import plots, progress
bar = progress.bar(total=3, desc="x")
bar.update(2)
assert isinstance(bar, progress.Silent) and bar.n == 2
assert plots._plt() is None
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "matplotlib is not installed" in done.stderr


PSUTIL_USERS = ("deploy/procs.py", "deploy/supervisor.py", "fencing/stream/fork_server.py",
                "fencing/stream/standby_priority.py", "loadgen/bench_memory.py", "loadgen/bench_cpu.py")


def test_process_state_comes_from_psutil_not_hand_parsed_proc_files():
    """Process state, parents, groups, RSS and CPU ticks come from psutil in these modules: no hand
    parsing of a process's /proc files (stat, status, cmdline, environ, task), no listing of /proc and
    no /proc/<pid> existence check."""
    by_hand = re.compile(r"""/proc/(\{[^}]*\}|self|\d+)(/(stat|status|cmdline|environ|task)\b|["'])|["']/proc["']""")
    for path in PSUTIL_USERS:
        code = "\n".join(line.split("#", 1)[0] for line in (ROOT / path).read_text().splitlines())
        assert not by_hand.search(code), f"{path} reads /proc by hand: {by_hand.search(code).group(0)}"
        assert "import psutil" in code, path
