"""The import graph flows one way (docs/architecture.md, "Where things live"), read from the source with `ast`:
api/ and ingest/ use the fence model, never the Spark job or the elastic controller; nothing in
fencing/, ingest/ or api/ imports deploy/ or loadgen/; the model imports only itself and the
configuration; and no module-level import circle exists."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fencing", "ingest", "api", "deploy", "loadgen")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "node_modules" in path.parts:
                continue
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            out[name] = path
    return out


def _imports(path: Path, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] in PACKAGES}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


MODULES = _modules()
EDGES = {m: {r for i in _imports(p, False) if (r := _resolve(i, MODULES)) and r != m} for m, p in MODULES.items()}


def _violations(source_prefixes: tuple[str, ...], target_prefixes: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in EDGES.items() if m.startswith(source_prefixes)
                  for t in targets if t.startswith(target_prefixes))


def test_api_and_ingest_never_import_the_job_or_the_controller():
    assert "fencing.model.keys" in EDGES["api.auth"] and "fencing.stream.routing" in EDGES["fencing.elastic.controller"]
    assert _violations(("api", "ingest"), ("fencing.stream", "fencing.elastic")) == []


TASK_SIDE = ("fencing.stream.prepare", "fencing.stream.process", "fencing.stream.shedding", "fencing.stream.rows",
             "fencing.stream.batch_core", "fencing.stream.routing")


def test_the_tasks_code_never_imports_the_controller_and_the_controller_never_the_tasks():
    """One side per module: what runs in the Spark tasks knows nothing of the elastic controller (it
    reads the routing table the controller publishes), and the controller runs none of the tasks' code."""
    assert "fencing.stream.routing" in EDGES["fencing.stream.prepare"]
    assert _violations(TASK_SIDE, ("fencing.elastic",)) == []
    assert _violations(("fencing.elastic",), tuple(m for m in TASK_SIDE if m != "fencing.stream.routing")) == []


def test_the_core_never_imports_launchers_or_load_generators():
    assert _violations(("fencing", "ingest", "api"), ("deploy", "loadgen")) == []


CONFIGURATION = ("fencing.config", "fencing.settings_model")   # fencing.config_docs prints it


def test_the_model_imports_only_itself_and_the_configuration():
    allowed = ("fencing.model", *CONFIGURATION, "fencing")
    bad = [v for v in _violations(("fencing.model",), PACKAGES) if not v.split(" -> ")[1].startswith(allowed)]
    assert bad == []
    # The configuration imports nothing of the project but its own parts.
    outside = [v for v in _violations(CONFIGURATION, PACKAGES) if not v.split(" -> ")[1].startswith(CONFIGURATION)]
    assert outside == [] and "fencing.settings_model" in EDGES["fencing.config"]


def test_no_module_level_import_circle():
    graph = {m: {r for i in _imports(p, True) if (r := _resolve(i, MODULES)) and r != m}
             for m, p in MODULES.items()}
    state: dict[str, int] = {}
    circle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                circle.extend(path[path.index(t):] + [t] if t in path else [m, t])
                return True
            if t not in state and visit(t, path + [t]):
                return True
        state[m] = 2
        return False
    for m in sorted(graph):
        if m not in state and visit(m, [m]):
            break
    assert circle == [], " -> ".join(circle)
