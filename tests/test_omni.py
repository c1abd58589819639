"""Clef-omni against Cloudflare's clef-omni reference: a tiny random Qwen3-Omni (transformers) with the reference's
encode_record/systemone and Qwen3-Omni's processor, versus the same weights through llama.cpp's converter, served
by ClefModel (qwen3vlmoe backbone, mtmd's vision tower on the projector's vision half, our numpy audio tower).

Tolerances, max |dp| over every option of every question (the issue's bars): 2e-3 text, 5e-3 with images, 1e-2
with audio. Measured here (F32 KV cache, CPU): text 7e-8, images 1.2e-5 (llama.cpp's vision tower: hidden states
4e-4 relative), audio 1e-7 (our tower is the reference's arithmetic: rel 4e-7). These tests load the backbone with
an F32 KV cache: with llama.cpp's default F16 cache a single token's top-2-of-8 expert choice can flip on a near-tie
(the lab saw it on the 0.5 s clip: one token 2.7e-2 off, dp still 2.6e-4), so F32 makes the bars measure our path
rather than the cache's rounding; tests/test_omni_serving.py serves the default F16 cache, as a user would.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from clef_bridge.bridge.config.registry import model_spec
from clef_bridge.bridge.gguf.projector import ensure_vision_projector, pairing_problems, projector_info
from clef_bridge.bridge.gguf.reader import read_gguf
from clef_bridge.bridge.llama.backbone import BackboneOptions
from clef_bridge.bridge.llama.omni import OmniBackbone
from clef_bridge.bridge.media.audio_tower import AudioTower, audio_tokens
from clef_bridge.bridge.media.images import decode, sniff
from clef_bridge.bridge.media.request import AUDIO, IMAGE, Media, refuse_unsupported
from clef_bridge.bridge.model.loading import load_checked, reference_spec
from clef_bridge.head.answer import systemone_answers
from clef_bridge.head.errors import RequestInvalid

from . import fixturegen_omni, fixturegen_vision
from .deciding import prepare, score_batch, systemone
from .omni_cases import answer_probabilities, answer_problems, cases, max_dp, probabilities, tone

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

TOLERANCE = {"text": 2e-3, "image": 5e-3, "audio": 1e-2}
CASES = cases()
LOC = ("body", "images", 0)


def open_omni(ofx, cache, **keys):
    """The tiny Clef-omni loaded the one checked way (the vision half of its projector written into `cache`)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLEF_BRIDGE_CACHE", str(cache))
        return load_checked(model_spec("omni", ofx.gguf_f32, ofx.head, **keys)).model


@pytest.fixture(scope="module")
def omni(ofx, tmp_path_factory):
    model = open_omni(ofx, tmp_path_factory.mktemp("cache"), mmproj=ofx.mmproj_f32, kv_type="f32")
    yield model
    model.close()


def ours(model, case):
    """Prepare, prefill and decide one case through the model; (prepared, prefilled, decision)."""
    pixels = [decode(p, sniff(p, LOC), LOC, model.geometry) for p in case.images]
    prepared = prepare(model, case.body, Media({IMAGE: tuple(pixels), AUDIO: tuple(case.audio)}))
    item = model.prefill_batch([prepared])[0]
    return prepared, item, model.score([model.head_input(item)])[0]


@pytest.mark.parametrize("name", list(CASES))
def test_answers_equal_the_reference(omni, omni_oracle, name):
    case = CASES[name]
    ref = omni_oracle.run(dict(case.body, images=[fixturegen_vision.data_url(p) for p in case.images],
                          audio=list(case.audio)))
    prepared, item, decision = ours(omni, case)
    assert prepared.encoded.input_ids.tolist() == ref.input_ids  # so usage.input_tokens is equal too
    response = systemone(decision, case.body)
    assert response["usage"] == ref.answer["usage"] == {"input_tokens": len(ref.input_ids), "output_tokens": 0}
    tol = TOLERANCE[case.medium]
    dp = max_dp(probabilities(omni, prepared, item.hidden), ref.probabilities)
    print(f"{name}: {len(ref.input_ids)} tokens, max |dp| {dp:.2e} (tolerance {tol:g})")
    assert dp <= tol
    assert answer_problems(response["answers"], ref.answer["answers"], ref.probabilities, tol) == []
    assert response["model"] == ref.answer["model"]


