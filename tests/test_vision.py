"""Images through llama.cpp's projector against Cloudflare's reference: a tiny random Qwen3.5 with its
vision tower in transformers + the reference's encode_record/systemone and Qwen3.5's image processor,
versus the same weights as backbone + mmproj GGUFs through mtmd, our numpy head and bridge.images.

Three error sources, measured apart (f32 GGUFs, CPU; numbers from this machine):
- the backbone path (decoding image embeddings chunk by chunk at M-RoPE positions): the reference's
  own image embeddings through llama.cpp, ~1e-4 relative on the hidden states;
- llama.cpp's vision tower: ~4e-4 relative on the image embeddings (ggml's GELU reads an f16 table);
- the resizer: none, by construction: Pillow resizes exactly as the processor does (test_images), and
  llama.cpp then gets pixels at their final size. llama.cpp's own Qwen preprocessing (letterboxed,
  half-up rounding) would move the probabilities by 3e-3 to 7e-3: 200x this path's worst error.
"""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import numpy as np
import pytest
from clef_bridge.bridge.gguf.projector import ProjectorError, ProjectorInfo, pairing_problems, projector_info
from clef_bridge.bridge.llama.backbone import Backbone, BackboneOptions
from clef_bridge.bridge.llama.media_batch import MediaChunk
from clef_bridge.bridge.llama.vision import EncodedImage, Projector, ProjectorOptions, image_positions
from clef_bridge.bridge.media.images import ImageGeometry, decode, sniff
from clef_bridge.bridge.media.request import IMAGE, Media
from clef_bridge.head.encoder import PREFIX
from clef_bridge.head.errors import RequestInvalid

from . import fixturegen_vision
from .conftest import open_spec, tiny_spec
from .deciding import prepare, respond
from .fixturegen_vision import data_url, encoded, picture
from .reference import assert_same_answers

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

# Probabilities: measured worst over the cases below 1.9e-5 (f32 GGUFs, the f16 mmproj: see its test);
# 10x that leaves room for other CPUs' float order and stays far below what a defect does: another
# picture moves them by > 2e-2, image positions with rows and columns swapped by 3.8e-3.
TOLERANCE = 2e-4
HIDDEN_BACKBONE = 1e-3  # relative max error of the hidden states with the reference's image embeddings
EMBED_TOWER = 2e-3  # relative max error of mtmd's image embeddings (ggml's f16 GELU table: ~4e-4)
LOC = ("body", "images", 0)

REQUEST = {
    "model": "tiny", "state": "Receipt from the corner shop; is it legible?",
    "questions": {
        "legible": {"type": "noul", "instructions": "Is the receipt legible?"},
        "kind": {"type": "choice", "instructions": "What is in the picture?",
                 "criteria": {"receipt": "a shop receipt", "screenshot": "a screen", "photo": "a photograph",
                              "chart": None}},
        "quality": {"type": "score", "instructions": "Image quality", "criteria": ["bad", "fair", "good", "sharp"]},
    },
}
IMAGE_SETS = {  # name -> encoded images of one request
    "rgb-no-resize": [encoded(picture(320, 256), "PNG")],
    "rgb-upscaled": [encoded(picture(300, 200, seed=1), "PNG")],
    "rgba-rounded": [encoded(picture(700, 333, "RGBA", seed=2), "PNG")],
    "grey-jpeg": [encoded(picture(512, 288, "L", seed=3), "JPEG")],
    "webp-tall": [encoded(picture(200, 900, seed=4), "WEBP", quality=85)],
    "three-images": [encoded(picture(256, 256, seed=5), "PNG"), encoded(picture(640, 96, "LA", seed=6), "PNG"),
                     encoded(picture(333, 500, seed=7), "JPEG")],
}


@pytest.fixture(scope="module")
def vfx():
    return fixturegen_vision.build()


