"""Shared fixtures: generated files (see fixturegen) and loaded models, built once per session; and the
check that every test carries exactly one level marker (unit, integration or slow; see pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from clef_bridge.bridge.config.registry import ModelSpec, model_spec

from . import fixturegen, fixturegen_omni

LEVELS = ("unit", "integration", "slow")


def file_level(path: Path) -> str | None:
    """The level a test file's module-level `pytestmark` sets (read, not imported); None without one."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            marks = [m for m in ast.walk(node.value) if isinstance(m, ast.Attribute) and m.attr in LEVELS]
            return marks[0].attr if len(marks) == 1 else None
    return None


def pytest_ignore_collect(collection_path: Path, config):
    """Under `-m unit`, leave unimported the files of another level: none holds a unit test (a test has exactly
    one level), and importing them needs llama.cpp, torch and the rest, which the unit loop runs without."""
    if (config.getoption("markexpr") == "unit" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")):
        level = file_level(collection_path)
        return level is not None and level != "unit" or None
    return None


@pytest.hookimpl(tryfirst=True)  # before -m deselects: an unmarked test must not just vanish from `-m unit`
def pytest_collection_modifyitems(config, items):
    """Refuse a run in which a test has no level marker or more than one: `-m unit` must mean what it says."""
    wrong = []
    for item in items:
        levels = [m.name for m in item.iter_markers() if m.name in LEVELS]
        if len(levels) != 1:
            wrong.append(f"{item.nodeid}: {', '.join(levels) or 'no level'}")
    if wrong:
        raise pytest.UsageError(
            f"{len(wrong)} test(s) need exactly one of the markers {', '.join(LEVELS)}; set "
            "`pytestmark = pytest.mark.unit` (or integration, slow) once at the top of the file:\n  "
            + "\n  ".join(wrong[:20]))


@pytest.fixture(scope="session")
def fx() -> fixturegen.Fixtures:
    return fixturegen.build()


def tiny_spec(fx: fixturegen.Fixtures, gguf: Path | None = None, head: Path | None = None, **keys) -> ModelSpec:
    """The tiny test model as a models.toml entry; keys are models.toml keys (n_ctx, max_length, ...)."""
    return model_spec("tiny", gguf or fx.gguf_f32, head or fx.head, **({"n_ctx": 8192, "max_length": 8192} | keys))


def open_spec(spec: ModelSpec):
    """A model loaded the one checked way (pins, pairing record, canaries)."""
    from clef_bridge.bridge.model.loading import load_checked

    return load_checked(spec).model


def open_tiny(fx: fixturegen.Fixtures, gguf: Path | None = None, **keys):
    return open_spec(tiny_spec(fx, gguf, **keys))


@pytest.fixture(scope="session")
def tiny_model(fx):
    model = open_tiny(fx)
    yield model
    model.close()


@pytest.fixture(scope="session")
def ofx() -> fixturegen_omni.OmniFixtures:
    return fixturegen_omni.build()


@pytest.fixture(scope="session")
def omni_oracle(ofx):
    """Cloudflare's clef-omni reference over the tiny Qwen3-Omni (tests/omni_reference.py)."""
    from .omni_reference import Oracle

    return Oracle(ofx)


@pytest.fixture(scope="session")
def tiny_server(fx, tmp_path_factory):
    """ONE `serve` of the tiny model with the default [server] keys, shared by the modules that need nothing else
    (each of them started its own before: a model load and its canaries every time)."""
    from .serverkit import RunningServer, registry_for

    with RunningServer(registry_for(tiny_spec(fx), tmp_path_factory.mktemp("tiny-server") / "models.toml")) as srv:
        yield srv
