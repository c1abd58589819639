"""`clef-bridge pull clef-omni` against a fake hub on 127.0.0.1: the head from Cloudflare/clef-omni, a qwen3vlmoe
GGUF and its projector from the repository named, never the network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest
from clef_bridge.bridge.config.integrity import CLEF_ARCHITECTURES
from clef_bridge.bridge.demo.moe import MoeDims, write_qwen3vlmoe_gguf

from .fakehub import Hub, RunningHub
from .fixturegen import build_head

pytestmark = pytest.mark.integration

RELEASE = "Cloudflare/clef-omni"
GGUF_REPO = "community/clef-omni-GGUF"
GGUF_FILE = "clef-omni-Q4_K_M.gguf"
PROJECTOR = "mmproj-clef-omni-f16.gguf"
HEAD = {"hidden_size": 256, "width": 32, "routing_layers": 1, "layers": 1, "heads": 2, "feedforward": 64}


def _pull(tmp_path, url, *args):
    env = dict(os.environ, HF_ENDPOINT=url, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_XET="1",
               HF_HUB_DISABLE_TELEMETRY="1", CLEF_BRIDGE_CACHE=str(tmp_path / "cache"))
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run([sys.executable, "-m", "clef_bridge.tools.cli", "pull", "clef-omni", "--models",
                           str(tmp_path / "models.toml"), *args], capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture
def omni_hub(tmp_path):
    gguf = write_qwen3vlmoe_gguf(tmp_path / "omni.gguf", MoeDims(), seed=3)
    build_head(tmp_path / "head" / "joint_head.safetensors", HEAD, seed=4)
    projector = write_qwen3vlmoe_gguf(tmp_path / "not-a-projector.gguf", MoeDims(layers=1), seed=5)
    return Hub({(GGUF_REPO, GGUF_FILE): gguf.read_bytes(), (GGUF_REPO, PROJECTOR): projector.read_bytes(),
                (GGUF_REPO, "README.md"): b"# Clef-omni GGUF",
                (RELEASE, "joint_head.safetensors"): (tmp_path / "head" / "joint_head.safetensors").read_bytes(),
                (RELEASE, "joint_head_config.json"): (tmp_path / "head" / "joint_head_config.json").read_bytes()})


def test_without_a_gguf_it_names_what_to_pass(tmp_path):
    done = _pull(tmp_path, "http://127.0.0.1:9")
    assert done.returncode == 2
    assert "no official Clef-omni GGUF" in done.stderr and "--gguf-repo" in done.stderr
    assert "--gguf-file" in done.stderr and "qwen3vlmoe" in done.stderr


def test_the_head_comes_from_the_release_and_the_projector_from_the_gguf_repository(omni_hub, tmp_path):
    with RunningHub(omni_hub) as running:
        done = _pull(tmp_path, running.url, "--gguf-repo", GGUF_REPO, "--gguf-file", GGUF_FILE, "--no-verify")
    fetched = {path for method, path, _ in omni_hub.requests if method == "GET"}
    assert {f"/{RELEASE}/resolve/main/joint_head.safetensors", f"/{RELEASE}/resolve/main/joint_head_config.json",
            f"/{GGUF_REPO}/resolve/main/{GGUF_FILE}", f"/{GGUF_REPO}/resolve/main/{PROJECTOR}"} <= fetched
    # that "projector" is a text GGUF: whatever the checks know of qwen3vlmoe, nothing is registered
    assert done.returncode == 1 and not (tmp_path / "models.toml").exists(), done.stderr


@pytest.mark.skipif("qwen3vlmoe" not in CLEF_ARCHITECTURES, reason="the checks that accept a qwen3vlmoe backbone "
                    "come with Clef-omni's serving path (the omni branch)")
def test_pull_registers_clef_omni(omni_hub, tmp_path):
    with RunningHub(omni_hub) as running:
        done = _pull(tmp_path, running.url, "--gguf-repo", GGUF_REPO, "--gguf-file", GGUF_FILE, "--no-verify",
                     "--no-mmproj", "--json")
    assert done.returncode == 0, done.stderr
    entry = tomllib.loads((tmp_path / "models.toml").read_text())["models"]["clef-omni"]
    assert entry["head"] == json.loads(done.stdout)["head"] and entry["gguf"].endswith(GGUF_FILE)
    assert (tmp_path / "clef-omni.pair.json").is_file()


def test_a_gguf_of_another_model_is_refused_before_the_head(fx, tmp_path):
    hub = Hub({(GGUF_REPO, GGUF_FILE): fx.gguf_q8_0.read_bytes()})  # a qwen35 backbone under Clef-omni's name
    with RunningHub(hub) as running:
        done = _pull(tmp_path, running.url, "--gguf-repo", GGUF_REPO, "--gguf-file", GGUF_FILE, "--no-mmproj")
    assert done.returncode == 1 and "is a qwen35 GGUF; clef-omni comes as qwen3vlmoe" in done.stderr
    assert not any(RELEASE in path for _, path, _ in hub.requests) and not (tmp_path / "models.toml").exists()
