"""bridge/gguf/lora.py: PEFT adapters (clef-finetune's) to llama.cpp's GGUF LoRA, from the base GGUF alone.

The layout test checks each target's mapping against what llama.cpp's own converter did to the base's weights
(tiny-hf -> tiny-f32.gguf): a LoRA delta B @ A laid out as gguf_matrices lays it must move exactly the GGUF
weight's rows and columns that the HF weight's did. tests/test_lora_serving.py checks the answers against PEFT.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from clef_bridge.bridge.gguf.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    QWEN35_TARGETS,
    AdapterError,
    AdapterMismatch,
    AdapterSkipped,
    converted_lora,
    gguf_matrices,
    gguf_name,
    head_counts,
    read_peft,
)
from clef_bridge.bridge.gguf.reader import read_gguf, tensor_float32
from clef_bridge.head.weights import read_header, read_tensors, save_state_dict

from . import fixturegen_lora

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lfx():
    return fixturegen_lora.build()


def copy_adapter(lfx, tmp_path, name="claims", config=None, tensors=None):
    """A copy of a fixture adapter, its config keys and tensors changed."""
    out = tmp_path / f"{name}-copy"
    shutil.copytree(lfx.adapter(name), out)
    if config:
        path = out / ADAPTER_CONFIG
        path.write_text(json.dumps(json.loads(path.read_text()) | config))
    if tensors is not None:
        weights = out / ADAPTER_WEIGHTS
        save_state_dict(weights, tensors(read_tensors(weights, read_header(weights))), "F32")
    return out


def test_every_clef_finetune_target_is_read_and_mapped(lfx):
    adapter = read_peft(lfx.adapter("claims"))
    assert adapter.r == 8 and adapter.alpha == 16 and adapter.skipped == ()
    assert set(adapter.targets) == set(QWEN35_TARGETS)  # all twelve module kinds of the tiny Qwen3.5
    assert len(adapter.matrices) == 31  # 3 linear-attention layers x 8 + 1 full-attention layer x 7
    assert all(np.abs(b).max() > 0 for _, b in adapter.matrices.values())


@pytest.mark.parametrize("kind", sorted(QWEN35_TARGETS))
def test_each_targets_layout_is_the_converters(lfx, kind):
    """B @ A laid out for the GGUF equals the GGUF's weight where the HF weight went in as the delta."""
    from safetensors import safe_open

    info = read_gguf(lfx.base.gguf_f32)
    counts = head_counts(info)
    layer = 3 if kind.startswith("self_attn.") else 0
    with safe_open(str(lfx.base.hf_model / "model.safetensors"), "np") as f:
        hf = f.get_tensor(f"model.language_model.layers.{layer}.{kind}.weight")  # [out, in]
    out_dim, in_dim = hf.shape
    # the HF weight as a full-rank delta twice: on B's side (A = I) and on A's side (B = I)
    for a, b in ((np.eye(in_dim, dtype=np.float32), hf), (hf, np.eye(out_dim, dtype=np.float32))):
        a2, b2 = gguf_matrices(kind, a, b, counts)
        want = tensor_float32(info, info.tensors[gguf_name(f"layers.{layer}.{kind}")])
        np.testing.assert_allclose(b2 @ a2, want.reshape(out_dim, in_dim), rtol=0, atol=1e-6)


def test_the_converted_file_is_llama_cpps_lora_format_and_cached(lfx, tmp_path):
    out = converted_lora(lfx.adapter("claims"), lfx.base.gguf_f32, cache=tmp_path)
    info = read_gguf(out)
    assert info.metadata["general.type"] == "adapter" and info.metadata["adapter.type"] == "lora"
    assert info.architecture == "qwen35" and info.metadata["adapter.lora.alpha"] == 16.0
    assert len(info.tensors) == 62 and all(n.endswith((".weight.lora_a", ".weight.lora_b")) for n in info.tensors)
    a = info.tensors["blk.0.attn_qkv.weight.lora_a"]
    b = info.tensors["blk.0.attn_qkv.weight.lora_b"]
    assert a.shape == (64, 8) and b.shape == (8, 128)  # ggml order: [in, r] and [r, out]
    mtime = out.stat().st_mtime_ns
    assert converted_lora(lfx.checkpoints["claims"], lfx.base.gguf_f32, cache=tmp_path) == out  # checkpoint folder
    assert out.stat().st_mtime_ns == mtime  # converted once
    assert converted_lora(out, lfx.base.gguf_f32) == out  # a GGUF LoRA as it is
    other = converted_lora(lfx.adapter("routing"), lfx.base.gguf_f32, cache=tmp_path)
    assert other != out and read_gguf(other).metadata["adapter.lora.alpha"] == 4.0


