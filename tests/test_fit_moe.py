"""MoE memory plans (Clef-omni's qwen3vlmoe backbone): the GGUF read, llama.cpp's own reports with experts in
host memory, the override the loader applies, the `fit --arch clef-omni` plans and the models.toml key."""

from __future__ import annotations

import ctypes
import json
import re
from dataclasses import replace
from pathlib import Path

import llama_cpp as lc
import pytest
from clef_bridge.bridge.config.memory_plan import GIB, MIB, arch_from_gguf, compute_bytes, kv_cache_bytes, plan
from clef_bridge.bridge.config.presets import arch_preset, omni_projector, type_bytes
from clef_bridge.bridge.config.registry import RegistryError, model_spec
from clef_bridge.bridge.demo.moe import MoeDims, write_qwen3vlmoe_gguf
from clef_bridge.bridge.gguf.reader import read_gguf
from clef_bridge.bridge.llama import log as llama_log
from clef_bridge.bridge.llama.backbone import Backbone, BackboneOptions
from clef_bridge.bridge.llama.buffers import cpu_experts, is_expert_tensor, overridden
from clef_bridge.tools.cli import main

pytestmark = pytest.mark.integration

# Qwen3-Omni's proportions at a tiny width: expert width 3/8 of hidden, 8 experts used, q = 2 x hidden
OMNI_SHAPED = {"h256": MoeDims(hidden=256, layers=6, heads=8, kv_heads=1, head_dim=64, experts=16, experts_used=8,
                               expert_ff=96),
               "h512": MoeDims(hidden=512, layers=4, heads=16, kv_heads=2, head_dim=64, experts=16, experts_used=8,
                               expert_ff=192, deepstack=2)}


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("moe")
    files = {name: write_qwen3vlmoe_gguf(folder / f"{name}.gguf", d, seed=i) for i, (name, d) in
             enumerate(OMNI_SHAPED.items())}
    files["q4"] = write_qwen3vlmoe_gguf(folder / "q4.gguf", MoeDims(layers=8), seed=7, matrices="Q4_K_M",
                                        n_vocab=4096)
    return files


def test_a_qwen3vlmoe_gguf_reads_as_full_attention_with_experts(moe):
    info = read_gguf(moe["h512"])
    arch = arch_from_gguf(info)
    d = OMNI_SHAPED["h512"]
    assert arch.full == (True,) * d.layers and arch.every_token_output
    assert (arch.n_expert, arch.n_expert_used, arch.ff_expert, arch.n_deepstack) == (16, 8, 192, 2)
    experts = {t.name for t in arch.tensors if t.expert}
    assert experts == {f"blk.{i}.ffn_{k}_exps.weight" for i in range(d.layers) for k in ("gate", "up", "down")}
    assert "blk.0.ffn_gate_inp.weight" not in experts  # the router stays with its layer
    assert sum(t.nbytes for t in arch.tensors if t.expert) == sum(info.tensors[n].n_bytes for n in experts)
    assert kv_cache_bytes(arch, 4096) == d.layers * 2 * d.kv_heads * d.head_dim * 4096 * 2  # every layer


def _load(path: Path, n_cpu_moe: int, ctx: int, ubatch: int, flash: bool, every_token: bool,
          sized: bool = False) -> str:
    """llama.cpp's load log, the model loaded with the plan's override and a context as the backbones make one:
    one output per sequence (the qwen35 path), or every token an output in n_ubatch chunks (qwen3vlmoe).
    sized: llama.cpp's no_alloc load, which sizes every buffer, allocates none and reads no weight."""
    lc.llama_backend_init()
    llama_log.install(False)
    mparams = lc.llama_model_default_params()
    mparams.use_extra_bufts = False
    if sized:
        mparams.no_alloc, mparams.load_mode = True, 0  # load mode NONE: no_alloc maps nothing
    overrides = cpu_experts(n_cpu_moe)
    if overrides is not None:
        overrides.apply(mparams)
    with llama_log.capture() as lines:
        model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx, cparams.n_ubatch, cparams.n_seq_max = ctx, ubatch, 1
        cparams.n_batch = ubatch if every_token else ctx
        cparams.n_outputs_max = ubatch if every_token else 1
        cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_AUTO if flash else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.kv_unified = True
        ctx_ = lc.llama_init_from_model(model, cparams)
    assert model and ctx_, "".join(lines)
    lc.llama_free(ctx_)
    lc.llama_model_free(model)
    return "".join(lines)


