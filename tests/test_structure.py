"""The house's shape, checked: imports point tools -> bridge -> head, no module imports itself round
a cycle (lazy imports inside functions count too), and no module outgrows 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"head": 0, "bridge": 1, "tools": 2}  # a module may import its own layer or a lower one
MAX_LINES = 400


def modules() -> dict[str, Path]:
    return {f"{layer}.{path.stem}": path for layer in LAYERS for path in sorted((ROOT / layer).glob("*.py"))
            if path.stem != "__init__"}


def imports_of(name: str, path: Path) -> set[str]:
    """Project modules imported anywhere in the file (relative imports resolved, function bodies included)."""
    layer = name.split(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = [layer] if node.level == 1 else []
            parts = base + (node.module.split(".") if node.module else [])
            if len(parts) == 1:  # from . import x / from ..bridge import x
                found |= {f"{parts[0]}.{a.name}" for a in node.names}
            else:
                found.add(".".join(parts[:2]))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("clef_bridge."):
            found.add(".".join(node.module.split(".")[1:3]))
    return {m for m in found if m in modules()}


GRAPH = {name: imports_of(name, path) for name, path in modules().items()}


def test_the_walker_sees_imports():
    assert "head.schema" in GRAPH["head.encoder"] and "bridge.loading" in GRAPH["bridge.server"]
    assert any("bridge." in m for m in GRAPH["tools.cli"])  # lazy imports inside functions are seen


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_imports_point_down(name):
    upward = [m for m in GRAPH[name] if LAYERS[m.split(".")[0]] > LAYERS[name.split(".")[0]]]
    assert not upward, f"{name} imports {upward}: imports must point tools -> bridge -> head"


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_modules_stay_small(name):
    lines = len(modules()[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (at most {MAX_LINES}): split it along its seams"
