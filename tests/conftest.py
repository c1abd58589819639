"""Shared fixtures: generated files (see fixturegen) and loaded models, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from clef_bridge.bridge.model.registry import ModelSpec, model_spec

from . import fixturegen, fixturegen_omni


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
