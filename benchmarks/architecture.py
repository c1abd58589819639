"""docs/architecture.md's figures, measured from the repository: what past changes touched (git history), which
modules raise request problems or build a wire shape (the source's syntax trees), and what a traced request runs
through (a profiler over a live in-process server on the built-in demos)."""

from __future__ import annotations

import ast
import asyncio
import base64
import collections
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("head", "bridge", "tools")
# the changes whose cost the docs quote: what, the module it added, the word its commits' subjects carry
CHANGES = {"the last medium (video)": ("bridge/media/video.py", "video"),
           "the last door (Deqio)": ("bridge/server/doors/deqio.py", "deqio")}
# keys only System One's wire shape has: a module writing one of them as a dict key builds that shape
SYSTEMONE_KEYS = ("answers", "usage")
# issue 51's "once": what a traced request should do once, and the function doing it (module, qualified name)
ONCE = {"model resolved": ("bridge/config/registry.py", "resolve"),
        "admitted": ("bridge/model/worker.py", "InferenceWorker._admit"),
        "request key": ("bridge/service/coalesce.py", "request_key"),
        "questions validated": ("head/schema.py", "parse_questions"),
        "media found in the body": ("bridge/media/request.py", "find_references"),
        "media base64 decoded": ("bridge/media/request.py", "referenced"),
        "prompt encoded": ("head/encoder.py", "encode")}


@dataclass(frozen=True)
class Change:
    what: str
    commit: str  # the commit that added its module
    files: int  # that commit's files
    product_modules: int  # of them in head/, bridge/, tools/
    commits: int  # every commit whose subject names it
    files_all: int  # the files they touched together
    product_modules_all: int


@dataclass(frozen=True)
class Trace:
    request: str
    functions: int  # distinct functions of the project that ran
    entered: int  # of them, those entered from another module (or from aiohttp): the calls a reader follows
    calls: int  # calls into them, all told
    modules: int
    threads: int  # threads that ran project code
    hand_offs: int  # times the request's project code moved to another thread
    status: int
    once: dict[str, int] = field(default_factory=dict)  # ONCE's steps: the times each ran (0: not on this path)


@dataclass(frozen=True)
class Architecture:
    changes: list[Change]
    question_type_files: list[str]  # product modules that name a question type as a string
    problem_modules: list[str]  # product modules that raise a request problem (a Problem or an INVALID error)
    systemone_shape_modules: list[str]  # product modules that write System One's own keys
    traces: list[Trace] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _files(commit: str) -> set[str]:
    return {f for f in _git("show", "--name-only", "--format=", commit).split() if f}


def _product(files: set[str]) -> int:
    return sum(f.split("/")[0] in PRODUCT and f.endswith(".py") for f in files)


def change_cost(what: str, path: str, word: str) -> Change:
    """The files the commit that added path touched, and those of every commit whose subject names the word."""
    added = _git("log", "--diff-filter=A", "--format=%h", "--", path).split()
    if not added:  # a shallow clone holds no such commit
        return Change(what, "", 0, 0, 0, 0, 0)
    commit = added[-1]
    first = _files(commit)
    commits = _git("log", "-i", f"--grep={word}", "--format=%h").split()
    touched = set().union(*(_files(c) for c in commits))
    return Change(what, commit, len(first), _product(first), len(commits), len(touched), _product(touched))


def product_modules() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py"))


