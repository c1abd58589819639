"""Shared fixtures: generated files (see fixturegen) and loaded models, built once per session."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from clef_bridge.bridge.registry import ModelSpec

from . import fixturegen


@pytest.fixture(scope="session")
def fx() -> fixturegen.Fixtures:
    return fixturegen.build()


def tiny_spec(fx: fixturegen.Fixtures, gguf: Path | None = None, **overrides) -> ModelSpec:
    spec = ModelSpec(name="tiny", gguf=gguf or fx.gguf_f32, head=fx.head, n_ctx=8192, max_length=8192)
    return replace(spec, **overrides)


@pytest.fixture(scope="session")
def tiny_model(fx):
    from clef_bridge.bridge.pipeline import ClefModel

    model = ClefModel(tiny_spec(fx))
    yield model
    model.close()
