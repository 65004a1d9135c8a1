"""The shape of the project's imports, read from the source (every import
statement, at module level or inside a function, counts)."""

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("deliveries", "webhooker", "bench")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
    }


def imported(path: Path, name: str, modules) -> set[str]:
    """The project modules `path` (module `name`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                # `from package import module` imports the module; otherwise a name
                # from the module `base`.
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else base)
    return found & modules.keys()


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported(path, name, modules) for name, path in modules.items()}


def path_between(graph, start: str, goal: str) -> list[str] | None:
    """One chain of imports from `start` to `goal`, or None."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        current = todo.pop()
        for nxt in sorted(graph[current]):
            if nxt not in paths:
                paths[nxt] = [*paths[current], nxt]
                if nxt == goal:
                    return paths[nxt]
                todo.append(nxt)
    return None


def test_the_graph_sees_known_imports():
    graph = import_graph()
    assert "deliveries.models" in graph["deliveries.engine.claims"]
    assert "deliveries.targets.transport" in graph["deliveries.targets.http"]
    assert "deliveries.targets" in graph["deliveries.models"]


def test_no_target_type_reaches_the_models():
    """Target types get the task and the body from the engine; the models import
    them (Target.Type, config validation), never the other way round."""
    graph = import_graph()
    for name in sorted(graph):
        if name == "deliveries.targets" or name.startswith("deliveries.targets."):
            chain = path_between(graph, name, "deliveries.models")
            assert chain is None, " -> ".join(chain)


def test_no_import_cycle_among_project_modules():
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as exc:
        # graphlib lists each module before the one that imports it.
        raise AssertionError("import cycle: " + " imports ".join(reversed(exc.args[1]))) from None


def test_the_application_never_reaches_the_http_server():
    """The view, the ingest path and the database backends read what the server
    says of a request from webhooker.request_context; the server (webhooker.server)
    is loaded by gunicorn alone."""
    graph = import_graph()
    for name in sorted(graph):
        if name.startswith(("deliveries.", "webhooker.db")):
            for server in ("webhooker.server.bridge", "webhooker.server.protocol"):
                chain = path_between(graph, name, server)
                assert chain is None, " -> ".join(chain)