@pytest.fixture(scope="module")
def oracle(vfx):
    from clef_bridge.head.config import config_path_for, load_config
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    from .reference import reference

    ref = reference()
    tokenizer = AutoTokenizer.from_pretrained(vfx.base.tokenizer_dir)
    backbone = Qwen3_5ForConditionalGeneration.from_pretrained(vfx.hf_model, dtype=torch.float32).eval()
    head = ref.JointSchemaHead(**vars(load_config(config_path_for(vfx.head))))
    head.load_state_dict(load_file(str(vfx.head)), strict=True)
    model = ref.ClefModel(backbone, head.float()).eval()
    return SimpleNamespace(ref=ref, model=model, processor=fixturegen_vision.reference_processor(tokenizer))


@pytest.fixture(scope="module")
def clef(vfx):
    """The tiny vision model loaded the one checked way, its projector named by mmproj in its entry."""
    model = open_spec(tiny_spec(vfx.base, gguf=vfx.gguf_f32, head=vfx.head, mmproj=vfx.mmproj_f32))
    yield SimpleNamespace(model=model, projector=model.projector)
    model.close()


def with_images(request, images):
    return dict(request, images=[data_url(d) for d in images])


def reference_run(oracle, request):
    """The reference's encoding and per-question probabilities (unrounded), images as data URLs."""
    ref = oracle.ref
    encoded_record = ref.encode_record(oracle.processor.tokenizer, request, max_length=8192, processor=oracle.processor)
    with torch.inference_mode():
        batch = ref.collate_records([encoded_record], oracle.processor.tokenizer.pad_token_id, torch.device("cpu"))
        logits = oracle.model(batch)[0]
    return encoded_record, [q.float().softmax(-1).numpy() for q in logits]


def layout_with_images(model, request, counts: list[int], pad: int):
    """Our text-only encoding with the reference's media tokens spliced in after `STATE:\\n`: per image
    <|vision_start|>, one <|image_pad|> per image token, <|vision_end|>; then one "\\n" after them all.
    This is the layout the encoder must produce for image requests."""
    enc = prepare(model, request).encoded
    tokenize = model.backbone.tokenize
    media = [t for n in counts for t in tokenize("<|vision_start|>", True) + [pad] * n
             + tokenize("<|vision_end|>", True)] + tokenize("\n", True)
    at = len(tokenize(PREFIX, True))
    ids = np.concatenate([enc.input_ids[:at], np.asarray(media, np.int32), enc.input_ids[at:]])
    shifted = dataclasses.replace(enc.layout, question_spans=enc.layout.question_spans + len(media),
                                  option_spans=enc.layout.option_spans + len(media))
    return dataclasses.replace(enc, input_ids=ids, layout=shifted)


def our_run(clef, request, images, chunks=None):
    """The pipeline's own path (ClefModel.prepare with pixels, prefill_batch); chunks: other positions."""
    pixels = [decode(d, sniff(d, LOC), LOC, clef.projector.geometry) for d in images]
    prepared = prepare(clef.model, request, Media({IMAGE: tuple(pixels)}))
    enc = prepared.encoded
    if chunks is None and clef.projector is clef.model.projector:
        [item] = clef.model.prefill_batch([prepared])
        hidden = item.hidden
    else:  # another projector, or other positions
        pieces = clef.projector.pieces(enc.input_ids, [clef.projector.encode(p) for p in pixels])
        hidden = clef.model.backbone.decode_media((chunks or clef.projector.chunks)(pieces))
    return enc, probabilities(enc, clef.model.logits(enc, hidden))


def probabilities(enc, logits):
    """Softmax within each question."""
    bounds = list(enc.layout.option_offsets) + [len(logits)]
    z = [np.exp(logits[s:e] - logits[s:e].max()) for s, e in zip(bounds, bounds[1:])]
    return [p / p.sum() for p in z]


