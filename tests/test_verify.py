"""Provenance without a local record: a GGUF compared with the release's safetensors on a fake hub,
through range requests (a quantized copy passes; another backbone and a fine-tune of the same base do not)."""

from __future__ import annotations

import json

import pytest
from clef_bridge.head.weights import save_state_dict
from clef_bridge.tools.cli import main
from clef_bridge.tools.verify import MIN_RELEASE_COSINE, verify_against
from safetensors.numpy import load_file

from .fakehub import Hub, RunningHub

pytestmark = pytest.mark.integration

RELEASE = "Cloudflare/clef-flash"


@pytest.fixture(scope="module")
def release(fx, tmp_path_factory):
    """The tiny model's transformers checkpoint as the release publishes it: one BF16 safetensors file."""
    path = tmp_path_factory.mktemp("release") / "model.safetensors"
    save_state_dict(path, load_file(fx.hf_model / "model.safetensors"), "BF16")
    return path.read_bytes()


@pytest.fixture
def hub(release, monkeypatch):
    hub = Hub({(RELEASE, "model.safetensors"): release})
    with RunningHub(hub) as running:
        monkeypatch.setenv("HF_ENDPOINT", running.url)
        yield hub


@pytest.mark.parametrize("name, accepted", [("gguf_f16", True), ("gguf_q8_0", True), ("gguf_q4_k_m", True),
                                            ("gguf_other", False), ("gguf_finetune", False)])
def test_sampled_tensors_against_the_release(hub, fx, name, accepted, release):
    result = verify_against(getattr(fx, name), RELEASE)
    print(f"{name}: min row cosine {result.min_cosine:.5f}, {result.bytes_read} bytes read")
    assert result.ok is accepted and (result.min_cosine >= MIN_RELEASE_COSINE) is accepted
    assert result.bytes_read < len(release) / 4  # a sample, not the checkpoint
    assert all(r[2] is not None for r in hub.requests if r[1].endswith("/model.safetensors"))  # range reads only


def test_check_verify_against_reports_it(capsys, hub, fx):
    assert main(["check", str(fx.gguf_q4_k_m), "--head", str(fx.head), "--verify-against", RELEASE, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["reports"][0]
    assert report["facts"]["verified_against"]["accepted"] and "provenance.verified" in \
        {f["code"] for f in report["findings"]}
    assert main(["check", str(fx.gguf_finetune), "--head", str(fx.head), "--verify-against", RELEASE, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)["reports"][0]
    [error] = [f for f in report["findings"] if f["level"] == "error"]
    assert error["code"] == "provenance.release_mismatch" and "blk." in error["message"] and error["fix"]


def test_a_release_without_a_checkpoint_is_a_clear_error(capsys, hub, fx):
    assert main(["check", str(fx.gguf_q8_0), "--head", str(fx.head), "--verify-against", "someone/empty"]) == 2
    err = capsys.readouterr().err
    assert "holds no transformers checkpoint" in err and "fix:" in err


def test_the_pairing_record_keeps_the_verification(hub, fx, tmp_path):
    out = tmp_path / "tiny.pair.json"
    assert main(["pair", str(fx.gguf_q8_0), str(fx.head), "-o", str(out), "--verify-against", RELEASE]) == 0
    record = json.loads(out.read_text())
    assert record["verified_against"]["repo"] == RELEASE and record["verified_against"]["accepted"]
    assert main(["pair", str(fx.gguf_other), str(fx.head), "-o", str(tmp_path / "other.json"),
                 "--verify-against", RELEASE]) == 1
    assert not (tmp_path / "other.json").exists()  # a refused pair gets no record
