"""The vision projector as a models.toml entry's file: found beside the GGUF or named by mmproj, checked
against the backbone by `check` (and refused at load), counted by `fit`, and loaded with the model."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
from clef_bridge.bridge.config.integrity import ModelRefused
from clef_bridge.bridge.config.memory_plan import MIB
from clef_bridge.bridge.config.provenance import MAX_STATE_DRIFT
from clef_bridge.bridge.config.registry import model_spec
from clef_bridge.bridge.gguf.projector import compute_bytes, projector_info
from clef_bridge.bridge.llama import log as llama_log
from clef_bridge.bridge.llama.backbone import Backbone, BackboneOptions
from clef_bridge.bridge.model.loading import load_checked
from clef_bridge.head.errors import RequestInvalid
from clef_bridge.tools.cli import main

from . import fixturegen_vision
from .deciding import respond
from .fixturegen_vision import data_url, encoded, picture
from .test_integrity import codes, run_check

pytestmark = pytest.mark.integration

REQUEST = {"model": "m", "state": "scan", "questions": {"q": {"type": "noul", "instructions": "Legible?"}}}


@pytest.fixture(scope="module")
def vfx():
    return fixturegen_vision.build()


@pytest.fixture
def vl_dir(vfx, tmp_path):
    """The tiny vision backbone with its head beside it, as a release folder would hold them."""
    (tmp_path / "model.gguf").symlink_to(vfx.gguf_f32)
    for name in ("joint_head.safetensors", "joint_head_config.json"):
        (tmp_path / name).symlink_to(vfx.head.with_name(name))
    return tmp_path


def fake_projector(path, projection_dim: int = 64, projector_type: str = "qwen3vl_merger"):
    """A projector GGUF's header as llama.cpp's converter writes it, with one small tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", projector_type)
    for key, value in (("projection_dim", projection_dim), ("patch_size", 16), ("embedding_length", 32),
                       ("feed_forward_length", 64), ("spatial_merge_size", 2)):
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_tensor("v.patch_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_projector_beside_the_gguf_is_found_checked_and_loaded(vl_dir, vfx, capsys):
    (vl_dir / "mmproj-tiny-F16.gguf").symlink_to(vfx.mmproj_f16)
    code, doc = run_check(capsys, vl_dir / "model.gguf")
    facts = doc["reports"][0]["facts"]
    assert code == 0 and facts["mmproj"] == str(vl_dir / "mmproj-tiny-F16.gguf")
    assert (facts["mmproj_type"], facts["mmproj_width"]) == ("qwen3vl_merger", 64)
    assert main(["check", str(vl_dir / "model.gguf")]) == 0
    assert "vision projector" in capsys.readouterr().out
    model = load_checked(model_spec("m", vl_dir / "model.gguf")).model
    try:
        assert model.projector is not None and model.projector.path == vl_dir / "mmproj-tiny-F16.gguf"
        with_image = respond(model, {**REQUEST, "images": [data_url(encoded(picture(256, 256), "PNG"))]})
        assert with_image["usage"]["input_tokens"] == respond(model, REQUEST)["usage"]["input_tokens"] + 64 + 3
    finally:
        model.close()


def test_text_only_entry_says_so_and_refuses_images(vl_dir, capsys):
    code, doc = run_check(capsys, vl_dir / "model.gguf")
    assert code == 0 and doc["reports"][0]["facts"]["mmproj"] is None
    main(["check", str(vl_dir / "model.gguf")])
    assert "no vision projector" in capsys.readouterr().out
    model = load_checked(model_spec("m", vl_dir / "model.gguf")).model
    try:
        with pytest.raises(RequestInvalid, match="no vision projector.*mmproj"):
            respond(model, {**REQUEST, "images": [data_url(encoded(picture(64, 64), "PNG"))]})
    finally:
        model.close()


def test_two_projectors_beside_need_a_name(vl_dir, vfx, capsys):
    (vl_dir / "mmproj-F16.gguf").symlink_to(vfx.mmproj_f16)
    (vl_dir / "mmproj-F32.gguf").symlink_to(vfx.mmproj_f32)
    code, doc = run_check(capsys, vl_dir / "model.gguf")
    assert code == 1 and codes(doc) == {"mmproj.ambiguous"}
    assert 'mmproj = "mmproj-F16.gguf"' in doc["reports"][0]["findings"][-1]["fix"]
    spec = model_spec("m", vl_dir / "model.gguf", mmproj="mmproj-F32.gguf", base=vl_dir)
    model = load_checked(spec).model
    assert model.projector.path == vl_dir / "mmproj-F32.gguf"
    model.close()


@pytest.mark.parametrize("make, code", [
    (lambda d, vfx: fake_projector(d / "p.gguf", projection_dim=32), "mmproj.pairing"),
    (lambda d, vfx: fake_projector(d / "p.gguf", projector_type="qwen2vl_merger"), "mmproj.pairing"),
    (lambda d, vfx: vfx.gguf_f32, "mmproj.invalid"),  # a backbone where the projector should be
    (lambda d, vfx: d / "absent.gguf", "mmproj.missing"),
], ids=["width 32", "Qwen2-VL merger", "not a projector", "no such file"])
def test_foreign_projectors_are_refused(vl_dir, vfx, make, code):
    spec = model_spec("m", vl_dir / "model.gguf", mmproj=make(vl_dir, vfx))
    with pytest.raises(ModelRefused) as info:
        load_checked(spec)
    assert [f.code for f in info.value.report.findings if f.level == "error"] == [code]
    assert code in str(info.value)


def test_fit_counts_the_projector(vl_dir, vfx, capsys):
    assert main(["fit", str(vl_dir / "model.gguf"), "--vram", "8GiB", "--json"]) == 0
    text_only = json.loads(capsys.readouterr().out)
    (vl_dir / "mmproj-tiny-F16.gguf").symlink_to(vfx.mmproj_f16)
    assert main(["fit", str(vl_dir / "model.gguf"), "--vram", "8GiB", "--json"]) == 0
    vision = json.loads(capsys.readouterr().out)
    info = projector_info(vfx.mmproj_f16)
    assert vision["vision_weight_bytes"] == info.weight_bytes and vision["vision_compute_bytes"] == compute_bytes(info)
    assert vision["vision_bytes"] == vision["vision_weight_bytes"] + vision["vision_compute_bytes"]
    assert vision["total_bytes"] - text_only["total_bytes"] == vision["vision_bytes"]
    assert text_only["vision_source"] is None and vision["vision_source"].endswith("mmproj-tiny-F16.gguf")
    assert main(["fit", str(vl_dir / "model.gguf"), "--vram", "8GiB", "--mmproj", str(vfx.mmproj_f32)]) == 0
    assert "vision projector" in capsys.readouterr().out


def test_compute_estimate_matches_llama_cpps_report(vfx):
    """llama.cpp reserves the vision compute buffer at its warm-up image size and reports it."""
    import ctypes

    import llama_cpp as lc
    from llama_cpp import mtmd_cpp as mt

    with Backbone(vfx.gguf_f32, BackboneOptions(n_ctx=256, n_seq_max=1)) as backbone:
        llama_log.install_mtmd(False)
        params = mt.mtmd_context_params_default()
        params.use_gpu, params.warmup, params.flash_attn_type = False, True, lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        with llama_log.capture() as lines:
            ctx = mt.mtmd_init_from_file(str(vfx.mmproj_f32).encode(), backbone.llama_model, params)
        mt.mtmd_free(ctx)
        assert ctypes.c_void_p(ctx).value
    text = "".join(lines)
    side = int(re.search(r"warmup with image size = (\d+) x \1", text).group(1))
    reported = float(re.search(r"CPU compute buffer size\s*=\s*([\d.]+) MiB", text).group(1)) * MIB
    ours = compute_bytes(projector_info(vfx.mmproj_f32), (side // 32) ** 2)
    print(f"warm-up {side}x{side}: llama.cpp {reported / MIB:.1f} MiB, estimate {ours / MIB:.1f} MiB")
    assert abs(ours - reported) <= 0.10 * reported


def perturbed(src, dst, seed: int = 0):
    """A copy of a projector GGUF whose tensor data (after the header) is partly overwritten with noise."""
    from clef_bridge.bridge.gguf.reader import read_gguf

    info = read_gguf(src)
    data = bytearray(src.read_bytes())
    start = info.data_start
    noise = np.random.default_rng(seed).normal(0, 0.05, (len(data) - start) // 8).astype(np.float32).tobytes()
    data[start:start + len(noise)] = noise
    dst.write_bytes(bytes(data))
    return dst


def test_pairing_record_carries_an_image_canary(vl_dir, vfx, capsys):
    (vl_dir / "mmproj-F32.gguf").symlink_to(vfx.mmproj_f32)
    assert main(["pair", str(vl_dir / "model.gguf")]) == 0
    capsys.readouterr()
    record = json.loads((vl_dir / "model.pair.json").read_text())
    assert len(record["image_canary"]["rows"]) == len(record["image_canary"]["tokens"]) > 0
    code, doc = run_check(capsys, vl_dir / "model.gguf")
    assert code == 0 and doc["reports"][0]["facts"]["image_canary_drift"] < 1e-5
    (vl_dir / "mmproj-F32.gguf").unlink()
    (vl_dir / "mmproj-F16.gguf").symlink_to(vfx.mmproj_f16)  # the same projector, quantized: accepted
    code, doc = run_check(capsys, vl_dir / "model.gguf")
    drift = doc["reports"][0]["facts"]["image_canary_drift"]
    print(f"image canary drift, f16 projector against the f32 record: {drift}", file=sys.stderr)
    assert code == 0 and doc["reports"][0]["facts"]["image_canary_drift"] < MAX_STATE_DRIFT / 10
    (vl_dir / "mmproj-F16.gguf").unlink()
    perturbed(vfx.mmproj_f32, vl_dir / "mmproj-F32.gguf")  # same type and width, other weights
    code, doc = run_check(capsys, vl_dir / "model.gguf")
    assert code == 1 and codes(doc) == {"mmproj.canary_mismatch"}, doc
    drift = doc["reports"][0]["facts"]["image_canary_drift"]
    print(f"image canary drift with another projector's weights: {drift}", file=sys.stderr)


def test_a_record_without_image_canary_says_so(vl_dir, vfx, capsys):
    assert main(["pair", str(vl_dir / "model.gguf")]) == 0  # text only: no image canary
    capsys.readouterr()
    assert "image_canary" not in json.loads((vl_dir / "model.pair.json").read_text())
    (vl_dir / "mmproj-F32.gguf").symlink_to(vfx.mmproj_f32)
    code, doc = run_check(capsys, vl_dir / "model.gguf")
    assert code == 0 and "mmproj.no_canary" in [f["code"] for f in doc["reports"][0]["findings"]]
