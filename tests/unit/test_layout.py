"""The house's rules, read from the source, so that growth goes into new rooms
rather than back into a few big ones: no module of the application over 600 lines
(migrations aside, and models.py, a cohesive list of models), the engine's class
small, and tests that share code through tests/support, never through each other."""

import ast

from tests.support.processes import ROOT

MAX_MODULE_LINES = 600
MAX_ENGINE_LINES = 250


def test_no_module_of_the_application_is_over_600_lines():
    long = {}
    for package in ("deliveries", "webhooker"):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts or path.name == "models.py":
                continue
            lines = len(path.read_text().splitlines())
            if lines > MAX_MODULE_LINES:
                long[str(path.relative_to(ROOT))] = lines
    assert long == {}


def test_the_engine_class_stays_small():
    tree = ast.parse((ROOT / "deliveries" / "engine" / "core.py").read_text())
    (engine,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine"]
    assert engine.end_lineno - engine.lineno + 1 < MAX_ENGINE_LINES


def test_no_test_module_imports_another():
    """Whatever the layer: a module named test_* anywhere under tests/."""
    found = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            if tests := [n for n in names if n.startswith("tests.") and ".test_" in n]:
                found.append(f"{path.relative_to(ROOT)}: {tests[0]}")
    assert found == []
