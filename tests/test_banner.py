"""The banner of `clef-bridge serve` without a models.toml: what each built-in demo reads comes from the catalogue
(its release's architecture's media), so Clef-omni's demo is said to take videos as well as images and audio."""

from __future__ import annotations

import pytest
from clef_bridge.bridge.catalogue.architectures import ARCHITECTURES
from clef_bridge.bridge.catalogue.media import MEDIA_KINDS
from clef_bridge.bridge.catalogue.releases import RELEASES
from clef_bridge.tools import cli

pytestmark = pytest.mark.unit


def test_each_demo_is_said_to_read_its_architectures_media():
    said = dict(part.split(": ") for part in cli.demos_read().split("; "))
    demos = {r.demo: r for r in RELEASES.values() if r.demo}
    assert set(said) == set(demos)
    for demo, release in demos.items():
        fields = [MEDIA_KINDS[kind].field for kind in ARCHITECTURES[release.backbone].media]
        assert said[demo].replace(" and ", ", ").split(", ") == ["text"] + fields
    assert said["demo-omni"] == "text, images, audio and videos"  # the words issue 42 found missing
    assert said["demo"] == "text and images"


def test_serve_without_a_models_toml_prints_it(tmp_path, monkeypatch, capsys):
    from clef_bridge.bridge.model import loading
    from clef_bridge.bridge.server import app

    served = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(loading, "materialize", lambda spec: None)  # no demo files written: the banner only
    monkeypatch.setattr(app, "serve", lambda registry, host, port: served.append(sorted(registry.models)))
    assert cli.main(["serve"]) == 0
    banner = capsys.readouterr().err
    assert f"serving the built-in demo models ({cli.demos_read()})" in banner
    assert served and "demo-omni" in served[0]


def test_serve_takes_one_gguf_as_llama_server_does(tmp_path, monkeypatch, fx):
    """`clef-bridge serve FILE.gguf --head HEAD`: one model named after the file, its file name an alias (what a
    client of llama-server -m FILE sends)."""
    from clef_bridge.bridge.server import app

    served = []
    monkeypatch.setattr(app, "serve", lambda registry, host, port: served.append(registry))
    assert cli.main(["serve", str(fx.gguf_f32), "--head", str(fx.head)]) == 0
    [registry] = served
    [(name, spec)] = registry.models.items()
    assert registry.default == name == fx.gguf_f32.stem and spec.aliases == (fx.gguf_f32.name,)
    assert spec.gguf == fx.gguf_f32 and spec.head_path == fx.head