def max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", IMAGE_SETS)
def test_systemone_with_images_matches_reference(oracle, clef, name):
    images = IMAGE_SETS[name]
    request = with_images(REQUEST, images)
    ref_encoded, ref_probs = reference_run(oracle, request)
    ours, probs = our_run(clef, REQUEST, images)

    assert ours.input_ids.tolist() == list(ref_encoded.input_ids)  # image tokens counted and placed alike
    pads = np.flatnonzero(ours.input_ids == clef.projector.image_pad)
    counts = [len(run) for run in np.split(pads, np.flatnonzero(np.diff(pads) != 1) + 1)]
    assert layout_with_images(clef.model, REQUEST, counts, clef.projector.image_pad).input_ids.tolist() == \
        ours.input_ids.tolist()  # the encoder writes the layout the reference's processor makes
    assert ours.layout.question_spans.tolist() == [list(q.question_span) for q in ref_encoded.questions]
    assert ours.layout.option_spans.tolist() == [list(s) for q in ref_encoded.questions for s in q.option_spans]
    worst = max_diff(probs, ref_probs)
    print(f"{name}: {len(ours.input_ids)} tokens, max |prob diff| vs the reference = {worst:.2e}")
    assert worst <= TOLERANCE


def test_reference_systemone_counts_image_tokens(oracle, clef):
    images = IMAGE_SETS["three-images"]
    ours, probs = our_run(clef, REQUEST, images)
    expected = oracle.ref.systemone(oracle.model, oracle.processor, with_images(REQUEST, images), max_length=8192)
    assert expected["usage"] == {"input_tokens": len(ours.input_ids), "output_tokens": 0}
    # 256x256: 8x8 tokens; 640x96 scaled up to 672x128: 21x4; 333x500 rounded to 320x512: 10x16;
    # <|vision_start|> and <|vision_end|> per image, one "\n" after them all
    assert len(ours.input_ids) - len(prepare(clef.model, REQUEST).encoded.input_ids) == 64 + 84 + 160 + 3 * 2 + 1
    assert abs(expected["answers"]["legible"]["noul"] - probs[0][0]) <= TOLERANCE + 5e-5  # + its rounding
    got = respond(clef.model, with_images(REQUEST, images))  # the served path: every field of every answer
    assert got["usage"] == expected["usage"]
    assert_same_answers(got["answers"], expected["answers"], TOLERANCE)


def test_the_tolerance_sees_defects(oracle, clef):
    images = IMAGE_SETS["rgba-rounded"]
    _, ref_probs = reference_run(oracle, with_images(REQUEST, images))
    _, other = reference_run(oracle, with_images(REQUEST, IMAGE_SETS["rgb-no-resize"]))
    assert max_diff(other, ref_probs) > 10 * TOLERANCE  # the answers depend on the picture

    def swapped(pieces):  # rows and columns exchanged: a transposed M-RoPE grid
        out = clef.projector.chunks(pieces)
        return [dataclasses.replace(c, pos=c.pos[[0, 2, 1, 3]]) if c.embd is not None else c for c in out]

    _, wrong = our_run(clef, REQUEST, images, chunks=swapped)
    print(f"transposed positions: max |prob diff| = {max_diff(wrong, ref_probs):.2e}")
    assert max_diff(wrong, ref_probs) > 10 * TOLERANCE