def _strings(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def invalid_errors() -> set[str]:
    """Names of the error classes a client's request gets a 422 for (every product module imported first: a class
    counts only once its module is loaded)."""
    import importlib

    from clef_bridge.head.errors import Category, ClefError

    for path in product_modules():
        importlib.import_module("clef_bridge." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
                                .removesuffix(".__init__"))

    found, stack = set(), [ClefError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.category is Category.INVALID:
            found.add(cls.__name__)
    return found


def _raises_problem(tree: ast.AST, invalid: set[str]) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name == "Problem":
                return True
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")) in invalid:
                return True
    return False


def _writes_keys(tree: ast.AST, keys: tuple[str, ...]) -> bool:
    return any(isinstance(n, ast.Dict) and any(isinstance(k, ast.Constant) and k.value in keys for k in n.keys)
               for n in ast.walk(tree))


def source_figures() -> tuple[list[str], list[str], list[str]]:
    """(modules naming a question type, modules raising request problems, modules writing System One's keys)."""
    from clef_bridge.head.schema import QUESTION_TYPES

    invalid = invalid_errors()
    types, problems, shapes = [], [], []
    for path in product_modules():
        tree = ast.parse(path.read_text(), str(path))
        name = str(path.relative_to(ROOT))
        if set(QUESTION_TYPES) & _strings(tree):
            types.append(name)
        if _raises_problem(tree, invalid):
            problems.append(name)
        if _writes_keys(tree, SYSTEMONE_KEYS):
            shapes.append(name)
    return types, problems, shapes


class Tracer:
    """A profile hook counting the project's calls while active, in every thread started after it is set."""

    def __init__(self, roots: tuple[str, ...]):
        self.roots = roots
        self.active = False
        self.reset()

    def reset(self) -> None:
        self.functions: set[tuple[str, str]] = set()
        self.entered: set[tuple[str, str]] = set()
        self.calls = 0
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.threads: set[int] = set()
        self.hand_offs = 0
        self._last: int | None = None

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        # comprehensions, generator expressions and lambdas are lines of the function around them, not calls
        if event != "call" or not self.active or code.co_name.startswith("<") or \
                not code.co_filename.startswith(self.roots):
            return
        thread = threading.get_ident()
        function = (frame.f_code.co_filename, frame.f_code.co_qualname)
        self.functions.add(function)
        caller = frame.f_back
        if caller is None or caller.f_code.co_filename != function[0]:
            self.entered.add(function)
        self.calls += 1
        self.counts[function] += 1
        self.threads.add(thread)
        if self._last is not None and thread != self._last:
            self.hand_offs += 1
        self._last = thread


def requests(folder: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """The traced requests: name -> (path, body); each body differs from its warm-up's by its state."""
    from tests.fixturegen_video import Clip, write_clip

    from .fuzz import samples

    png = base64.b64encode(samples(folder)["png"][1]).decode()
    clip = folder / "clip.mp4"
    write_clip(Clip("mp4", ".mp4", "libx264", "aac", 160, 120, 4, 2.0), clip)
    video = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    questions = {"urgent": {"type": "noul", "question": "Is it urgent?"},
                 "queue": {"type": "choice", "question": "Which queue?", "criteria": {"billing": "money",
                                                                                       "tech": "faults"}},
                 "tone": {"type": "score", "question": "How angry?", "criteria": ["calm", "cross", "furious"]}}
    return {
        "(a) Jev, text": ("/v1/systemone", {"model": "demo", "state": "My parcel never arrived.",
                                            "questions": questions}),
        "(b) OpenAI, one image": ("/v1/decisions", {
            "model": "demo", "questions": [{"type": "predicate", "name": "legible", "instructions": "Legible?"}],
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "The receipt:"},
                                                   {"type": "input_image",
                                                    "image_url": f"data:image/png;base64,{png}"}]}]}),
        "(c) Jev, Clef-omni, a video": ("/v1/systemone", {"model": "demo-omni", "state": "What happens?",
                                                          "questions": questions, "videos": [video]}),
    }


def _restated(body: dict[str, Any], n: int) -> dict[str, Any]:
    """The body with its state or first text changed (no answer cache, no coalescing, no prefix reuse between runs)."""
    if "state" in body:
        return {**body, "state": f"{n}: {body['state']}"}
    first = body["input"][0]["content"][0]
    return {**body, "input": [{"role": "user", "content": [{**first, "text": f"{n}: {first['text']}"},
                                                           *body["input"][0]["content"][1:]]}]}


async def _trace_all(tracer: Tracer, folder: Path) -> list[Trace]:
    from aiohttp.test_utils import TestClient, TestServer

    from clef_bridge.bridge.config.registry import demo_registry
    from clef_bridge.bridge.server.app import create_app

    app = create_app(demo_registry(folder / "models.toml"))
    out = []
    async with TestClient(TestServer(app)) as client:
        for name, (path, body) in requests(folder).items():
            for n in range(2):  # the first run warms lazy imports and the decoder processes
                tracer.reset()
                tracer.active = n == 1
                reply = await client.post(path, json=_restated(body, n))
                await reply.read()
                tracer.active = False
            if reply.status != 200:
                raise RuntimeError(f"{name}: HTTP {reply.status}: {(await reply.text())[:300]}")
            modules = {f for f, _ in tracer.functions}
            once = {step: sum(n for (f, q), n in tracer.counts.items() if f.endswith("/" + path) and q == qualname)
                    for step, (path, qualname) in ONCE.items()}
            out.append(Trace(name, len(tracer.functions), len(tracer.entered), tracer.calls, len(modules), len(tracer.threads),
                             tracer.hand_offs, reply.status, once))
    return out


def traces() -> list[Trace]:
    """Each request traced once warm, on the built-in demos in this process."""
    from clef_bridge import bridge, head, tools

    roots = tuple(str(Path(m.__file__).resolve().parent) + "/" for m in (bridge, head, tools))
    tracer = Tracer(roots)
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return asyncio.run(_trace_all(tracer, Path(tmp)))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def run(trace: bool = True) -> Architecture:
    types, problems, shapes = source_figures()
    changes = [change_cost(what, path, word) for what, (path, word) in CHANGES.items()]
    return Architecture(changes, types, problems, shapes, traces() if trace else [])
