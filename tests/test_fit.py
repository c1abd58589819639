"""The GPU memory planner: hand-computed values, llama.cpp's own reports, and the CLI."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from clef_bridge.bridge.config.memory_plan import (
    GIB,
    MIB,
    arch_from_gguf,
    compute_bytes,
    kv_cache_bytes,
    parse_size,
    plan,
    recurrent_bytes,
)
from clef_bridge.bridge.config.presets import arch_preset
from clef_bridge.bridge.demo.builtins import make_demo
from clef_bridge.bridge.gguf.reader import read_gguf
from clef_bridge.bridge.llama import log as llama_log
from clef_bridge.bridge.llama.backbone import Backbone, BackboneOptions
from clef_bridge.tools.cli import main

pytestmark = pytest.mark.integration


def test_clef_flash_kv_is_32_kib_per_token_at_f16():
    arch = arch_preset("clef-flash", "Q8_0")
    assert arch.n_full == 8 and arch.n_layer == 32
    # 8 full-attention layers x (K and V) x 4 KV heads x 256 x 2 bytes
    assert kv_cache_bytes(arch, 1) == 8 * 2 * 4 * 256 * 2 * 256  # one token rounds up to 256 cells
    assert kv_cache_bytes(arch, 65536) == 32 * 1024 * 65536 == 2 * GIB
    # charging every layer (the common mistake) would be 4x as much
    assert kv_cache_bytes(arch, 65536) * 4 == 32 * 2 * 4 * 256 * 2 * 65536


def test_recurrent_state_of_the_linear_layers():
    arch = arch_preset("clef-flash", "Q8_0")
    # llama.cpp's n_embd_r + n_embd_s: conv (4-1) x (4096 + 2*16*128) + state 128 x 4096, float32
    assert arch.recurrent_row == 3 * (4096 + 2 * 16 * 128) + 128 * 4096
    assert recurrent_bytes(arch, 1) == 24 * arch.recurrent_row * 4
    assert recurrent_bytes(arch, 8) == 8 * recurrent_bytes(arch, 1)


def test_tiny_fixture_hand_computed(fx):
    arch = arch_from_gguf(read_gguf(fx.gguf_f32))
    assert (arch.n_layer, arch.n_full, arch.n_head_kv, arch.head_dim) == (4, 1, 2, 16)
    assert kv_cache_bytes(arch, 4096) == 1 * 2 * 2 * 16 * 4096 * 2
    assert recurrent_bytes(arch, 4) == 3 * ((4 - 1) * (64 + 2 * 2 * 16) + 16 * 64) * 4 * 4


def _llama_reports(path, ctx, seqs, ubatch, flash):
    with llama_log.capture() as lines:
        backbone = Backbone(path, BackboneOptions(n_ctx=ctx, n_seq_max=seqs, n_ubatch=ubatch, flash_attn=flash))
    backbone.close()
    text = "".join(lines)
    mib = lambda pattern: float(re.search(pattern + r"\s*=\s*([\d.]+) MiB", text).group(1)) * MIB  # noqa: E731
    return {"weights": mib(r"CPU_Mapped model buffer size"), "kv": mib(r"llama_kv_cache: size"),
            "recurrent": mib(r"llama_memory_recurrent: size"), "compute": mib(r"CPU compute buffer size")}


@pytest.mark.parametrize("which", ["tiny", "demo"])
@pytest.mark.parametrize("ctx, seqs, ubatch, flash", [(4096, 4, 512, False), (8192, 8, 1024, False),
                                                      (4096, 2, 512, True)])
def test_estimate_within_10_percent_of_llama_cpp(fx, tmp_path, which, ctx, seqs, ubatch, flash):
    path = fx.gguf_f32 if which == "tiny" else make_demo(tmp_path / "demo").gguf
    reported = _llama_reports(path, ctx, seqs, ubatch, flash)
    arch = arch_from_gguf(read_gguf(path))
    p = plan(arch, 64 * GIB, ctx, seqs, ubatch)
    ours = {"weights": p.weights_bytes + p.cpu_weights_bytes, "kv": p.kv_cache_bytes,
            "recurrent": p.recurrent_state_bytes, "compute": compute_bytes(arch, ctx, ubatch, flash)}
    for key, value in reported.items():
        assert abs(ours[key] - value) <= 0.10 * value, (key, ours[key], value)


def test_plan_fits_and_falls_back_to_partial_offload():
    q4 = plan(arch_preset("clef-flash", "Q4_K_M"), 16 * GIB, ctx=16384)
    assert q4.fits and q4.n_gpu_layers == -1 and q4.max_ctx >= 65536
    f16 = plan(arch_preset("clef-flash", "F16"), 16 * GIB, ctx=16384)
    assert not f16.fits and 0 < f16.n_gpu_layers < 32
    parts = f16.summary()
    assert set(parts) == {"fits", "weights_bytes", "kv_cache_bytes", "recurrent_state_bytes", "compute_bytes",
                          "head_bytes", "vision_bytes", "total_bytes", "vram_bytes", "max_ctx", "n_gpu_layers",
                          "n_cpu_moe", "cpu_weights_bytes", "host_bytes"}
    assert all(isinstance(v, int) for k, v in parts.items() if k != "fits")
    big = plan(arch_preset("clef", "Q8_0"), 24 * GIB, ctx=16384)
    assert not big.fits and big.max_ctx == 0


def test_fit_command_json_and_text(fx, capsys):
    assert main(["fit", "--arch", "clef-flash", "--quant", "Q4_K_M", "--vram", "16GiB", "--ctx", "65536",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fits"] is True and doc["kv_cache_bytes"] == 2 * GIB and doc["vram_bytes"] == 16 * GIB
    assert main(["fit", str(fx.gguf_f32), "--vram", "8GiB"]) == 0
    out = capsys.readouterr().out
    assert "1 full-attention layers of 4" in out and "FITS" in out
    assert main(["fit", "--arch", "clef", "--quant", "F16", "--vram", "16GiB"]) == 1
    assert "n_gpu_layers" in capsys.readouterr().out
    assert main(["fit", "--arch", "clef-flash", "--vram", "lots"]) == 2


def test_parse_size():
    assert parse_size("16GiB") == 16 * GIB and parse_size("24GB") == 24 * 10**9
    assert parse_size("12000MiB") == 12000 * MIB and parse_size("16") == 16 * GIB
    with pytest.raises(ValueError, match="16GiB"):
        parse_size("sixteen")


def test_auto_layers_and_the_context_warning(fx, monkeypatch):
    import llama_cpp
    from clef_bridge.bridge.config import memory_plan as fit
    from clef_bridge.bridge.host.gpu import GpuMemory

    auto = BackboneOptions(n_ctx=4096, n_seq_max=1, n_gpu_layers="auto")
    every = replace(auto, n_gpu_layers=-1)
    free = lambda n: lambda: GpuMemory("GPU 0 (test)", n, 16 * GIB, 16 * GIB - n)  # noqa: E731
    layers = lambda *a: (lambda placed, w: (placed.n_gpu_layers, w))(*fit.placement_for(*a))  # noqa: E731
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: False)
    assert layers(fx.gguf_f32, auto, 0) == (0, [])  # a CPU build
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    n, warnings = layers(fx.gguf_f32, auto, 0, lambda: None)  # no NVML: said, not silent
    assert n == -1 and warnings[0].startswith("fit.no_nvml") and "nvidia-ml-py" in warnings[0]
    assert layers(fx.gguf_f32, every, 0, lambda: None) == (-1, [])  # a number needs no NVML
    assert layers(fx.gguf_f32, auto, 0, free(8 * GIB)) == (-1, [])
    n, warnings = layers(fx.gguf_f32, auto, 0, free(560 * MIB))  # under margin plus weights
    assert 0 <= n < 4 and len(warnings) == 1 and "largest context that fits" in warnings[0]
    assert "GPU 0 (test)" in warnings[0]
    n, warnings = layers(fx.gguf_f32, every, 0, free(560 * MIB))
    assert n == -1 and 'set n_gpu_layers = "auto"' in warnings[0]
    # a dense backbone has no experts to move: n_cpu_moe "auto" resolves to 0 and says nothing without NVML
    assert fit.placement_for(fx.gguf_f32, replace(every, n_cpu_moe="auto"), 0, lambda: None)[0].n_cpu_moe == 0