def _mib(text: str, pattern: str) -> float:
    return float(re.search(pattern + r"\s*=\s*([\d.]+) MiB", text).group(1)) * MIB


@pytest.mark.parametrize("which", ["h256", "h512"])
@pytest.mark.parametrize("n_cpu_moe, ctx, ubatch, flash, every_token", [
    (0, 4096, 512, False, False), (2, 8192, 512, True, False), (3, 4096, 256, True, True),
    (1, 2048, 512, False, True)])
def test_estimate_within_10_percent_of_llama_cpp(moe, which, n_cpu_moe, ctx, ubatch, flash, every_token):
    log = _load(moe[which], n_cpu_moe, ctx, ubatch, flash, every_token)
    arch = replace(arch_from_gguf(read_gguf(moe[which])), every_token_output=every_token)
    p = plan(arch, 64 * GIB, ctx, 1, ubatch, n_cpu_moe=n_cpu_moe)
    reported = {"weights": _mib(log, "CPU_Mapped model buffer size"), "kv": _mib(log, r"llama_kv_cache: size"),
                "compute": _mib(log, "CPU compute buffer size")}
    ours = {"weights": p.weights_bytes + p.cpu_weights_bytes, "kv": p.kv_cache_bytes,
            "compute": compute_bytes(arch, ctx, ubatch, flash)}
    for key, value in reported.items():
        assert abs(ours[key] - value) <= 0.10 * value, (key, ours[key], value)
    # the override took exactly the experts of the first n_cpu_moe blocks, and the plan moved exactly those bytes
    moved = overridden(log)
    assert set(moved) == {t.name for t in arch.tensors if t.expert and t.layer < n_cpu_moe}
    assert set(moved.values()) <= {"CPU"}
    token_embd = next(t.nbytes for t in arch.tensors if t.name == "token_embd.weight")
    assert p.cpu_weights_bytes - token_embd == sum(t.nbytes for t in arch.tensors if t.name in moved)


def test_the_loader_applies_n_cpu_moe(moe):
    """Through Backbone, quantized: llama.cpp's debug log names each overridden tensor (a CPU build has no GPU
    buffer to tell them apart by; the override matched exactly the expert tensors of blocks 0..N-1)."""
    info = read_gguf(moe["q4"])
    with llama_log.capture() as lines:
        backbone = Backbone(moe["q4"], BackboneOptions(n_ctx=1024, n_seq_max=1, n_cpu_moe=5))
    backbone.close()
    moved = overridden("".join(lines))
    assert set(moved) == {n for n in info.tensors if is_expert_tensor(n) and int(n.split(".")[1]) < 5}
    assert {info.tensors[n].type.name for n in moved} == {"Q4_K", "Q6_K"}  # llama.cpp's own mix, both kinds moved
    with llama_log.capture() as lines:
        Backbone(moe["q4"], BackboneOptions(n_ctx=1024, n_seq_max=1)).close()
    assert overridden("".join(lines)) == {}  # 0: nothing moved
    with pytest.raises(ValueError, match="resolved to a number"):
        Backbone(moe["q4"], BackboneOptions(n_ctx=1024, n_cpu_moe="auto"))


