"""The head-integrity validator on corrupt and mismatched files: exit codes, finding codes, JSON."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from clef_bridge.bridge.config.integrity import ModelRefused
from clef_bridge.bridge.config.provenance import (
    MAX_CANARY_DIFF,
    MAX_STATE_DRIFT,
    MIN_ROW_COSINE,
    canary_difference,
    canary_probabilities,
    canary_states,
    compare_fingerprints,
    fingerprint,
    sha256_file,
    state_drift,
)
from clef_bridge.bridge.config.registry import model_spec
from clef_bridge.bridge.model.loading import load_checked
from clef_bridge.head.config import HeadConfig
from clef_bridge.head.weights import load_state_dict, save_state_dict
from clef_bridge.tools.cli import main

from .conftest import open_spec, tiny_spec
from .randomhead import random_state_dict
from .serverkit import RunningServer, registry_for

pytestmark = pytest.mark.integration


def run_check(capsys, *args) -> tuple[int, dict]:
    code = main(["check", *map(str, args), "--json"])
    return code, json.loads(capsys.readouterr().out)


def codes(doc: dict) -> set[str]:
    return {f["code"] for r in doc["reports"] for f in r["findings"] if f["level"] == "error"}


def patched(src: Path, dst: Path, old: bytes, new: bytes, occurrence: int = 0) -> Path:
    data = bytearray(src.read_bytes())
    at = -1
    for _ in range(occurrence + 1):
        at = data.index(old, at + 1)
    data[at:at + len(new)] = new
    dst.write_bytes(bytes(data))
    return dst


@pytest.fixture
def pair_dir(fx, tmp_path):
    """A GGUF with its head beside it, as a release folder would hold them."""
    shutil.copy(fx.gguf_f32, tmp_path / "model.gguf")
    shutil.copy(fx.head, tmp_path / "joint_head.safetensors")
    shutil.copy(fx.head.with_name("joint_head_config.json"), tmp_path / "joint_head_config.json")
    return tmp_path


def test_the_good_pair_is_accepted(capsys, pair_dir):
    code, doc = run_check(capsys, pair_dir / "model.gguf")
    assert code == 0 and doc["accepted"] and not codes(doc)
    facts = doc["reports"][0]["facts"]
    assert facts["architecture"] == "qwen35" and facts["embedding_length"] == 64
    assert facts["full_attention_layers"] == 1 and facts["vocab_size"] == 151936


def test_human_output_names_finding_and_fix(capsys, fx):
    assert main(["check", str(fx.gguf_f32)]) == 1
    out = capsys.readouterr().out
    assert "REFUSED" in out and "pair.headless" in out and "headless-GGUF trap" in out
    assert "fix:" in out and "Cloudflare/clef-flash" in out


def test_headless_gguf(capsys, fx, tmp_path):
    shutil.copy(fx.gguf_f32, tmp_path / "lonely.gguf")
    code, doc = run_check(capsys, tmp_path / "lonely.gguf")
    assert code == 1 and codes(doc) == {"pair.headless"}


def test_head_found_by_stem(capsys, fx, tmp_path):
    shutil.copy(fx.gguf_f32, tmp_path / "clef.gguf")
    shutil.copy(fx.head, tmp_path / "clef.head.safetensors")
    shutil.copy(fx.head.with_name("joint_head_config.json"), tmp_path / "joint_head_config.json")
    code, doc = run_check(capsys, tmp_path / "clef.gguf")
    assert code == 0, doc


def test_truncated_gguf(capsys, pair_dir):
    gguf = pair_dir / "model.gguf"
    gguf.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])
    code, doc = run_check(capsys, gguf)
    assert code == 1 and "gguf.truncated" in codes(doc)


def test_truncated_inside_the_header(capsys, pair_dir):
    gguf = pair_dir / "model.gguf"
    gguf.write_bytes(gguf.read_bytes()[:100_000])
    code, doc = run_check(capsys, gguf)
    assert code == 1 and codes(doc) == {"gguf.header"}


def test_bad_magic(capsys, pair_dir):
    gguf = pair_dir / "model.gguf"
    patched(gguf, gguf, b"GGUF", b"GGML")
    code, doc = run_check(capsys, gguf)
    assert code == 1 and codes(doc) == {"gguf.magic"}


def test_unsupported_version(capsys, pair_dir):
    gguf = pair_dir / "model.gguf"
    data = bytearray(gguf.read_bytes())
    data[4:8] = struct.pack("<I", 99)
    gguf.write_bytes(bytes(data))
    code, doc = run_check(capsys, gguf)
    assert code == 1 and codes(doc) == {"gguf.version"}


def test_another_architecture(capsys, pair_dir):
    gguf = pair_dir / "model.gguf"
    patched(gguf, gguf, b"general.architecture\x08\x00\x00\x00\x06\x00\x00\x00\x00\x00\x00\x00qwen35",
            b"general.architecture\x08\x00\x00\x00\x06\x00\x00\x00\x00\x00\x00\x00llama3")
    code, doc = run_check(capsys, gguf)
    assert code == 1 and "gguf.architecture" in codes(doc)
    assert "'llama3' is not a Clef backbone" in json.dumps(doc)


def test_hidden_size_mismatch(capsys, fx, tmp_path):
    cfg = HeadConfig(hidden_size=128, width=32, routing_layers=1, layers=1, heads=2, feedforward=64)
    save_state_dict(tmp_path / "joint_head.safetensors", random_state_dict(cfg))
    (tmp_path / "joint_head_config.json").write_text(json.dumps(vars(cfg)))
    code, doc = run_check(capsys, fx.gguf_f32, "--head", tmp_path / "joint_head.safetensors")
    assert code == 1 and codes(doc) == {"pair.hidden_size"}


def test_vocab_mismatch(capsys, pair_dir):
    gguf = pair_dir / "model.gguf"
    # output.weight's second dimension (its rows) patched from 151936 to 1000 in the tensor table
    old = b"output.weight\x02\x00\x00\x00" + struct.pack("<QQ", 64, 151936)
    patched(gguf, gguf, old, b"output.weight\x02\x00\x00\x00" + struct.pack("<QQ", 64, 1000))
    code, doc = run_check(capsys, gguf)
    assert code == 1 and codes(doc) == {"pair.vocab"}


def test_missing_special_tokens(capsys, pair_dir):
    gguf = pair_dir / "model.gguf"
    patched(gguf, gguf, b"\x07\x00\x00\x00\x00\x00\x00\x00<think>", b"\x07\x00\x00\x00\x00\x00\x00\x00<thonk>")
    code, doc = run_check(capsys, gguf)
    assert code == 1 and codes(doc) == {"gguf.special_tokens"} and "<think>" in json.dumps(doc)


def _rewrite_head(pair_dir: Path, edit) -> Path:
    cfg = HeadConfig(**json.loads((pair_dir / "joint_head_config.json").read_text()))
    flat = load_state_dict(pair_dir / "joint_head.safetensors", cfg)
    edit(flat)
    save_state_dict(pair_dir / "joint_head.safetensors", flat)
    return pair_dir / "model.gguf"


@pytest.mark.parametrize("edit, code", [
    (lambda f: f.pop("layers.0.linear2.bias"), "head.tensor_missing"),
    (lambda f: f.update({"extra.weight": np.zeros(4, np.float32)}), "head.tensor_unexpected"),
    (lambda f: f.update({"type_embedding.weight": np.zeros((4, 32), np.float32)}), "head.tensor_shape"),
    (lambda f: f["option_norm.weight"].__setitem__(3, np.nan), "head.nonfinite"),
], ids=["missing-tensor", "extra-tensor", "wrong-shape", "nan"])
def test_bad_heads(capsys, pair_dir, edit, code):
    gguf = _rewrite_head(pair_dir, edit)
    exit_code, doc = run_check(capsys, gguf)
    assert exit_code == 1 and codes(doc) == {code}


def test_missing_config(capsys, pair_dir):
    (pair_dir / "joint_head_config.json").unlink()
    code, doc = run_check(capsys, pair_dir / "model.gguf")
    assert code == 1 and codes(doc) == {"head.config_missing"}


def test_config_that_disagrees_with_the_tensors(capsys, pair_dir):
    raw = json.loads((pair_dir / "joint_head_config.json").read_text())
    (pair_dir / "joint_head_config.json").write_text(json.dumps({**raw, "feedforward": 128}))
    code, doc = run_check(capsys, pair_dir / "model.gguf")
    assert code == 1 and codes(doc) == {"head.tensor_shape"}


def test_scalar_out_of_range_is_a_warning(capsys, pair_dir):
    gguf = _rewrite_head(pair_dir, lambda f: f.update({"joint_logit_scale": np.float32(30.0).reshape(())}))
    code, doc = run_check(capsys, gguf)
    assert code == 0
    assert [f["code"] for f in doc["reports"][0]["findings"]] == ["head.scalar_range", "pair.no_record"]


def test_missing_files_are_io_errors(capsys, fx, tmp_path):
    code, doc = run_check(capsys, tmp_path / "nope.gguf", "--head", fx.head)
    assert code == 2 and codes(doc) == {"gguf.missing"}
    code, doc = run_check(capsys, fx.gguf_f32, "--head", tmp_path / "nope.safetensors")
    assert code == 2 and "head.missing" in codes(doc)
    assert main(["check"]) == 2
    capsys.readouterr()


def _models_toml(tmp_path, fx, extra="") -> Path:
    path = tmp_path / "models.toml"
    path.write_text(f'[models.tiny]\ngguf = "{fx.gguf_f32}"\nhead = "{fx.head}"\nn_ctx = 4096\nmax_length = 4096\n'
                    + extra)
    return path


def test_sha256_pins(capsys, fx, tmp_path):
    good = sha256_file(fx.gguf_f32)
    assert good == sha256_file(fx.gguf_f32)  # the second call comes from the cache
    code, doc = run_check(capsys, "--models", _models_toml(tmp_path, fx, f'gguf_sha256 = "{good}"\n'))
    assert code == 0, doc
    code, doc = run_check(capsys, "--models", _models_toml(tmp_path, fx, f'head_sha256 = "{"0" * 64}"\n'))
    assert code == 1 and codes(doc) == {"pin.head_sha256"}


@pytest.fixture(scope="module")
def pairing(fx, tmp_path_factory):
    """A pairing record made from the F32 backbone and the head."""
    path = tmp_path_factory.mktemp("pair") / "tiny.pair.json"
    assert main(["pair", str(fx.gguf_f32), str(fx.head), "-o", str(path)]) == 0
    return path


@pytest.mark.parametrize("name", ["gguf_f16", "gguf_q8_0", "gguf_q4_k_m"])
def test_pairing_accepts_quantized_copies(capsys, fx, pairing, name):
    code, doc = run_check(capsys, getattr(fx, name), "--head", fx.head, "--pair", pairing)
    assert code == 0 and not codes(doc), doc
    facts = doc["reports"][0]["facts"]
    assert facts["canary_max_diff"] <= MAX_CANARY_DIFF and facts["canary_state_drift"] <= MAX_STATE_DRIFT


def test_pairing_refuses_a_fine_tune_of_the_same_base(capsys, fx, pairing):
    """Same embeddings, lm_head and final norm (the fingerprint passes), changed inner layers: the canaries refuse."""
    code, doc = run_check(capsys, fx.gguf_finetune, "--head", fx.head, "--pair", pairing)
    facts = doc["reports"][0]["facts"]
    print(f"fine-tune: row cosine {facts['fingerprint_min_cosine']}, state drift {facts['canary_state_drift']}")
    assert facts["fingerprint_min_cosine"] >= MIN_ROW_COSINE
    assert code == 1 and codes(doc) == {"pair.canary_mismatch"}


def test_pair_record_contents(pairing, fx):
    record = json.loads(pairing.read_text())
    assert record["head_sha256"] == sha256_file(fx.head)
    assert len(record["fingerprint"]["rows"]) == 16 and len(record["canaries"]) == 2


@pytest.mark.parametrize("which", ["gguf_f16", "gguf_q8_0", "gguf_q4_k_m"])
def test_quantized_copies_of_the_right_backbone_are_accepted(capsys, fx, pairing, which):
    code, doc = run_check(capsys, getattr(fx, which), "--head", fx.head, "--pair", pairing)
    facts = doc["reports"][0]["facts"]
    print(f"{which}: row cosine {facts['fingerprint_min_cosine']}, canary max diff {facts['canary_max_diff']}")
    assert code == 0, doc
    assert facts["fingerprint_min_cosine"] >= MIN_ROW_COSINE and facts["canary_max_diff"] <= MAX_CANARY_DIFF


def test_a_swapped_backbone_is_refused(capsys, fx, pairing):
    code, doc = run_check(capsys, fx.gguf_other, "--head", fx.head, "--pair", pairing)
    assert code == 1 and codes(doc) == {"pair.backbone_mismatch"}


def test_a_different_head_is_refused_by_the_record(capsys, fx, pairing, tmp_path):
    head = tmp_path / "joint_head.safetensors"
    cfg = HeadConfig(**json.loads(fx.head.with_name("joint_head_config.json").read_text()))
    save_state_dict(head, random_state_dict(cfg, seed=99))
    shutil.copy(fx.head.with_name("joint_head_config.json"), tmp_path / "joint_head_config.json")
    code, doc = run_check(capsys, fx.gguf_f32, "--head", head, "--pair", pairing)
    assert code == 1 and "pair.head_changed" in codes(doc)


def test_fingerprint_and_canary_tolerances(fx):
    """The numbers behind the tolerances in provenance.py, on the tiny backbones."""

    base = open_spec(tiny_spec(fx))
    record = {"fingerprint": fingerprint(fx.gguf_f32), "canaries": canary_probabilities(base),
              "states": canary_states(base)}
    base.close()
    for name in ("gguf_f16", "gguf_q8_0", "gguf_q4_k_m", "gguf_finetune", "gguf_other"):
        model = open_spec(tiny_spec(fx, gguf=getattr(fx, name)))
        cosine, norm = compare_fingerprints(record["fingerprint"], fingerprint(getattr(fx, name)))
        canary = canary_difference(record["canaries"], canary_probabilities(model))
        drift = state_drift(record["states"], canary_states(model))
        model.close()
        print(f"{name}: row cosine {cosine:.4f}, norm diff {norm:.4f}, canary max |dp| {canary:.4f}, "
              f"hidden-state drift {drift:.4f}")
        if name == "gguf_other":
            assert cosine < 0.5 and drift > MAX_STATE_DRIFT
        elif name == "gguf_finetune":  # the fingerprint cannot see it; the hidden states do
            assert cosine >= MIN_ROW_COSINE and drift > MAX_STATE_DRIFT
        else:
            assert cosine >= MIN_ROW_COSINE and canary <= MAX_CANARY_DIFF and drift <= MAX_STATE_DRIFT


@pytest.mark.parametrize("case, code", [("headless", "pair.headless"), ("hidden-size", "pair.hidden_size"),
                                        ("nan-head", "head.nonfinite"), ("pin", "pin.gguf_sha256"),
                                        ("pin-last-digit", "pin.gguf_sha256"),
                                        ("swapped-backbone", "pair.backbone_mismatch")])
def test_the_server_refuses_to_start(fx, tmp_path, pairing, case, code):
    spec = tiny_spec(fx)
    if case == "headless":  # no head named, none beside the GGUF: the headless-GGUF trap
        lonely = tmp_path / "lonely.gguf"
        shutil.copy(fx.gguf_f32, lonely)
        spec = model_spec("tiny", lonely, n_ctx=8192, max_length=8192)
        assert spec.head_path is None
    elif case == "hidden-size":
        cfg = HeadConfig(hidden_size=128, width=32, routing_layers=1, layers=1, heads=2, feedforward=64)
        save_state_dict(tmp_path / "joint_head.safetensors", random_state_dict(cfg))
        (tmp_path / "joint_head_config.json").write_text(json.dumps(vars(cfg)))
        spec = tiny_spec(fx, head=tmp_path / "joint_head.safetensors")
    elif case == "nan-head":
        cfg = HeadConfig(**json.loads(fx.head.with_name("joint_head_config.json").read_text()))
        flat = random_state_dict(cfg)
        flat["residual_gate"] = np.float32(np.nan).reshape(())
        save_state_dict(tmp_path / "joint_head.safetensors", flat)
        shutil.copy(fx.head.with_name("joint_head_config.json"), tmp_path / "joint_head_config.json")
        spec = tiny_spec(fx, head=tmp_path / "joint_head.safetensors")
    elif case == "pin":
        spec = tiny_spec(fx, gguf_sha256="f" * 64)
    elif case == "pin-last-digit":  # all 64 digits count, not a prefix
        real = sha256_file(fx.gguf_f32)
        spec = tiny_spec(fx, gguf_sha256=real[:-1] + ("0" if real[-1] != "0" else "1"))
    else:
        spec = tiny_spec(fx, gguf=fx.gguf_other, pair=pairing)
    with pytest.raises(ModelRefused) as info:
        load_checked(spec)
    assert "'tiny' refused" in str(info.value) and "fix:" in str(info.value)
    assert {f.code for f in info.value.report.findings if f.level == "error"} == {code}
    with pytest.raises(ModelRefused):
        with RunningServer(registry_for(spec, tmp_path / "models.toml")):
            pass


def test_warnings_are_served_and_listed(fx, tmp_path):
    cfg = HeadConfig(**json.loads(fx.head.with_name("joint_head_config.json").read_text()))
    flat = load_state_dict(fx.head, cfg)
    flat["prior_logit_scale"] = np.float32(-12.0).reshape(())
    head = tmp_path / "joint_head.safetensors"
    save_state_dict(head, flat)
    shutil.copy(fx.head.with_name("joint_head_config.json"), tmp_path / "joint_head_config.json")
    spec = tiny_spec(fx, head=head)
    with RunningServer(registry_for(spec, tmp_path / "models.toml")) as srv:
        [entry] = srv.request("GET", "/v1/models").json()["models"]
        assert entry["x_warnings"] and "head.scalar_range" in entry["x_warnings"][0]
        assert srv.post({"model": "tiny", "state": "s", "questions": {"q": {"type": "noul"}}}).status == 200