def test_hidden_states_of_each_medium(omni, omni_oracle):
    """Tighter than the answers: the final-norm states themselves, relative to their largest value. Text and audio
    are the reference's arithmetic (measured 4.5e-7); images carry llama.cpp's vision tower (measured 4.0e-4)."""
    for name, bound in (("text", 1e-5), ("audio_1.7", 1e-5), ("image", 2e-3)):
        case = CASES[name]
        ref = omni_oracle.run(dict(case.body, images=[fixturegen_vision.data_url(p) for p in case.images],
                              audio=list(case.audio)))
        _, item, _ = ours(omni, case)  # a text request may start from the prefix cache: its rows after `reused`
        assert np.abs(item.hidden - ref.hidden[item.reused:]).max() / np.abs(ref.hidden).max() < bound, name


def test_the_bars_see_a_broken_medium(omni, omni_oracle):
    """The hidden-state bars catch what a wrong deepstack count or misplaced audio rows do (the tiny random head's
    near-uniform probabilities alone would understate them)."""
    from clef_bridge.bridge.llama.vision import EncodedAudio, EncodedImage

    case = CASES["image_audio"]
    ref = omni_oracle.run(dict(case.body, images=[fixturegen_vision.data_url(p) for p in case.images],
                          audio=list(case.audio)))
    pixels = [decode(p, sniff(p, LOC), LOC, omni.geometry) for p in case.images]
    prepared = prepare(omni, case.body, Media({IMAGE: tuple(pixels), AUDIO: tuple(case.audio)}))
    images = [omni.projector.encode(p) for p in prepared.media.images]
    clips = [EncodedAudio(r) for r in omni.audio_tower.encode(prepared.media.audio)]
    ids = prepared.encoded.input_ids

    def rel(images, clips):
        hidden = omni.projector.prefill(ids, images, clips)
        return np.abs(hidden - ref.hidden).max() / np.abs(ref.hidden).max()

    assert rel(images, clips) < 2e-3
    no_deepstack = [EncodedImage(np.concatenate([i.embd[:, :64], 0 * i.embd[:, 64:]], 1), i.rows, i.cols)
                    for i in images]
    assert rel(no_deepstack, clips) > 2e-2
    assert rel(images, [EncodedAudio(c.embd[::-1].copy()) for c in clips]) > 2e-2


def test_media_and_limits_of_the_served_model(omni):
    assert omni.media == ("image", "audio", "video") and omni.takes_audio  # its vocabulary has <|video_pad|>
    assert omni.encode_options.media_layout == "omni" and omni.encode_options.max_length == 64000
    assert omni.backbone.options.n_ctx == 64000 and omni.backbone.deepstack == 2
    assert omni.backbone.n_embd_inp == 64 * 3 and omni.geometry.max_pixels == 1024 * 32 * 32
    # a clip too short to frame is refused while decoding, at its place (tests/test_audio.py); one handed to
    # prepare() directly is named as the caller's bug
    with pytest.raises(ValueError, match="an audio item of 200 samples .* under 201"):
        prepare(omni, CASES["text"].body, Media({AUDIO: (tone(0.5, 1), np.zeros(200, np.float32))}))


def test_a_model_without_audio_refuses_audio(ofx, tmp_path, tiny_model):
    with pytest.raises(RequestInvalid) as info:
        refuse_unsupported((AUDIO,), tiny_model.media, tiny_model.name)
    assert info.value.problems[0].type == "audio_not_supported" and tiny_model.media == ()
    # Clef-omni with the vision half alone as its projector: images, no audio
    vision, _ = ensure_vision_projector(ofx.mmproj_f32, tmp_path / "split")
    model = open_omni(ofx, tmp_path / "cache", mmproj=vision)
    try:
        assert model.media == ("image",) and model.backbone.deepstack == 2
        with pytest.raises(RequestInvalid, match="takes no audio"):
            refuse_unsupported((AUDIO,), model.media, model.name)
    finally:
        model.close()


def test_text_alone_needs_no_projector(ofx, omni_oracle, tmp_path):
    """Without a projector the thinker loads with no deepstack levels; text answers are the same."""
    model = open_omni(ofx, tmp_path, kv_type="f32")
    try:
        assert model.projector is None and model.media == () and model.backbone.deepstack == 0
        assert model.backbone.n_embd_inp == 64
        ref = omni_oracle.run(CASES["text"].body)
        prepared, item, _ = ours(model, CASES["text"])
        assert max_dp(probabilities(model, prepared, item.hidden), ref.probabilities) < 1e-5
    finally:
        model.close()


