"""bridge/llama/options.py: the backbone's and the prefix cache's options, plain data that loads without llama.cpp."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from clef_bridge.bridge.config.registry import model_spec
from clef_bridge.bridge.llama.options import BackboneOptions, PrefixCacheOptions

pytestmark = pytest.mark.unit

OPTIONS = Path(__file__).resolve().parent.parent / "bridge" / "llama" / "options.py"


def test_out_of_range_cache_options_are_refused_each_named():
    with pytest.raises(ValueError) as e:
        PrefixCacheOptions(max_mb=-1, every=0, sequences=0)
    message = str(e.value)
    assert "max_mb = -1 (at least 0)" in message and "every = 0 (at least 1)" in message
    assert "sequences = 0 (at least 1)" in message and "margin" not in message


def test_models_toml_keys_land_in_the_options(tmp_path):
    spec = model_spec("m", tmp_path / "m.gguf", tmp_path / "head", n_ctx=4096, max_length=4096, kv_type="f32",
                      prefix_cache_mb=0)
    assert spec.backbone.n_ctx == 4096 and spec.backbone.kv_type == "f32"
    assert isinstance(spec.backbone, BackboneOptions) and spec.backbone.prefix_cache.max_mb == 0


def test_the_options_module_is_a_leaf():
    tree = ast.parse(OPTIONS.read_text())
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported == {"__future__", "dataclasses"}, imported