def reference_hidden(oracle, request):
    ref = oracle.ref
    record = ref.encode_record(oracle.processor.tokenizer, request, max_length=8192, processor=oracle.processor)
    batch = ref.collate_records([record], oracle.processor.tokenizer.pad_token_id, torch.device("cpu"))
    text_model = oracle.model.language_model.model
    with torch.inference_mode():
        media = batch["media"]
        out = text_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False,
                         **media)
        embd = text_model.get_image_features(media["pixel_values"], media["image_grid_thw"]).pooler_output
    return out.last_hidden_state[0].numpy(), [e.numpy() for e in embd]


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_error_sources_apart(oracle, clef):
    """Identical pixels (no resizing anywhere): the backbone path alone, then the vision tower."""
    images = IMAGE_SETS["three-images"][:1] + [encoded(picture(512, 384, seed=9), "PNG")]
    hidden, ref_embd = reference_hidden(oracle, with_images(REQUEST, images))
    pixels = [decode(d, sniff(d, LOC), LOC) for d in images]
    assert [p.shape[:2] for p in pixels] == [(256, 256), (384, 512)]  # no resize on either side
    ours = [clef.projector.encode(p) for p in pixels]
    tower = max(rel(o.embd, r) for o, r in zip(ours, ref_embd, strict=True))

    enc = layout_with_images(clef.model, REQUEST, [o.n_tokens for o in ours], clef.projector.image_pad)
    given = [EncodedImage(r, o.rows, o.cols) for o, r in zip(ours, ref_embd)]  # the reference's embeddings
    backbone = rel(clef.projector.prefill(enc.input_ids, given), hidden)
    full = rel(clef.projector.prefill(enc.input_ids, ours), hidden)
    print(f"relative max error: backbone path {backbone:.1e}, vision tower {tower:.1e}, both {full:.1e}")
    assert backbone <= HIDDEN_BACKBONE
    assert tower <= EMBED_TOWER
    assert full <= HIDDEN_BACKBONE + EMBED_TOWER


def test_projector_metadata_and_pairing(vfx):
    info = projector_info(vfx.mmproj_f32)
    assert info == ProjectorInfo("qwen3vl_merger", 64, 16, 2, False, info.weight_bytes, width=32, feedforward=64)
    assert 0.9 < info.weight_bytes / vfx.mmproj_f32.stat().st_size <= 1
    f16 = projector_info(vfx.mmproj_f16)
    assert f16.n_embd == 64 and f16.weight_bytes < 0.7 * info.weight_bytes
    assert pairing_problems(info, 64) == []
    assert "backbone width 4096" in pairing_problems(info, 4096)[0]
    assert "deepstack" in pairing_problems(dataclasses.replace(info, deepstack=True), 64)[0]
    assert "qwen2vl_merger" in pairing_problems(dataclasses.replace(info, projector_type="qwen2vl_merger"), 64)[0]
    with pytest.raises(ProjectorError, match="not a vision projector"):
        projector_info(vfx.gguf_f32)


def test_f16_projector_within_tolerance(oracle, clef, vfx):
    with Projector(vfx.mmproj_f16, clef.model.backbone) as f16:
        images = IMAGE_SETS["three-images"]
        _, ref_probs = reference_run(oracle, with_images(REQUEST, images))
        _, probs = our_run(SimpleNamespace(model=clef.model, projector=f16), REQUEST, images)
    print(f"f16 mmproj: max |prob diff| vs the reference = {max_diff(probs, ref_probs):.2e}")
    assert max_diff(probs, ref_probs) <= TOLERANCE


def test_image_token_limits_follow_the_processor(oracle, clef, vfx):
    """Fewer tokens per image (a smaller max_pixels on both sides) makes both downscale alike."""
    small = ProjectorOptions(min_tokens=64, max_tokens=128)
    size = {"size": {"shortest_edge": 64 * 1024, "longest_edge": 128 * 1024}}
    processor = fixturegen_vision.reference_processor(oracle.processor.tokenizer, **size)
    images = [encoded(picture(1000, 700, seed=11), "PNG")]
    request = with_images(REQUEST, images)
    _, ref_probs = reference_run(SimpleNamespace(ref=oracle.ref, model=oracle.model, processor=processor), request)
    with Projector(vfx.mmproj_f32, clef.model.backbone, small) as projector:
        assert projector.geometry == ImageGeometry(32, 64 * 1024, 128 * 1024)
        ours, probs = our_run(SimpleNamespace(model=clef.model, projector=projector), REQUEST, images)
    assert sum(ours.input_ids == clef.projector.image_pad) <= 128
    assert max_diff(probs, ref_probs) <= TOLERANCE


