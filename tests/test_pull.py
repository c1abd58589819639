"""`clef-bridge pull` against a fake hub on 127.0.0.1 (HF_ENDPOINT), never the network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest

from .fakehub import Hub, RunningHub

pytestmark = pytest.mark.slow

HEAD_REPO = "Cloudflare/clef-flash"
GGUF_REPO = "community/clef-flash-GGUF"
GGUF_FILE = "clef-flash-Q8_0.gguf"


@pytest.fixture
def hub(fx):
    files = {(HEAD_REPO, "joint_head.safetensors"): fx.head.read_bytes(),
             (HEAD_REPO, "joint_head_config.json"): fx.head.with_name("joint_head_config.json").read_bytes(),
             (HEAD_REPO, "model.safetensors"): (fx.hf_model / "model.safetensors").read_bytes(),  # what pull verifies
             (GGUF_REPO, GGUF_FILE): fx.gguf_q8_0.read_bytes()}
    return Hub(files)


def run_pull(tmp_path, url, *extra):
    env = dict(os.environ, HF_ENDPOINT=url, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_XET="1",
               HF_HUB_DISABLE_TELEMETRY="1", CLEF_BRIDGE_CACHE=str(tmp_path / "cache"))
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run([sys.executable, "-m", "clef_bridge.tools.cli", "pull", "clef-flash", "--gguf-repo",
                           GGUF_REPO, "--gguf-file", GGUF_FILE, "--models", str(tmp_path / "models.toml"), *extra],
                          capture_output=True, text=True, timeout=600, env=env)


def test_pull_downloads_checks_pairs_and_registers(hub, tmp_path):
    with RunningHub(hub) as running:
        done = run_pull(tmp_path, running.url)
    assert done.returncode == 0, done.stderr
    registry = tomllib.loads((tmp_path / "models.toml").read_text())
    entry = registry["models"]["clef-flash"]
    assert registry["default"] == "clef-flash"
    assert entry["gguf"].endswith(GGUF_FILE) and entry["head"].endswith("joint_head.safetensors")
    assert len(entry["gguf_sha256"]) == 64 and (tmp_path / "clef-flash.pair.json").is_file()
    assert str(tmp_path / "hf") in entry["gguf"]  # through huggingface_hub's own cache
    check = subprocess.run([sys.executable, "-m", "clef_bridge.tools.cli", "check", "--models",
                            str(tmp_path / "models.toml")], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, CLEF_BRIDGE_CACHE=str(tmp_path / "cache")))
    assert check.returncode == 0, check.stdout + check.stderr
    again = run_pull(tmp_path, "http://127.0.0.1:9")  # already cached, but the entry exists
    assert again.returncode != 0 and "already has [models.clef-flash]" in again.stderr


def test_an_interrupted_download_resumes(hub, tmp_path):
    # huggingface_hub writes 10 MB chunks: break the connection after more than one of them
    hub.drop_after[(GGUF_REPO, GGUF_FILE)] = 15 << 20
    with RunningHub(hub) as running:
        done = run_pull(tmp_path, running.url)
    assert done.returncode == 0, done.stderr
    gets = [r for r in hub.requests if r[0] == "GET" and r[1].endswith(GGUF_FILE)]
    assert len(gets) == 2 and gets[0][2] is None
    resumed_at = int(gets[1][2].removeprefix("bytes=").rstrip("-"))  # the second GET asked for the rest only
    assert 0 < resumed_at <= 15 << 20


def test_a_sha256_mismatch_is_refused(hub, tmp_path):
    hub.wrong_sha.add((GGUF_REPO, GGUF_FILE))
    with RunningHub(hub) as running:
        done = run_pull(tmp_path, running.url)
    assert done.returncode == 1
    assert "does not match the hub's" in done.stderr and not (tmp_path / "models.toml").exists()


def test_a_missing_gguf_is_named(hub, tmp_path):
    with RunningHub(hub) as running:
        done = subprocess.run([sys.executable, "-m", "clef_bridge.tools.cli", "pull", "clef-flash", "--gguf-repo",
                               GGUF_REPO, "--gguf-file", "nope.gguf", "--models", str(tmp_path / "models.toml")],
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, HF_ENDPOINT=running.url, HF_HOME=str(tmp_path / "hf"),
                                       HF_HUB_DISABLE_XET="1"))
    assert done.returncode != 0 and "nope.gguf" in done.stderr


def test_pull_without_a_gguf_says_what_to_pass(tmp_path):
    done = subprocess.run([sys.executable, "-m", "clef_bridge.tools.cli", "pull", "clef-flash"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--gguf-repo" in done.stderr


def test_a_clef_repository_needs_no_head_and_brings_its_projector(fx, tmp_path):
    from . import fixturegen_clef, fixturegen_vision

    clef = fixturegen_clef.build(fx)
    projector = fixturegen_vision.build().mmproj_f16.read_bytes()  # width 64, as the tiny clef backbone
    repo, name = "ggml-org/Clef-Flash-GGUF", "clef-flash-Q8_0.gguf"
    hub = Hub({(repo, name): clef.q8_0.read_bytes(), (repo, "mmproj-clef-flash-f16.gguf"): projector,
               (HEAD_REPO, "model.safetensors"): (fx.hf_model / "model.safetensors").read_bytes(),
               (repo, "mmproj-clef-flash-bf16.gguf"): b"GGUF other projector", (repo, "README.md"): b"# Clef"})
    with RunningHub(hub) as running:
        done = subprocess.run([sys.executable, "-m", "clef_bridge.tools.cli", "pull", "clef-flash", "--gguf-repo",
                               repo, "--gguf-file", name, "--models", str(tmp_path / "models.toml"), "--json"],
                              capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, HF_ENDPOINT=running.url, HF_HOME=str(tmp_path / "hf"),
                                       HF_HUB_DISABLE_XET="1", CLEF_BRIDGE_CACHE=str(tmp_path / "cache")))
    assert done.returncode == 0, done.stderr
    pulled = json.loads(done.stdout)
    assert pulled["head"] is None and pulled["mmproj"].endswith("mmproj-clef-flash-f16.gguf")
    assert not any(path.endswith("joint_head.safetensors") for _, path, _ in hub.requests)  # no separate head
    entry = tomllib.loads((tmp_path / "models.toml").read_text())["models"]["clef-flash"]
    assert "head" not in entry and entry["gguf"].endswith(name) and (tmp_path / "clef-flash.pair.json").is_file()
    assert entry["mmproj"] == pulled["mmproj"]  # named, so a second projector beside it cannot make it ambiguous
    assert "image_canary" in json.loads((tmp_path / "clef-flash.pair.json").read_text())


def test_a_mislabelled_repository_is_refused(fx, tmp_path):
    """Another model's GGUF under a Clef name: compared with the release, it is refused before any record."""
    hub = Hub({(HEAD_REPO, "joint_head.safetensors"): fx.head.read_bytes(),
               (HEAD_REPO, "joint_head_config.json"): fx.head.with_name("joint_head_config.json").read_bytes(),
               (HEAD_REPO, "model.safetensors"): (fx.hf_model / "model.safetensors").read_bytes(),
               (GGUF_REPO, GGUF_FILE): fx.gguf_other.read_bytes()})
    with RunningHub(hub) as running:
        done = run_pull(tmp_path, running.url, "--no-mmproj")
    assert done.returncode == 1 and "provenance.release_mismatch" in done.stderr
    assert not (tmp_path / "models.toml").exists() and not (tmp_path / "clef-flash.pair.json").exists()
