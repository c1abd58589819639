"""The embedded demo model: deterministic build, accepted by check, served when no models.toml exists."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
from clef_bridge.bridge.demo.builtins import DEMO_DESCRIPTION, DEMO_VERSION, make_demo
from clef_bridge.tools.cli import main

from .deciding import prepare
from .test_catalogue import reaches_pull
from .test_server_clients import _free_port, _wait_ready

pytestmark = pytest.mark.integration


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_make_demo_is_deterministic_and_checked(tmp_path, capsys):
    a = make_demo(tmp_path / "a", seed=3)
    b = make_demo(tmp_path / "b", seed=3)
    c = make_demo(tmp_path / "c", seed=4)
    assert _digest(a.gguf) == _digest(b.gguf) and _digest(a.head) == _digest(b.head)
    assert _digest(a.gguf) != _digest(c.gguf)
    assert main(["check", str(a.gguf), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accepted"] is True
    assert main(["make-demo", str(tmp_path / "d")]) == 0
    assert "meaningless" in capsys.readouterr().out


def test_serve_without_models_toml_serves_the_demo(tmp_path, monkeypatch):
    port = _free_port()
    env = dict(os.environ, CLEF_BRIDGE_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_ready(port, proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            models = json.load(r)["models"]
        assert [m["name"] for m in models] == ["demo", "demo-omni"] and models[0]["description"] == DEMO_DESCRIPTION
        assert [m["x_media"] for m in models] == [["image"], ["image", "audio", "video"]]
        assert "RANDOM weights" in models[0]["description"]
        assert all(m["x_warnings"][0].startswith("demo: the built-in demo model has RANDOM weights") for m in models)
        body = json.dumps({"model": "jev-latest", "state": "The printer is on fire.",
                           "questions": {"urgent": {"type": "noul", "instructions": "Is it urgent?"}}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/systemone", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            answer = json.load(r)["answers"]["urgent"]
        assert answer["type"] == "noul" and 0 <= answer["noul"] <= 1
        assert set(models[0]["x_aliases"]) == {"jev-latest", "jev-preview", "clef-flash", "clef"}
        for name in ("clef-flash", "clef", "jev-preview"):  # what Cloudflare's and TypeSafe's clients send
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/systemone", headers={"Content-Type":
                                         "application/json"}, data=body.replace(b"jev-latest", name.encode()))
            with urllib.request.urlopen(req, timeout=60) as r:
                assert json.load(r)["model"] == name
        assert (tmp_path / "cache" / f"demo-v{DEMO_VERSION}" / "demo.gguf").is_file()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert "no models.toml" in out and "meaningless" in out
    banner = out[out.index("clef-bridge serving on"):]
    assert f"http://127.0.0.1:{port} (auth off)" in banner and "model demo (also answers to jev-latest" in banner
    assert "DEMO MODEL: RANDOM weights" in banner and "(qwen35, hidden 128, 4 layers)" in banner
    assert "model demo-omni (also answers to clef-omni)" in banner and "(qwen3vlmoe, hidden 128, 4 layers)" in banner
    assert "pull clef-omni" in banner[banner.index("model demo-omni"):]
    pulls = re.findall(r"`(clef-bridge pull [^`]*)`", out)  # the banner's, and the no-models.toml line's
    assert len(pulls) == 3 and all(reaches_pull(command, monkeypatch) for command in pulls), pulls
    assert "llama_" not in out and "load:" not in out  # llama.cpp's own chatter stays out of the way


def test_the_demo_is_built_once(tmp_path):
    files = make_demo(tmp_path / "demo")
    os.utime(files.gguf, ns=(10**18, 10**18))  # a time no rewrite could give it
    make_demo(tmp_path / "demo")
    assert files.gguf.stat().st_mtime_ns == 10**18


def test_the_demo_takes_a_64_question_request(tmp_path, monkeypatch):
    """Clients batch up to 64 questions; the demo's byte-level vocabulary needs ~19k tokens for that."""
    from clef_bridge.bridge.config.registry import demo_registry
    from clef_bridge.bridge.model.loading import load_checked

    monkeypatch.setenv("CLEF_BRIDGE_CACHE", str(tmp_path / "cache"))
    model = load_checked(demo_registry(tmp_path / "models.toml").models["demo"]).model
    try:
        questions = {f"q{i}": {"type": "choice", "instructions": f"Which team should handle part {i} of the ticket?",
                               "criteria": {"billing": "payments and refunds", "tech": "bugs and outages",
                                            "sales": "plans and pricing"}} for i in range(64)}
        body = {"model": "demo", "state": "The printer is on fire and the invoice is wrong. " * 10,
                "questions": questions}
        tokens = len(prepare(model, body).encoded.input_ids)  # refused with 413 if it did not fit
        assert 16384 < tokens <= model.encode_options.max_length <= model.backbone.decode_budget
    finally:
        model.close()


def test_a_gguf_joined_from_the_demo_keeps_its_random_weights_warning(tmp_path, monkeypatch):
    """Issue 54: `clef-bridge join` of the demo's backbone and head served as a plain entry says, as the demo does,
    that its weights are random."""
    from clef_bridge.bridge.config.registry import model_spec
    from clef_bridge.bridge.demo.builtins import make_demo
    from clef_bridge.bridge.gguf.clef_split import join
    from clef_bridge.bridge.model.loading import load_checked

    monkeypatch.setenv("CLEF_BRIDGE_CACHE", str(tmp_path / "cache"))
    files = make_demo(tmp_path / "demo", omni=False)
    joined = tmp_path / "joined.clef.gguf"
    join(files.gguf, files.head, joined)
    loaded = load_checked(model_spec("mine", joined))
    try:
        assert [w for w in loaded.warnings if w.startswith("demo:") and "RANDOM weights" in w]
    finally:
        loaded.model.close()