def test_the_smallest_n_cpu_moe_that_fits(moe):
    arch = arch_from_gguf(read_gguf(moe["q4"]))
    total = sum(t.nbytes for t in arch.tensors)
    roomy = plan(arch, 64 * GIB, 4096, n_cpu_moe=None)
    assert roomy.fits and roomy.n_cpu_moe == 0 and roomy.n_gpu_layers == -1
    # just under what the whole model needs: some blocks' experts leave, the fewest that make it fit
    tight = roomy.total_bytes - roomy.margin_bytes - 1
    vram = int((tight + 512 * MIB) / 0.97)  # what the margin leaves that much of
    p = plan(arch, vram, 4096, n_cpu_moe=None)
    assert p.fits and p.n_cpu_moe > 0 and p.total_bytes <= vram
    assert not plan(arch, vram, 4096, n_cpu_moe=p.n_cpu_moe - 1).fits
    assert p.cpu_weights_bytes > roomy.cpu_weights_bytes and p.weights_bytes + p.cpu_weights_bytes == total
    fixed = plan(arch, vram, 4096, n_cpu_moe=0)  # a number is kept: then layers leave instead
    assert not fixed.fits and fixed.n_cpu_moe == 0 and 0 <= fixed.n_gpu_layers <= arch.n_layer  # of n_layer + 1
    assert plan(arch, vram, 4096, n_cpu_moe=3) == plan(arch, vram, 4096, n_cpu_moe=3)


def test_clef_omni_published_shape():
    arch = arch_preset("clef-omni", "Q4_K_M")
    assert (arch.n_layer, arch.n_embd, arch.n_expert, arch.n_expert_used, arch.ff_expert) == (48, 2048, 128, 8, 768)
    total = sum(t.nbytes for t in arch.tensors)
    # 30.53 B parameters; llama.cpp's Q4_K_M: Q4_K, with ffn_down_exps and attn_v in Q6_K on half the layers
    experts_q4 = 3 * type_bytes("Q4_K", 128 * 768 * 2048)
    experts_q6 = 2 * type_bytes("Q4_K", 128 * 768 * 2048) + type_bytes("Q6_K", 128 * 768 * 2048)
    assert sum(t.nbytes for t in arch.tensors if t.expert) == 24 * experts_q4 + 24 * experts_q6
    assert 17.0 * GIB < total < 17.6 * GIB  # the facts sheet's "roughly 18-19 GB"
    assert kv_cache_bytes(arch, 1) == 48 * 2 * 4 * 128 * 2 * 256  # 96 KiB per token, every layer
    p16 = plan(arch, 16 * GIB, 16384, 5, n_cpu_moe=None)
    p24 = plan(arch, 24 * GIB, 16384, 5, n_cpu_moe=None)
    assert p16.fits and 0 < p16.n_cpu_moe < 48 and p24.fits and p24.n_cpu_moe < p16.n_cpu_moe
    assert p16.total_bytes <= 16 * GIB and not plan(arch, 16 * GIB, 16384, 5, n_cpu_moe=p16.n_cpu_moe - 1).fits
    projector = omni_projector()
    assert 0.9e9 < projector.vision_weight_bytes < 1.2e9 and 2.4e9 < projector.audio_weight_bytes < 2.8e9