def test_positions_are_mtmds(clef):
    pos = image_positions(2, 3, 10)
    assert pos.tolist() == [[10] * 6, [10, 10, 10, 11, 11, 11], [10, 11, 12, 10, 11, 12], [0] * 6]
    image = EncodedImage(np.zeros((6, 64), np.float32), 2, 3)
    start, end = (clef.model.backbone.tokenize(t, True) for t in ("<|vision_start|>", "<|vision_end|>"))
    chunks = clef.projector.chunks([np.array([1, 2] + start, np.int32), image, np.array(end + [5], np.int32)])
    assert [c.pos.tolist() for c in chunks if c.tokens is not None] == [[0, 1, 2], [6, 7]]  # 3 + max(2, 3)
    assert chunks[1].pos.tolist() == image_positions(2, 3, 3).tolist()
    with pytest.raises(ValueError, match="must follow"):
        clef.projector.chunks([np.array([1, 2], np.int32), image, np.array(end, np.int32)])


def test_stray_image_pad_in_text_is_a_request_error(clef):
    pad = clef.projector.image_pad
    image = EncodedImage(np.zeros((4, 64), np.float32), 2, 2)
    with pytest.raises(RequestInvalid, match="no image's"):
        clef.projector.pieces(np.array([1, pad, 2, pad, pad, pad, pad, 3], np.int32), [image])


def test_a_chunk_longer_than_a_ubatch(clef):
    """1,024 image tokens span two llama.cpp ubatches of 512; every row comes back, and matches one pass."""
    pixels = decode(encoded(picture(1024, 1024, seed=12), "PNG"), sniff(encoded(picture(1024, 1024, seed=12), "PNG"),
                                                                           LOC), LOC)
    image = clef.projector.encode(pixels)
    assert image.n_tokens == 1024
    start, end = (clef.model.backbone.tokenize(t, True) for t in ("<|vision_start|>", "<|vision_end|>"))
    pieces = [np.array(start, np.int32), image, np.array(end + [11], np.int32)]
    hidden = clef.model.backbone.decode_media(clef.projector.chunks(pieces))
    assert hidden.shape == (1027, 64) and np.isfinite(hidden).all()
    split = clef.projector.chunks(pieces)
    halves = [split[0], MediaChunk(split[1].pos[:, :512], embd=image.embd[:512]),
              MediaChunk(split[1].pos[:, 512:], embd=image.embd[512:]), split[2]]
    assert rel(clef.model.backbone.decode_media(halves), hidden) < 1e-5


def test_backbone_context_is_checked(vfx):
    with Backbone(vfx.gguf_f32, BackboneOptions(n_ctx=256, n_seq_max=1)) as small:
        with pytest.raises(ValueError, match="do not fit"):
            small.decode_media([MediaChunk(np.arange(300, dtype=np.int32), tokens=np.ones(300, np.int32))])