# --- the pieces -----------------------------------------------------------------------------------

def test_the_fixture_tokenizer_keeps_omnis_ids(ofx, tmp_path):
    """The pitfall of the report: a gap in the added tokens renumbers them on save, and the reference then runs
    audio requests without their audio. The fixture fills every slot; a gapped one is caught."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ofx.hf_model)
    fixturegen_omni.check_added_ids(tokenizer)
    assert tokenizer.convert_tokens_to_ids("<|audio_pad|>") == 151675
    gapped = {i: t for i, t in fixturegen_omni.OMNI_ADDED.items() if not 151657 <= i <= 151666}
    fast = fixturegen_omni.fixturegen.qwen35_tokenizer(
        ofx.root / "sdist" / fixturegen_omni.fixturegen.VENDOR / "models" / "ggml-vocab-qwen2.gguf", gapped,
        split=fixturegen_omni.QWEN2_SPLIT)
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=fast).save_pretrained(tmp_path)
    with pytest.raises(fixturegen_omni.TokenizerPitfall, match="audio"):
        fixturegen_omni.check_added_ids(AutoTokenizer.from_pretrained(tmp_path))


def test_projector_info_and_pairing(ofx):
    info = projector_info(ofx.mmproj_f32)
    assert info.combined and info.audio_type == "qwen3a" and info.audio_width == 64
    assert info.projector_type == "qwen3vl_merger" and info.deepstack and info.deepstack_layers == 2
    gguf = read_gguf(ofx.mmproj_f32)
    audio = sum(t.n_bytes for t in gguf.tensors.values() if t.name.startswith(("a.", "mm.a.")))
    assert info.audio_bytes == audio and info.weight_bytes + audio == sum(t.n_bytes for t in gguf.tensors.values())
    assert pairing_problems(info, 64, "qwen3vlmoe") == []
    qwen35 = " ".join(pairing_problems(info, 64, "qwen35"))
    assert "without deepstack" in qwen35 and "audio encoder" in qwen35
    assert "backbone width 2048" in pairing_problems(info, 2048, "qwen3vlmoe")[0]
    assert "audio projector type" in pairing_problems(dataclasses.replace(info, audio_type="whisper"), 64,
                                                      "qwen3vlmoe")[0]
    plain = projector_info(fixturegen_vision.build().mmproj_f32)  # Qwen3.5's: no deepstack, no audio
    assert "needs Qwen3-Omni's" in pairing_problems(plain, 64, "qwen3vlmoe")[0]


def test_the_vision_half_is_written_once(ofx, tmp_path):
    src = tmp_path / "mmproj.gguf"
    src.write_bytes(ofx.mmproj_f32.read_bytes())
    path, done = ensure_vision_projector(src, tmp_path / "cache")
    assert done.action == "converted" and done.bytes == path.stat().st_size
    print(f"vision half of a {src.stat().st_size / 1e6:.2f} MB projector: {done.bytes / 1e6:.2f} MB in "
          f"{done.seconds * 1e3:.0f} ms")
    assert ensure_vision_projector(src, tmp_path / "cache")[1].action == "reused"
    whole, half = read_gguf(src), read_gguf(path)
    assert half.metadata["clip.projector_type"] == "qwen3vl_merger" and half.metadata["clip.has_audio_encoder"] is False
    assert not [k for k in half.metadata if k.startswith("clip.audio.") or k == "clip.vision.projector_type"]
    names = [n for n in whole.tensors if not n.startswith(("a.", "mm.a."))]
    assert list(half.tensors) == names
    for n in names:  # copied byte for byte, types kept
        a, b = whole.tensors[n], half.tensors[n]
        assert (a.type, a.shape) == (b.type, b.shape)
        raw = lambda info, t: np.fromfile(info.path, np.uint8, t.n_bytes, offset=info.data_start + t.offset)  # noqa
        assert np.array_equal(raw(whole, a), raw(half, b))
    os.utime(src, ns=(1, 1))  # the source changed: written again, the old one removed
    again, done = ensure_vision_projector(src, tmp_path / "cache")
    assert done.action == "converted" and done.superseded == (path,) and not path.exists() and again.exists()


def test_deepstack_and_chunking_leave_text_states_alone(ofx, omni):
    """Text tokens' embeddings are zero-padded to n_embd_inp, so the deepstack count does not move them; nor do
    decodes cut into chunks of n_ubatch tokens, every token an output, lm_head skipped in each."""
    ids = prepare(omni, CASES["text_long"].body).encoded.input_ids
    whole = omni.backbone.prefill(ids)
    for deepstack, chunk in ((0, 512), (2, 100)):
        with OmniBackbone(ofx.gguf_f32, BackboneOptions(n_ctx=2048, n_ubatch=chunk, kv_type="f32"),
                          deepstack=deepstack) as bb:
            assert bb.n_embd_inp == 64 * (1 + deepstack)
            hidden = bb.prefill(ids)
            assert bb.lm_head_skips == -(-len(ids) // chunk)
            assert np.abs(hidden - whole).max() / np.abs(whole).max() < 1e-5


def test_lm_head_skipped_or_not_gives_the_same_states(ofx):
    ids = np.random.default_rng(0).integers(0, 150000, 300).astype(np.int32)
    options = BackboneOptions(n_ctx=1024, n_ubatch=128, kv_type="f32")
    with OmniBackbone(ofx.gguf_f32, options) as skip, OmniBackbone(ofx.gguf_f32, options, skip_lm_head=False) as run:
        a, b = skip.prefill(ids), run.prefill(ids)
        assert skip.lm_head_skips == 3 and run.lm_head_skips == 0
        assert np.array_equal(a, b)


def test_a_graph_without_the_final_norm_fails_loudly(ofx, monkeypatch):
    """Should a llama.cpp build name the final norm otherwise, decodes fail; they never return stale rows."""
    from clef_bridge.bridge.llama import omni as omni_module
    from clef_bridge.bridge.llama.backbone import DecodeFailed

    with OmniBackbone(ofx.gguf_f32, BackboneOptions(n_ctx=512, n_ubatch=64)) as bb:
        ids = np.arange(100, 200, dtype=np.int32)
        assert np.isfinite(bb.prefill(ids)).all()
        monkeypatch.setattr(omni_module, "FINAL_NORM", b"no_such_node")
        with pytest.raises(DecodeFailed, match="0 final-norm rows for 100 tokens"):
            bb.prefill(ids)


def test_the_prefix_cache_reuses_omni_prefixes(ofx, omni, tmp_path):
    """qwen3vlmoe keeps KV cells only: a checkpoint holds no state, a hit shares the cells; answers stay put."""
    model = open_omni(ofx, tmp_path, kv_type="f32", prefix_cache_every=64)
    try:
        cache = model.backbone.prefix_cache
        assert cache is not None and model.backbone.save_state(0).nbytes == 0
        body = CASES["text_long"].body
        first = score_batch(model, [prepare(model, body)])[0]
        second = score_batch(model, [prepare(model, body)])[0]
        grown = dict(body, state={**body["state"], "more": "and the status page says all green"})
        third = score_batch(model, [prepare(model, grown)])[0]
        stats = cache.stats()
        assert stats.hits == 2 and second.timings.reused_tokens > 100 and third.timings.reused_tokens > 100
        assert stats.bytes > 0 and stats.cells > 0  # the head's memory rows and the cached KV cells
        for got, request in ((first, body), (second, body), (third, grown)):
            want = systemone_answers(score_batch(omni, [prepare(omni, request)])[0].answers)  # no prefix cache
            assert answer_problems(systemone_answers(got.answers), want, answer_probabilities(want), 1e-4) == []
    finally:
        model.close()


def test_omni_defaults_yield_to_the_entry(ofx):
    def spec(**keys):
        return reference_spec(model_spec("o", ofx.gguf_f32, ofx.head, **keys), "omni")

    plain = spec()
    assert (plain.backbone.n_ctx, plain.encode.max_length, plain.encode.media_layout) == (64000, 64000, "omni")
    assert (spec(n_ctx=32768).backbone.n_ctx, spec(n_ctx=32768).encode.max_length) == (32768, 32768)
    assert (spec(max_length=4096).backbone.n_ctx, spec(max_length=4096).encode.max_length) == (16384, 4096)
    assert (spec(n_ctx=100000).encode.max_length, spec(n_ctx=100000, max_length=90000).encode.max_length) == \
        (64000, 90000)


# --- the audio tower ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def thinker(ofx):
    from transformers import AutoConfig, Qwen3OmniMoeForConditionalGeneration

    config = AutoConfig.from_pretrained(ofx.hf_model)
    config.enable_audio_output = False
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(ofx.hf_model, config=config,
                                                                 dtype=torch.float32).thinker.eval()


AUDIO_REQUESTS = {  # sample counts of the clips of one request
    "0.5 s": [8000], "1 s + 1 sample": [16001], "17 s": [272055], "9.3 s": [148800],
    "two clips off the frame grid": [8077, 27233], "four clips": [27233, 8077, 201, 250],
}


@pytest.mark.parametrize("lengths", list(AUDIO_REQUESTS.values()), ids=list(AUDIO_REQUESTS))
def test_the_audio_tower_is_the_references(ofx, thinker, lengths):
    """Our features + tower against the processor's feature extractor + the thinker's audio tower, a request's clips
    batched as the reference batches them (a shorter clip's frames and its last token depend on the longest)."""
    rng = np.random.default_rng(len(lengths))
    clips = [(0.3 * rng.standard_normal(n)).astype(np.float32) for n in lengths]
    feats = fixturegen_omni.feature_extractor()(clips, sampling_rate=16000, padding=True, truncation=False,
                                        return_attention_mask=True, return_tensors="pt")
    with torch.inference_mode():
        out = thinker.get_audio_features(feats["input_features"], feature_attention_mask=feats["attention_mask"])
    ref = (out.last_hidden_state if hasattr(out, "last_hidden_state") else out).numpy()
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

    want = _get_feat_extract_output_lengths(feats["attention_mask"].sum(-1), 50).tolist()
    assert audio_tokens(lengths) == want
    rows = AudioTower.from_gguf(ofx.mmproj_f32).encode(clips)
    assert [len(r) for r in rows] == want
    got = np.concatenate(rows)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5  # measured 3.9e-7


def test_audio_token_counts_are_the_processors(omni_oracle):
    """The <|audio_pad|> runs the reference's processor writes, for clips alone and batched with a longer one."""
    processor = omni_oracle.processor
    pad = processor.tokenizer.convert_tokens_to_ids("<|audio_pad|>")
    for lengths in ([201], [320], [481], [1599], [1600], [1601], [16000], [16159], [33333], [5000, 16001],
                    [16001, 5000, 4321]):
        clips = [np.full(n, 0.1, np.float32) for n in lengths]
        ids = processor(text="<|audio_start|><|audio_pad|><|audio_end|>\n" * len(clips), audio=clips,
                        add_special_tokens=False, return_tensors="np")["input_ids"][0]
        runs = np.split(np.flatnonzero(ids == pad), np.flatnonzero(np.diff(np.flatnonzero(ids == pad)) != 1) + 1)
        assert [len(r) for r in runs] == audio_tokens(lengths), lengths


def test_the_tower_reads_a_projector_without_audio_as_an_error(ofx, tmp_path):
    vision, _ = ensure_vision_projector(ofx.mmproj_f32, tmp_path)
    with pytest.raises(ValueError, match="no Qwen3-Omni audio encoder"):
        AudioTower.from_gguf(vision)


def test_the_media_prompt_puts_audio_at_sequential_positions(omni):
    """Audio rows go between <|audio_start|> and <|audio_end|>, counted like text, zero-padded to n_embd_inp."""
    from clef_bridge.bridge.llama.vision import EncodedAudio, EncodedImage

    projector, tok = omni.projector, omni.backbone.tokenize
    vs, ve, as_, ae = (tok(t, True) for t in ("<|vision_start|>", "<|vision_end|>", "<|audio_start|>",
                                                "<|audio_end|>"))
    image = EncodedImage(np.ones((6, 192), np.float32), 2, 3)
    clip = EncodedAudio(np.ones((5, 64), np.float32))
    pieces = [np.array([1] + vs, np.int32), image, np.array(ve + [7] + as_, np.int32), clip, np.array(ae, np.int32)]
    chunks = projector.chunks(pieces)
    assert [c.pos.tolist() for c in chunks if c.tokens is not None] == [[0, 1], [5, 6, 7], [13]]  # 2 + max(2, 3)
    audio = chunks[3]
    assert audio.pos.tolist() == [list(range(8, 13))] * 3 + [[0] * 5]
    assert audio.embd.shape == (5, 192) and not audio.embd[:, 64:].any() and audio.embd[:, :64].all()
    with pytest.raises(ValueError, match="audio piece 3 must follow"):
        projector.chunks(pieces[:2] + [np.array(ve + [7], np.int32)] + pieces[3:])
    pad = tok("<|audio_pad|>", True)[0]
    with pytest.raises(RequestInvalid, match="no audio clip's"):
        projector.pieces(np.array([1, pad, 2], np.int32), [], [])
