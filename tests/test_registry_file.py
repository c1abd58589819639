"""bridge/config/registry_file.py: models.toml edited in place, comments kept, no edit the server would refuse."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from clef_bridge.bridge.config.registry import RegistryError, demo_registry, load_registry
from clef_bridge.bridge.config.registry_file import add_model, has_model, set_model_keys

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent

FILE = """# my models
default = "a"  # the one clients get

[models.a]
gguf = "a.gguf"  # downloaded by hand
n_ctx = 32768
"""


@pytest.fixture
def toml(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(FILE)
    return path


def test_a_new_file_gets_the_model_as_its_default(tmp_path):
    path = tmp_path / "models.toml"
    assert not has_model(path, "m")
    add_model(path, "m", {"gguf": "m.gguf", "head": "head.safetensors", "aliases": ["clef"]})
    registry = load_registry(path)
    assert registry.default == "m" and registry.models["m"].aliases == ("clef",)
    assert registry.models["m"].gguf == tmp_path / "m.gguf" and has_model(path, "m")


def test_adding_keeps_comments_and_the_default(toml):
    add_model(toml, "b", {"gguf": "b.gguf"})
    text = toml.read_text()
    assert text.startswith(FILE) and "# downloaded by hand" in text and "# the one clients get" in text
    raw = tomllib.loads(text)
    assert raw["default"] == "a" and list(raw["models"]) == ["a", "b"]


def test_a_taken_name_is_refused_and_the_file_left_alone(toml):
    with pytest.raises(RegistryError, match=r"already has \[models.a\]"):
        add_model(toml, "a", {"gguf": "other.gguf"})
    assert toml.read_text() == FILE


def test_an_entry_the_server_would_refuse_is_never_written(toml):
    with pytest.raises(RegistryError, match="n_ctx"):
        add_model(toml, "b", {"gguf": "b.gguf", "n_ctx": 0})
    with pytest.raises(RegistryError, match="unknown key"):
        set_model_keys(toml, "a", {"n_cxt": 8192})
    assert toml.read_text() == FILE
    assert [p.name for p in toml.parent.iterdir()] == ["models.toml"]  # no temporary file left behind


def test_setting_keys_changes_only_those_keys(toml):
    set_model_keys(toml, "a", {"n_ctx": 65536, "temperature": {"choice": 1.5, "score": 0.5}})
    text = toml.read_text()
    assert "# downloaded by hand" in text and "temperature = {" in text  # a table as an inline table
    spec = load_registry(toml).models["a"]
    assert spec.backbone.n_ctx == 65536 and spec.answer.temperature == {"choice": 1.5, "score": 0.5}


def test_setting_keys_of_a_missing_model_is_an_error(toml):
    with pytest.raises(RegistryError, match=r"no \[models.b\]"):
        set_model_keys(toml, "b", {"n_ctx": 1})


def test_a_broken_file_is_reported_not_overwritten(toml):
    toml.write_text("default = \n")
    with pytest.raises(RegistryError, match="cannot parse"):
        add_model(toml, "b", {"gguf": "b.gguf"})
    assert toml.read_text() == "default = \n"


def test_the_checkouts_models_toml_serves_what_serve_without_one_serves():
    """The README's `clef-bridge serve`, run in the checkout, reads its models.toml: the front page promises the
    demos' images and audio (demo-omni, answering to clef-omni), as `serve` gives them where there is none."""
    checkout = load_registry(ROOT / "models.toml")
    without = demo_registry(ROOT / "no-models.toml")
    assert checkout.default == without.default
    assert {n: s.builtin for n, s in checkout.models.items()} == {n: s.builtin for n, s in without.models.items()}


def test_a_gguf_loaded_twice_with_other_backbone_keys_is_said(tmp_path):
    """Issue 54: an entry naming an already loaded GGUF with another n_ctx holds a second copy of the backbone: its
    warning names the keys that differ and the fix; equal keys share one and say nothing."""
    from clef_bridge.bridge.config.registry import parse_registry
    from clef_bridge.bridge.service.models import second_copies

    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    raw = {"models": {n: {"gguf": "m.gguf", "n_ctx": ctx, "max_length": 4096}
                      for n, ctx in (("a", 4096), ("b", 8192), ("c", 4096))}}
    copies = second_copies(parse_registry(raw, tmp_path / "models.toml"))
    assert list(copies) == ["b"]
    assert "n_ctx 8192 where 'a' has 4096" in copies["b"] and "same backbone keys" in copies["b"]