def mtmd_own_preprocessing(backbone, mmproj, rgb: np.ndarray, encode: bool):
    """llama.cpp's own path: the decoded picture at its original size, sized and resized by mtmd."""
    import ctypes

    from llama_cpp import mtmd_cpp as mt

    params = mt.mtmd_context_params_default()
    params.use_gpu, params.warmup, params.image_min_tokens, params.image_max_tokens = False, False, 64, 16384
    ctx = mt.mtmd_init_from_file(str(mmproj).encode(), backbone.llama_model, params)
    rgb = np.ascontiguousarray(rgb)
    bitmap = mt.mtmd_bitmap_init(rgb.shape[1], rgb.shape[0], rgb.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
    chunks = mt.mtmd_input_chunks_init()
    try:
        part = mt.mtmd_input_part(None, bitmap)
        assert mt.mtmd_tokenize_from_parts(ctx, chunks, (ctypes.POINTER(mt.mtmd_input_part) * 1)(
            ctypes.pointer(part)), 1, False) == 0
        chunk = mt.mtmd_input_chunks_get(chunks, 1)
        n = mt.mtmd_input_chunk_get_n_tokens(chunk)
        if not encode:
            return n
        assert mt.mtmd_encode_chunk(ctx, chunk) == 0
        out = np.empty((n, backbone.n_embd), np.float32)
        ctypes.memmove(out.ctypes.data, mt.mtmd_get_output_embd(ctx), out.nbytes)
        return out
    finally:
        mt.mtmd_input_chunks_free(chunks)
        mt.mtmd_bitmap_free(bitmap)
        mt.mtmd_free(ctx)


def test_llama_cpps_own_preprocessing_is_not_the_references(oracle, clef, vfx):
    """Why Pillow resizes: mtmd letterboxes Qwen images (aspect kept, black bars, centred) where the
    processor stretches to the rounded grid, and rounds x.5 up where Python rounds half to even."""
    original = ImageGeometry(1, 1, 1 << 40)  # decode only

    def both(data):
        return (decode(data, sniff(data, LOC), LOC, original),
                clef.projector.encode(decode(data, sniff(data, LOC), LOC, clef.projector.geometry)))

    rgb, ours = both(encoded(picture(320, 256, seed=13), "PNG"))  # no resizing: the same embeddings
    assert np.array_equal(mtmd_own_preprocessing(clef.model.backbone, vfx.mmproj_f32, rgb, True), ours.embd)
    for name in ("rgb-upscaled", "rgba-rounded", "webp-tall"):
        images = IMAGE_SETS[name]
        rgb, ours = both(images[0])
        theirs = mtmd_own_preprocessing(clef.model.backbone, vfx.mmproj_f32, rgb, True)
        assert theirs.shape == ours.embd.shape and rel(theirs, ours.embd) > 0.1
        enc = layout_with_images(clef.model, REQUEST, [ours.n_tokens], clef.projector.image_pad)
        hidden = clef.projector.prefill(enc.input_ids, [dataclasses.replace(ours, embd=theirs)])
        probs = probabilities(enc, clef.model.logits(enc, hidden))
        _, ref_probs = reference_run(oracle, with_images(REQUEST, images))
        print(f"{name} through llama.cpp's own resizing: max |prob diff| vs the reference = "
              f"{max_diff(probs, ref_probs):.2e}")
        assert max_diff(probs, ref_probs) > TOLERANCE
    rgb = decode(encoded(picture(2000, 1500), "PNG"), sniff(encoded(picture(2000, 1500), "PNG"), LOC), LOC, original)
    assert clef.projector.geometry.tokens(2000, 1500) == 47 * 62  # round(62.5) == 62 in Python
    assert mtmd_own_preprocessing(clef.model.backbone, vfx.mmproj_f32, rgb, False) == 47 * 63


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_memory_is_flat_over_200_image_decodes(clef):
    """Pillow decoding, the vision tower and the chunked prefill, 200 times over 4 picture shapes."""
    start, end = (clef.model.backbone.tokenize(t, True) for t in ("<|vision_start|>", "<|vision_end|>"))
    assets = [encoded(picture(w, h, mode, seed=i), fmt) for i, (w, h, mode, fmt) in enumerate(
        [(320, 256, "RGB", "PNG"), (300, 200, "RGBA", "PNG"), (500, 333, "L", "JPEG"), (256, 400, "RGB", "WEBP")])]
    samples = []
    for i in range(200):
        data = assets[i % len(assets)]
        image = clef.projector.encode(decode(data, sniff(data, LOC), LOC, clef.projector.geometry))
        hidden = clef.projector.prefill(np.array([1, 2] + start + [clef.projector.image_pad] * image.n_tokens + end,
                                                 np.int32), [image])
        assert hidden.shape == (image.n_tokens + 4, 64)
        if i in (39, 199):
            samples.append(rss_mib())
    print(f"RSS after 40 decodes {samples[0]:.1f} MiB, after 200 {samples[1]:.1f} MiB")
    assert samples[1] - samples[0] < 2  # one leaked hidden-state array per decode would add 3.5 MiB