def test_a_tensor_llama_cpp_would_skip_is_refused_by_name(lfx, tmp_path):
    extra = "base_model.model.lm_head.lora_A.weight"
    folder = copy_adapter(lfx, tmp_path, tensors=lambda t: t | {extra: np.ones((8, 64), np.float32)})
    with pytest.raises(AdapterSkipped, match="lm_head.lora_A") as refused:
        converted_lora(folder, lfx.base.gguf_f32, cache=tmp_path)
    assert "silently ignored" in str(refused.value)


def test_an_adapter_for_another_base_is_refused_naming_both(lfx, tmp_path):
    def wider(t):
        key = "base_model.model.model.language_model.layers.0.mlp.up_proj.lora_B.weight"
        return t | {key: np.ones((256, 8), np.float32)}

    folder = copy_adapter(lfx, tmp_path, config={"base_model_name_or_path": "someone/other-model"}, tensors=wider)
    with pytest.raises(AdapterMismatch) as refused:
        converted_lora(folder, lfx.base.gguf_f32, cache=tmp_path)
    message = str(refused.value)
    assert "someone/other-model" in message and lfx.base.gguf_f32.name in message and "mlp.up_proj" in message


def test_an_adapter_on_another_architecture_is_refused(lfx, tmp_path):
    omni = lfx.base.root / "tiny-omni-f32.gguf"
    if not omni.exists():
        pytest.skip("the omni fixture is not built")
    with pytest.raises(AdapterMismatch, match="qwen3vlmoe"):
        converted_lora(lfx.adapter("claims"), omni, cache=tmp_path)


@pytest.mark.parametrize("config, what", [({"use_dora": True}, "DoRA"), ({"bias": "all"}, "biases"),
                                          ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
                                          ({"peft_type": "IA3"}, "not a PEFT LoRA")])
def test_what_llama_cpp_cannot_apply_is_refused(lfx, tmp_path, config, what):
    with pytest.raises(AdapterError, match=what):
        read_peft(copy_adapter(lfx, tmp_path, config=config))


def test_rslora_folds_its_scale_into_alpha(lfx, tmp_path):
    assert read_peft(copy_adapter(lfx, tmp_path, config={"use_rslora": True})).alpha == pytest.approx(16 * 8 ** 0.5)


def test_the_plans_adapter_size_is_the_converted_files(lfx, tmp_path):
    from clef_bridge.bridge.config.memory_plan import arch_from_gguf, lora_bytes
    from clef_bridge.bridge.gguf.lora import lora_file_bytes

    out = converted_lora(lfx.adapter("claims"), lfx.base.gguf_f32, cache=tmp_path)
    written = sum(t.n_bytes for t in read_gguf(out).tensors.values())
    assert lora_bytes(arch_from_gguf(read_gguf(lfx.base.gguf_f32)), 8) == written
    assert lora_file_bytes(lfx.checkpoints["claims"]) == written == lora_file_bytes(out)


def test_the_lora_command_writes_a_file_serve_takes_as_it_is(lfx, tmp_path, capsys):
    from clef_bridge.bridge.model.loading import load_checked
    from clef_bridge.tools.cli import main

    from .conftest import tiny_spec

    out = tmp_path / "claims.lora.gguf"
    assert main(["lora", str(lfx.checkpoints["claims"]), str(lfx.base.gguf_f32), "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lora"]["rank"] == 8
    ids = np.arange(1000, 1040, dtype=np.int32)
    hidden = []
    for lora in (out, lfx.checkpoints["claims"]):
        model = load_checked(tiny_spec(lfx.base, head=lfx.head("claims"), lora=lora)).model
        try:
            hidden.append(model.backbone.prefill(ids))
        finally:
            model.close()
    np.testing.assert_array_equal(hidden[0], hidden[1])
    wider = copy_adapter(lfx, tmp_path, tensors=lambda t: t | {
        "base_model.model.model.language_model.layers.0.mlp.up_proj.lora_B.weight": np.ones((256, 8), np.float32)})
    assert main(["lora", str(wider), str(lfx.base.gguf_f32), "-o", str(tmp_path / "x.gguf")]) == 2  # another base
    assert not (tmp_path / "x.gguf").exists()  # refused before anything is written
