"""The house's shape, checked: imports point tools -> bridge -> head, and inside bridge/ from room to
room only as each room's docstring allows (catalogue < host < gguf < demo < media < llama < config < model <
server < scale); no module imports itself round a cycle (lazy imports inside functions count too); the installed
package never imports the checkout's tests/ or benchmarks/; no module outgrows 600 lines nor a folder of bridge/ 15
modules; every module of bridge/ and head/ is imported by a test; llama-cpp-python is imported by
bridge/llama/native.py alone, so the rest loads without it."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("head", "bridge", "tools")  # installed as clef_bridge.<name>
# the order of the layers: a module may import its own layer or a lower one
LAYERS = ("head", "bridge.catalogue", "bridge.host", "bridge.gguf", "bridge.demo", "bridge.media", "bridge.llama",
          "bridge.config", "bridge.model", "bridge.service", "bridge.server", "bridge.scale", "tools")
MAX_LINES = 600
MAX_MODULES = 15  # a folder of bridge/ with more is several rooms: give them folders (as server/doors/)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules()


def layer_of(name: str) -> str:
    return max((layer for layer in LAYERS if name == layer or name.startswith(layer + ".")), key=len, default=name)


def imports_of(name: str, path: Path) -> set[str]:
    """Modules imported anywhere in the file (relative imports resolved, function bodies included): project
    modules by their dotted name under clef_bridge, and `tests`/`benchmarks` when those are reached for."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            target = base + (node.module.split(".") if node.module else [])
            found |= {".".join(target + [a.name]) for a in node.names} | {".".join(target)}
        elif isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")
            if top[0] == "clef_bridge":
                found |= {".".join(top[1:] + [a.name]) for a in node.names} | {".".join(top[1:])}
            elif top[0] in ("tests", "benchmarks"):
                found.add(top[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in ("tests", "benchmarks")}
    return {m for m in found if m in MODULES or m in ("tests", "benchmarks")}


GRAPH = {name: imports_of(name, path) - {name} for name, path in MODULES.items()}


def allowed_rooms(room: str) -> set[str]:
    """The rooms a bridge subpackage's docstring says it may import ("May import: head, host, ...")."""
    doc = ast.get_docstring(ast.parse((ROOT / room.replace(".", "/") / "__init__.py").read_text())) or ""
    match = re.search(r"May import: ([a-z, ]+)\.", doc)
    assert match, f"{room}/__init__.py must say what it may import ('May import: ...')"
    return {("head" if r.strip() == "head" else f"bridge.{r.strip()}") for r in match.group(1).split(",")}


def test_the_walker_sees_imports():
    assert "head.schema" in GRAPH["head.encoder"] and "bridge.service.models" in GRAPH["bridge.server.app"]
    assert any(m.startswith("bridge.") for m in GRAPH["tools.cli"])  # lazy imports inside functions are seen


def test_imports_point_down():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward, outside = {}, {}
    for name, imported in GRAPH.items():
        mine = rank.get(layer_of(name), len(LAYERS))
        if up := sorted(m for m in imported if rank.get(layer_of(m), -1) > mine):
            upward[name] = up
        if out := sorted(m for m in imported if m in ("tests", "benchmarks")):
            outside[name] = out
    assert not upward, f"imports must point tools -> bridge (scale > server > model > llama > media > gguf > host) " \
                       f"-> head: {upward}"
    assert not outside, f"the installed package cannot reach the checkout's folders: {outside}"


@pytest.mark.parametrize("room", [layer for layer in LAYERS if layer.startswith("bridge.")])
def test_rooms_import_what_their_docstring_allows(room):
    allowed = allowed_rooms(room) | {room}
    used = {layer_of(m) for name in GRAPH if layer_of(name) == room for m in GRAPH[name]
            if m not in ("tests", "benchmarks") and layer_of(m) != "bridge"}
    assert used <= allowed, f"{room} imports {sorted(used - allowed)}, beyond its docstring's {sorted(allowed)}"


def test_every_package_is_installed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {f"clef_bridge.{name}" for name, path in MODULES.items() if path.name == "__init__.py"}
    assert on_disk == listed, f"pyproject.toml's packages differ from the folders: {sorted(on_disk ^ listed)}"


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(m for m in GRAPH[node] if m in GRAPH and not node.startswith(m + ".")):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_modules_stay_within_the_limit():
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along their seams): {long}"


def test_folders_stay_within_the_limit():
    counts: dict[str, int] = {}
    for name, path in MODULES.items():
        if name.startswith("bridge"):
            folder = str(path.parent.relative_to(ROOT))
            counts[folder] = counts.get(folder, 0) + 1
    crowded = {folder: n for folder, n in counts.items() if n > MAX_MODULES}
    assert "bridge/server/doors" in counts and not crowded, \
        f"folders over {MAX_MODULES} modules (__init__ counted; split them into rooms): {crowded}"


def modules_imported_by(path: Path) -> set[str]:
    """The project modules a test file imports by name (`from clef_bridge.x.y import f`, `import clef_bridge.x.y`,
    `from clef_bridge.x import y`), function bodies included; a package alone does not count for its modules."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                node.module.split(".")[0] == "clef_bridge":
            target = node.module.split(".")[1:]
            found |= {".".join(target + [a.name]) for a in node.names} | {".".join(target)}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("clef_bridge.")}
    return found


def untested(test_files: list[Path]) -> list[str]:
    """The modules of bridge/ and head/ (packages' __init__ aside) that no test file imports."""
    seen = set().union(*(modules_imported_by(p) for p in test_files))
    return sorted(name for name, path in MODULES.items()
                  if name.split(".")[0] in ("bridge", "head") and path.name != "__init__.py" and name not in seen)


def test_the_test_walker_counts_modules_not_packages(tmp_path):
    test = tmp_path / "test_x.py"
    test.write_text("import clef_bridge.head.answer\nfrom clef_bridge.bridge.llama import log\n"
                    "from clef_bridge.bridge.server import app\nfrom clef_bridge.bridge import media\n"
                    "def f():\n    from clef_bridge.bridge.host.paths import cache_dir\n")
    assert {"head.answer", "bridge.llama.log", "bridge.server.app", "bridge.host.paths"} <= modules_imported_by(test)
    left = untested([test])
    assert "bridge.media.audio" in left and "bridge.media" not in left  # the package imported, not its modules
    assert not {"head.answer", "bridge.llama.log", "bridge.server.app", "bridge.host.paths"} & set(left)


def test_every_module_is_imported_by_a_test():
    left = untested(sorted((ROOT / "tests").rglob("test_*.py")))
    assert not left, f"modules no test imports (add tests/test_<module>.py): {left}"


NATIVE = "llama_cpp"


def native_imports(path: Path) -> list[int]:
    """Lines of a file that import llama-cpp-python, at module level or inside a function."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == NATIVE for a in node.names)
            or isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == NATIVE]


def test_the_native_walker_sees_every_form(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import llama_cpp as lc\nfrom llama_cpp import mtmd_cpp\nimport numpy\n"
                      "def f():\n    import llama_cpp._ctypes_extensions\n")
    assert native_imports(module) == [1, 2, 5]


def test_only_the_native_module_imports_llama_cpp():
    """Importing the registry, the service or the server must not need the native library (`pytest -m unit` runs
    without it): every other module reaches it through native.py's lazy modules."""
    found = {name: lines for name, path in MODULES.items()
             if name != "bridge.llama.native" and (lines := native_imports(path))}
    assert not found, f"import llama_cpp through bridge/llama/native.py (lc, lc_ext, mtmd, ctypes_ext): {found}"
