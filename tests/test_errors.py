"""Every error class has a category, so an HTTP status and a CLI exit code from the one table
(bridge/server/errors.py), and an error type of its own. The classes are found in the source (any class
whose bases lead to ClefError, in head/, bridge/, tools/ and benchmarks/), their modules imported and
ClefError's subclasses walked: a class added anywhere is checked without being listed here."""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path

import pytest
from clef_bridge.bridge.server.errors import ANSWERS, HIDDEN_TYPE, OTHERS, answer_for, error_type_of
from clef_bridge.head.errors import Category, ClefError
from clef_bridge.tools.cli import dispatch

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
ROOTS = {"head": "clef_bridge.head", "bridge": "clef_bridge.bridge", "tools": "clef_bridge.tools",
         "benchmarks": "benchmarks"}


def defined_classes() -> dict[tuple[str, str], list[str]]:
    """(module, class) -> the names of its bases, for every class defined at a module's top level."""
    found = {}
    for folder, package in ROOTS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            module = ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef):
                    found[module, node.name] = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                                                for b in node.bases]
    return found


def error_classes_in_source() -> set[tuple[str, str]]:
    """The classes whose bases lead to ClefError by name (a name shared by two classes only imports more)."""
    classes, names = defined_classes(), {"ClefError"}
    while grown := {name for (_, name), bases in classes.items() if names & set(bases)} - names:
        names |= grown
    return {key for key, bases in classes.items() if key[1] in names or key[1] == "ClefError"}


def subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | subclasses(sub)
    return found


IN_SOURCE = error_classes_in_source()
for _module in sorted({module for module, _ in IN_SOURCE}):
    importlib.import_module(_module)
CLASSES = sorted((c for c in subclasses(ClefError) | {ClefError} if c.__module__.startswith(tuple(ROOTS.values()))),
                 key=lambda c: f"{c.__module__}.{c.__qualname__}")
IDS = [c.__qualname__ for c in CLASSES]


def test_the_walk_and_the_source_agree():
    walked = {(c.__module__, c.__qualname__) for c in CLASSES}
    assert walked == IN_SOURCE, {"only walked": walked - IN_SOURCE, "only in the source": IN_SOURCE - walked}
    assert {m.removeprefix("clef_bridge.").split(".")[0] for m, _ in walked} == set(ROOTS)
    assert len(CLASSES) > 40


def test_every_category_has_an_answer():
    assert set(ANSWERS) == set(Category)
    for category, answer in ANSWERS.items():
        assert 400 <= answer.status < 600 and answer.exit_code in (1, 2), category


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_each_error_says_its_category(cls):
    """A new error inherits a category only from a parent that is more than ClefError: a class straight
    under ClefError must say which kind of failure it is, or it would answer 500 unnoticed."""
    owner = next(c for c in cls.__mro__ if "category" in vars(c))
    assert owner is not ClefError or cls is ClefError, f"{cls.__qualname__} needs `category = Category.<...>`"
    assert isinstance(cls.category, Category) and cls.category in ANSWERS


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_each_error_has_a_type_of_its_own(cls):
    assert "error_type" in vars(cls), \
        f"{cls.__qualname__} needs `error_type = \"...\"`: its parent's names another error"
    assert cls.error_type.isidentifier() and cls.error_type.islower()


# the types the middleware writes without an error class: aiohttp's own 404 and 405, clients gone, parser refusals
MIDDLEWARE_TYPES = {HIDDEN_TYPE, "not_found", "method_not_allowed", "client_closed_request", "write_timeout",
                    "bad_http_request"}


def test_error_types_are_unique():
    owners: dict[str, list[str]] = {}
    for cls in CLASSES:
        owners.setdefault(cls.error_type, []).append(cls.__qualname__)
    assert not {t: o for t, o in owners.items() if len(o) > 1}
    assert not MIDDLEWARE_TYPES & set(owners)


def test_exceptions_outside_clef_error_keep_their_status_and_hide_their_type():
    class OutOfMemoryError(MemoryError):  # CuPy's, as the head raises it on the GPU
        pass

    assert set(OTHERS) == {MemoryError}
    for exc in (MemoryError(), OutOfMemoryError()):
        assert answer_for(exc).status == 503 and error_type_of(exc) == HIDDEN_TYPE
    assert answer_for(KeyError("a bug")).status == 500 and error_type_of(KeyError()) == HIDDEN_TYPE


def by_name(name: str) -> type[ClefError]:
    (cls,) = [c for c in CLASSES if c.__qualname__ == name]
    return cls


# What requests got from the middleware's class -> status table before the categories: unchanged.
STATUSES_BEFORE = {
    "RequestInvalid": 422, "ContextLengthExceeded": 413, "BodyTooLarge": 413, "UnknownModel": 404, "Unauthorized": 401,
    "Overloaded": 429, "Busy": 429, "DeadlineExceeded": 503, "WorkerStopped": 503, "DecodeFailed": 503,
    "NonFiniteOutput": 503, "BackboneError": 503, "DeviceOutOfMemory": 503, "BadEncoding": 400, "BadHeader": 400,
    "UnsupportedMediaType": 415, "BodyTimeout": 408, "ExpectationFailed": 417, "MediaTooLarge": 413,
    "ProjectorError": 503, "ImageTooLarge": 413, "AudioTooLarge": 413, "ImageRejected": 422, "AudioRejected": 422,
    "MediaRejected": 422,
}


@pytest.mark.parametrize("name, status", sorted(STATUSES_BEFORE.items()))
def test_statuses_requests_got_are_unchanged(name, status):
    assert ANSWERS[by_name(name).category].status == status


# What the CLI returned before the table: 1 for these refusals (and their subclasses), 2 for every other error;
# BodyTooLarge, which only the server raises, now counts with the other requests too large.
REFUSALS = ("RequestInvalid", "ContextLengthExceeded", "ModelRefused", "PullError", "BodyTooLarge")


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_the_cli_exits_with_the_tables_code(cls, capsys):
    exc = cls.__new__(cls)  # constructors differ; dispatch reads only the class, the text and the fix
    Exception.__init__(exc, "it failed")
    exc.fix = "do this"

    def command(args):
        raise exc

    code = dispatch({"x": command}, argparse.Namespace(command="x"))
    assert code == ANSWERS[cls.category].exit_code
    assert code == (1 if any(c.__qualname__ in REFUSALS for c in cls.__mro__) else 2)
    assert capsys.readouterr().err == "clef-bridge x: it failed\n  fix: do this\n"


def test_a_too_long_prompt_says_maximum_context_length():
    """Benchmark harnesses (decision-index) call a refusal "unsupported", not an error to retry on every resume,
    only when its message says "maximum context length" (or "context window", "too many tokens")."""
    from clef_bridge.head.errors import ContextLengthExceeded

    message = str(ContextLengthExceeded(9000, 8192, " (states[3])"))
    assert "maximum context length" in message and "9000 tokens" in message and "8192" in message