def test_fit_clef_omni_command(capsys):
    assert main(["fit", "--arch", "clef-omni", "--quant", "Q4_K_M", "--vram", "16GiB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fits"] and doc["n_gpu_layers"] == -1 and doc["n_cpu_moe"] > 0 and doc["total_bytes"] <= 16 * GIB
    assert doc["vision_bytes"] > GIB and doc["audio_weight_bytes"] == 0  # the head, and the audio tower, on the CPU
    assert main(["fit", "--arch", "clef-omni", "--quant", "Q4_K_M", "--vram", "16GiB", "--n-cpu-moe", "0"]) == 1
    assert "n_gpu_layers" in capsys.readouterr().out
    assert main(["fit", "--arch", "clef-omni", "--quant", "Q4_K_M", "--vram", "24GiB", "--head-on-gpu"]) == 0
    out = capsys.readouterr().out
    assert "audio tower" in out and "n_cpu_moe = " in out and "48 full-attention layers of 48" in out
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--arch", "clef-omni", "--n-cpu-moe", "some", "--vram", "16GiB"])
    assert exit_.value.code == 2 and "a number of blocks (0 or more) or auto" in capsys.readouterr().err


def test_fit_a_moe_gguf(moe, capsys):
    assert main(["fit", str(moe["q4"]), "--vram", "8GiB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_cpu_moe"] == 0 and doc["fits"]


def test_n_cpu_moe_key(moe):
    assert model_spec("m", moe["q4"], n_cpu_moe="auto").backbone.n_cpu_moe == "auto"
    assert model_spec("m", moe["q4"], n_cpu_moe=12).backbone.n_cpu_moe == 12
    for bad in ("some", -1):
        with pytest.raises(RegistryError, match="n_cpu_moe"):
            model_spec("m", moe["q4"], n_cpu_moe=bad)


def test_the_override_array_is_null_terminated():
    overrides = cpu_experts(3)
    assert overrides.array[len(overrides.patterns)].pattern is None
    assert re.search(overrides.patterns[0].decode(), "blk.2.ffn_down_exps.weight")
    assert not re.search(overrides.patterns[0].decode(), "blk.12.ffn_down_exps.weight")  # 12 is not 1 or 2
    assert not re.search(overrides.patterns[0].decode(), "blk.1.ffn_gate_inp.weight")
    assert ctypes.cast(overrides.array, ctypes.c_void_p).value and cpu_experts(0) is None


CLEF_OMNI = MoeDims(hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, experts=128, experts_used=8,
                    expert_ff=768, deepstack=3)


@pytest.fixture(scope="module")
def omni_sized(tmp_path_factory) -> Path:
    """Clef-omni's exact shape in Q4_K_M, header only: an 18.6 GB sparse file that holds a few MB."""
    path = write_qwen3vlmoe_gguf(tmp_path_factory.mktemp("omni") / "omni.gguf", CLEF_OMNI, matrices="Q4_K_M",
                                 n_vocab=152064, data=False)
    if path.stat().st_blocks * 512 > 64 * MIB:
        path.unlink()
        pytest.skip("this filesystem stores the sparse file's holes; the real-size check needs sparse files")
    return path


@pytest.mark.parametrize("ctx, ubatch, flash, every_token", [(16384, 512, True, True), (65536, 512, True, True),
                                                             (16384, 512, True, False), (4096, 512, False, True)])
def test_clef_omni_sized_by_llama_cpp(omni_sized, ctx, ubatch, flash, every_token):
    """At Clef-omni's real shape (deepstack 3, as the loader sets it from the projector), llama.cpp's own sizes
    for the KV cache and the compute buffer, against the plan's."""
    log = _load(omni_sized, 20, ctx, ubatch, flash, every_token, sized=True)
    arch = replace(arch_from_gguf(read_gguf(omni_sized)), every_token_output=every_token)
    assert arch.n_deepstack == 3 and arch.n_vocab == 152064
    assert set(overridden(log)) == {t.name for t in arch.tensors if t.expert and t.layer < 20}
    reported = {"kv": _mib(log, r"llama_kv_cache: size"), "compute": _mib(log, "CPU compute buffer size")}
    ours = {"kv": kv_cache_bytes(arch, ctx), "compute": compute_bytes(arch, ctx, ubatch, flash)}
    for key, value in reported.items():
        assert abs(ours[key] - value) <= 0.10 * value, (key, ours[key], value)
    preset = arch_preset("clef-omni", "Q4_K_M")  # the file's tensors, as the preset counts them
    assert sum(t.nbytes for t in arch.tensors) == sum(t.nbytes for t in preset.tensors)
    assert sum(t.nbytes for t in arch.tensors if t.expert) == sum(t.nbytes for t in preset.tensors if t.expert)


def test_the_loader_resolves_auto(moe, monkeypatch):
    """placement_for, which load_checked calls before the backbone loads: "auto" becomes the plan's number."""
    from clef_bridge.bridge.config.memory_plan import placement_for, serving_plan
    from clef_bridge.bridge.host.gpu import GpuMemory

    auto = BackboneOptions(n_ctx=4096, n_seq_max=1, n_ubatch=512, n_cpu_moe="auto")
    free = lambda n: lambda: GpuMemory("GPU 0 (test)", n, 16 * GIB, 16 * GIB - n)  # noqa: E731
    monkeypatch.setattr(lc, "llama_supports_gpu_offload", lambda: False)
    assert placement_for(moe["q4"], auto, 0, free(GIB)) == (replace(auto, n_gpu_layers=-1, n_cpu_moe=0), [])
    monkeypatch.setattr(lc, "llama_supports_gpu_offload", lambda: True)
    assert placement_for(moe["q4"], auto, 0, free(8 * GIB))[0].n_cpu_moe == 0  # it all fits
    whole = serving_plan(moe["q4"], replace(auto, n_cpu_moe=0), 0, 64 * GIB)
    vram = int((whole.total_bytes - whole.margin_bytes - 1 + 512 * MIB) / 0.97)  # a little short of the whole
    placed, warnings = placement_for(moe["q4"], auto, 0, free(vram))
    assert placed.n_cpu_moe == serving_plan(moe["q4"], auto, 0, vram).n_cpu_moe > 0 and warnings == []
    assert placed.n_gpu_layers == -1
    placed, warnings = placement_for(moe["q4"], auto, 0, lambda: None)  # no NVML: said, not silent
    assert placed.n_cpu_moe == 0 and len(warnings) == 1 and "n_cpu_moe" in warnings[0]
    fixed = replace(auto, n_cpu_moe=4)
    assert placement_for(moe["q4"], fixed, 0, free(vram))[0].n_cpu_moe == 4  # a number is kept


def test_fit_counts_an_omni_projector_as_serve_does(tmp_path):
    """fit GGUF and serve plan the same image compute: Clef-omni's reference sizes images to 1,024 tokens at most,
    not Qwen3.5's 16,384 (what fit counted before, 16x the buffer)."""
    from clef_bridge.bridge.demo.builtins import make_demo
    from clef_bridge.bridge.gguf.projector import MAX_IMAGE_TOKENS, compute_bytes, max_image_tokens, projector_info
    from clef_bridge.tools.fit import fit

    make_demo(tmp_path / "demo")
    gguf, mmproj = tmp_path / "demo" / "omni" / "omni.gguf", tmp_path / "demo" / "omni" / "omni.mmproj.gguf"
    report = fit(gguf, None, "Q8_0", 16 * GIB, 4096, 1, 512, False, mmproj=mmproj)
    info = projector_info(mmproj)
    served = compute_bytes(info, max_image_tokens(read_gguf(gguf).architecture))  # what loading plans with
    assert max_image_tokens(read_gguf(gguf).architecture) < MAX_IMAGE_TOKENS
    assert report.vision_compute_bytes == served < compute_bytes(info, MAX_IMAGE_TOKENS)


def test_the_audio_tower_is_planned_on_the_gpu_with_the_head(tmp_path):
    """Qwen3-Omni's audio tower runs where the head runs, in float32: fit GGUF --head-on-gpu counts it (as the
    loader does for head_device = "cuda"), and a head on the CPU leaves it out of the GPU plan."""
    from clef_bridge.bridge.demo.builtins import make_demo
    from clef_bridge.bridge.gguf.projector import projector_info
    from clef_bridge.tools.fit import fit

    make_demo(tmp_path / "demo")
    gguf, mmproj = tmp_path / "demo" / "omni" / "omni.gguf", tmp_path / "demo" / "omni" / "omni.mmproj.gguf"
    tower = projector_info(mmproj).audio_float32_bytes
    assert tower > projector_info(mmproj).audio_bytes  # its F16 convolutions widen to float32
    on_cpu = fit(gguf, None, "Q8_0", 16 * GIB, 4096, 1, 512, False, mmproj=mmproj)
    on_gpu = fit(gguf, None, "Q8_0", 16 * GIB, 4096, 1, 512, True, mmproj=mmproj)
    assert (on_cpu.audio_weight_bytes, on_gpu.audio_weight_bytes) == (0, tower)
    assert on_gpu.plan.total_bytes - on_cpu.plan.total_bytes == tower + on_gpu.plan.head_bytes


@pytest.mark.parametrize("head_device", ["cpu", "cuda"])
def test_serve_and_fit_plan_with_the_same_inputs(tmp_path, monkeypatch, head_device):
    """The loader and `fit GGUF` take the GPU plan's inputs (the head, the vision tower and its largest image, the
    audio tower where the head runs) from one function, memory_plan.plan_inputs: the last three plan fixes were
    drift between two copies. What serve hands placement_for for the Clef-omni demo is what fit counts.
    (head_device cuda: the array module is numpy here, so only the plan's bookkeeping is cuda's.)"""
    from clef_bridge.bridge.demo.builtins import make_demo
    from clef_bridge.bridge.model import loading
    from clef_bridge.tools.fit import fit

    files = make_demo(tmp_path / "demo").omni
    spec = model_spec("omni", files.gguf, files.head, mmproj=files.mmproj, head_device=head_device,
                      n_ctx=4096, max_length=4096)
    report = loading.inspect_spec(spec)
    assert report.accepted, report

    class Planned(Exception):
        pass

    def placement_for(path, options, head_bytes, read=None, vision_bytes=0):
        raise Planned(head_bytes, vision_bytes)

    monkeypatch.setattr(loading, "array_module_for", lambda device: __import__("numpy"))
    monkeypatch.setattr(loading, "placement_for", placement_for)
    with pytest.raises(Planned) as served:
        loading.open_model(spec, report)
    fitted = fit(files.gguf, None, "Q8_0", 16 * GIB, 4096, 1, 512, head_device == "cuda", mmproj=files.mmproj)
    media = fitted.vision_weight_bytes + fitted.vision_compute_bytes + fitted.audio_weight_bytes
    assert served.value.args == (fitted.plan.head_bytes, media) == (fitted.plan.head_bytes, fitted.plan.vision_bytes)
    assert (fitted.audio_weight_bytes > 0) == (fitted.plan.head_bytes > 0) == (head_device == "cuda")


def test_fit_arch_with_a_projector_plans_it_as_serve_would(tmp_path):
    """`fit --arch clef-omni --mmproj FILE` plans the image compute for Clef-omni's largest image (1,024 tokens, as
    serve does for a qwen3vlmoe backbone; it counted Qwen3.5's 16,384 before) and, with the head on the GPU, the
    audio tower beside it (it counted none before: the GGUF path and the loader did)."""
    from clef_bridge.bridge.demo.builtins import make_demo
    from clef_bridge.bridge.gguf.projector import compute_bytes, projector_info
    from clef_bridge.tools.fit import fit

    mmproj = make_demo(tmp_path / "demo").omni.mmproj
    info = projector_info(mmproj)
    report = fit(None, "clef-omni", "Q4_K_M", 24 * GIB, 4096, 1, 512, True, mmproj=mmproj)
    assert report.vision_compute_bytes == compute_bytes(info, 1024) < compute_bytes(info, 16384)
    assert report.audio_weight_bytes == info.audio_float32_bytes > 0
    flash = fit(None, "clef-flash", "Q8_0", 24 * GIB, 4096, 1, 512, True, mmproj=mmproj)
    assert flash.vision_compute_bytes == compute_bytes(info, 16384)  # Qwen3.5's reference, as before
